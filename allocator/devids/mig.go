package devids

import (
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

// MIG instances are reported as "MIG-<uuid>", the id DCGM exporter resolves
// to a GPU instance through NVML, under the GPU's resource (nvidia.com/gpu,
// which DCGM matches) unless the daemon is told otherwise
// (--mig-resource-name): NVIDIA's device plugin with the "mixed" MIG
// strategy names them nvidia.com/mig-<profile>, which DCGM matches by its
// "nvidia.com/mig-" prefix, and a node's other consumers may expect that.
// Their NUMA node is their parent GPU's (Device.Parent), which the merge
// asks the inventory for, since the inventory lists whole GPUs only.

// MIGResource returns devs with every MIG instance's resource set to
// resource. devs is never modified; when nothing changes the result is devs
// itself. A renamed device that replaces what the kubelet reported for its
// old resource (HAMi's) leaves, in its place, a device of the old resource
// without ids that still replaces it: the kubelet's ids there are HAMi's
// device plugin's own, naming no device.
func MIGResource(devs []model.Device, resource string) []model.Device {
	if resource == "" {
		return devs
	}
	var out []model.Device
	for i, d := range devs {
		if !migDevice(d) || d.Resource == resource {
			if out != nil {
				out = append(out, d)
			}
			continue
		}
		if out == nil {
			out = append(make([]model.Device, 0, len(devs)+1), devs[:i]...)
		}
		if d.Replace {
			out = append(out, model.Device{Allocator: d.Allocator, Type: d.Type, Resource: d.Resource, Replace: true,
				ContainerIndex: d.ContainerIndex, ContainerScope: d.ContainerScope, ContainerCount: d.ContainerCount})
		}
		d.Resource = resource
		out = append(out, d)
	}
	if out == nil {
		return devs
	}
	return out
}

// migDevice reports whether every id of a GPU device names a MIG instance.
func migDevice(d model.Device) bool {
	if len(d.IDs) == 0 || InventoryType(d) != "gpu" {
		return false
	}
	for _, id := range d.IDs {
		if !parse.IsMIG(id) {
			return false
		}
	}
	return true
}

// TopologyID returns the id whose NUMA node a device id is reported on: a
// MIG instance's parent GPU when the allocator named it, else the id.
func TopologyID(d model.Device, id string) string {
	if d.Parent != "" && parse.IsMIG(id) {
		return d.Parent
	}
	return strings.TrimSpace(id)
}
