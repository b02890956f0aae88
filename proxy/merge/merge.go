// Package merge renders the pods' plans (package plans) into the kubelet's
// answer, and does nothing else (no I/O: which plan a pod gets is package
// resolve's): how a view spells a device (view.go) and how it is added to
// the kubelet's decoded pod (Pod) and to GetAllocatableResources
// (Allocatable). List and Get both go through it, which is what keeps
// their answers in agreement.
//
// The merge edits the kubelet's decoded answer in place instead of building
// a new one: fields this build does not know (a newer kubelet's) survive in
// the messages' unknown fields, and everything the kubelet reported
// (cpu_ids, memory, dynamic_resources, its own devices, container order) is
// untouched.
package merge

import (
	"slices"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
)

// Pod adds a plan's devices to a pod of a kubelet answer, shared GPUs
// spelled as the view spells them (view.go): a v1 pod, or a
// v1alpha1 pod decoded as v1 (the v1 messages are a superset of the
// v1alpha1 ones, field for field), with a nil inventory, which adds no
// topology: the kubelet derives its v1alpha1 devices from its v1 ones the
// same way.
func Pod(pod *v1.PodResources, p *plans.Plan, inv *inventory.Snapshot, v View) {
	if p == nil || len(pod.GetContainers()) == 0 {
		return
	}
	for _, c := range pod.Containers {
		if devs := p.Containers[c.GetName()]; len(devs) > 0 {
			addV1(c, rendered(p, v, c.GetName(), devs), inv)
		}
	}
}

// rendered returns a container's devices with their ids as the view
// reports them (view.go). devs is never modified; when nothing changes the
// result is devs itself.
func rendered(p *plans.Plan, v View, container string, devs []model.Device) []model.Device {
	if len(p.Shares) == 0 {
		return devs
	}
	var out []model.Device
	for i, d := range devs {
		var ids []string
		for j, id := range d.IDs {
			r, ok := render(p, v, container, d, id)
			if ids == nil && (!ok || r != id) {
				ids = append(make([]string, 0, len(d.IDs)), d.IDs[:j]...)
			}
			if ids != nil && ok {
				ids = append(ids, r)
			}
		}
		if ids == nil {
			if out != nil {
				out = append(out, d)
			}
			continue
		}
		if out == nil {
			out = append(make([]model.Device, 0, len(devs)), devs[:i]...)
		}
		d.IDs = ids
		out = append(out, d)
	}
	if out == nil {
		return devs
	}
	return out
}

// addV1 appends the entries the kubelet would report for each device id
// (inventory.Snapshot.ContainerDevices: one per NUMA node of the device, or
// one with no topology when inv does not know it). An id the container
// already has under the resource is not added again; a Replace device first drops what the
// kubelet reported for its resource (HAMi's device plugin reports ids that
// name no real device).
func addV1(c *v1.ContainerResources, devs []model.Device, inv *inventory.Snapshot) {
	// Drop what the kubelet reported for replaced resources first, so that
	// no device added below (by any allocator) is dropped with it.
	for _, d := range devs {
		if d.Replace {
			c.Devices = slices.DeleteFunc(c.Devices, func(x *v1.ContainerDevices) bool { return x.GetResourceName() == d.Resource })
		}
	}
	has := idsOf(c.Devices)
	for _, d := range devs {
		for _, id := range d.IDs {
			if id == "" || has.hasOrAdd(d.Resource, id) {
				continue
			}
			// A MIG instance sits on its parent GPU's NUMA node.
			c.Devices = append(c.Devices, inv.ContainerDevicesAt(d.Resource, id, devids.TopologyID(d, id))...)
		}
	}
}

// deviceSet is the (resource, id) pairs a container or a node already has,
// so that adding n devices to m costs n+m, not n*m: a node with thousands
// of VFs or MIG instances would otherwise make every answer quadratic.
type deviceSet map[resourceID]struct{}

type resourceID struct{ resource, id string }

// idsOf returns the set of what devs report.
func idsOf[D interface {
	GetResourceName() string
	GetDeviceIds() []string
}](devs []D) deviceSet {
	set := deviceSet{}
	for _, d := range devs {
		for _, id := range d.GetDeviceIds() {
			set[resourceID{d.GetResourceName(), id}] = struct{}{}
		}
	}
	return set
}

func (s deviceSet) has(resource, id string) bool {
	_, ok := s[resourceID{resource, id}]
	return ok
}

// hasOrAdd reports whether the set has the pair, adding it if not.
func (s deviceSet) hasOrAdd(resource, id string) bool {
	if s.has(resource, id) {
		return true
	}
	s[resourceID{resource, id}] = struct{}{}
	return false
}

// Allocatable adds inventory devices to GetAllocatableResources, skipping
// any (resource, id) the kubelet already reports, so NFD and RTE, which
// subtract List from Allocatable per resource name, count each device once.
// A device on several NUMA nodes comes as one entry per node, so only the
// kubelet's own entries count as duplicates.
//
// For a replaced resource (HAMi's, whose device plugin gives the kubelet ids
// that name no GPU) the kubelet's entries are dropped when the inventory
// has devices of that resource: List reports the real GPUs there, and
// allocatable must name the same ones.
func Allocatable(resp *v1.AllocatableResourcesResponse, extra []*v1.ContainerDevices, replaced map[string]bool) {
	if len(replaced) > 0 {
		known := map[string]bool{}
		for _, d := range extra {
			if replaced[d.GetResourceName()] {
				known[d.GetResourceName()] = true
			}
		}
		if len(known) > 0 {
			resp.Devices = slices.DeleteFunc(resp.Devices, func(d *v1.ContainerDevices) bool { return known[d.GetResourceName()] })
		}
	}
	kubelet := idsOf(resp.Devices)
	for _, d := range extra {
		ids := slices.DeleteFunc(slices.Clone(d.GetDeviceIds()), func(id string) bool { return kubelet.has(d.GetResourceName(), id) })
		if len(ids) == 0 {
			continue
		}
		resp.Devices = append(resp.Devices, &v1.ContainerDevices{ResourceName: d.GetResourceName(), DeviceIds: ids, Topology: d.GetTopology()})
	}
}
