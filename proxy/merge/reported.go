package merge

import (
	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// What happens to a pod's believed devices between the trust gate and the
// answer: the device-info files Multus copies, and the resource MIG
// instances are reported as. (Shared GPUs' ids are the views', view.go.)

// DeviceInfoWriter writes the NPWG device-info files of the devices a pod
// is answered with (devinfo.Writer); the Resolver tells it each time it
// decides a pod's devices, before the answer leaves, because Multus reads
// the file right after its List, during the same CNI ADD.
type DeviceInfoWriter interface {
	Hold(pod model.PodRef, devices []model.Device)
}

// reported is the last step of a pod's believed devices before
// attribution: the device-info files of its VFs and RDMA devices are
// written.
func (r *Resolver) reported(rec *record.Record, devs []model.Device) []model.Device {
	if r.o.DeviceInfo != nil && len(devs) > 0 {
		r.o.DeviceInfo.Hold(model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}, devs)
	}
	return devs
}

// relabel reports MIG instances under Providers.MIGResource, after attribution:
// the allocators' requests (nvidia.com/gpu) decide the container, the
// name only what consumers see.
func (r *Resolver) relabel(p Plan) Plan {
	if r.o.MIGResource == "" {
		return p
	}
	if p.assign != nil {
		a := make(allocator.Assignment, len(p.assign))
		for name, devs := range p.assign {
			a[name] = allocator.MIGResource(devs, r.o.MIGResource)
		}
		p.assign = a
	}
	return p
}
