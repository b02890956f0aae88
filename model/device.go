package model

// Device is one allocated device decoded from a scheduler's annotation.
type Device struct {
	// Allocator is the decoder that produced it ("koordinator", "hami"...).
	Allocator string `json:"allocator"`
	// Type is the allocator's own device type ("gpu", "rdma", "fpga").
	Type string `json:"type,omitempty"`
	// Resource is the PodResources resource_name the device is reported as.
	Resource string `json:"resource"`
	// IDs are the device ids reported for this device: a GPU UUID, the VF
	// PCI addresses of an RDMA allocation, or the PF address when there are
	// no VFs. Each becomes one ContainerDevices entry. Empty when the
	// allocator named the device only by Minor and no inventory translated it.
	IDs []string `json:"ids"`
	// Minor is the device minor when the allocator gave one.
	Minor *int64 `json:"minor,omitempty"`
	// Parent is the GPU a MIG instance (IDs ["MIG-<uuid>"]) is carved
	// from, when the allocator says: the inventory knows whole GPUs only,
	// so the instance is reported on its parent's NUMA node.
	Parent string `json:"parent,omitempty"`
	// Shared is true when only a share of the device was allocated (for
	// example koordinator.sh/gpu-core: 50); every container that requests a
	// share of it gets it.
	Shared bool `json:"shared,omitempty"`
	// ContainerIndex is set by allocators that allocate per container (HAMi,
	// Volcano vGPU): the position in the allocator's own container list, or
	// with ScopeRequestingAll the rank among its non-empty entries. Nil
	// means the allocation is pod-level and attribution follows the pod spec.
	ContainerIndex *int `json:"containerIndex,omitempty"`
	// Container is the name of the container the allocator gave the device
	// to, for allocators that name containers (TensorFusion's
	// container-gpus); it takes precedence over ContainerIndex.
	Container string `json:"container,omitempty"`
	// ContainerScope says which containers of the pod spec the allocator's
	// list covers, that is what ContainerIndex counts. A ContainerIndex
	// without a scope this build knows is ignored: the device is
	// attributed as a pod-level one.
	ContainerScope ContainerScope `json:"containerScope,omitempty"`
	// ContainerCount is the length of the allocator's container list (with
	// ScopeRequestingAll, its non-empty entries), 0 when unknown; kept for
	// operators reading the record, not used to attribute the device.
	ContainerCount int `json:"containerCount,omitempty"`
	// Index is the vendor's enumeration index (nvidia-smi index) when the
	// allocator named the device by it (Volcano gpushare); like Minor, it is
	// translated to an id through the node's device inventory.
	Index *int64 `json:"index,omitempty"`
	// Replace means the ids replace what the kubelet itself reported for
	// Resource in that container instead of being appended to it.
	Replace bool `json:"replace,omitempty"`
	// CountsRequests means the allocator counted the pod's requests for this
	// device in devices, not in its usual unit (Koordinator's
	// RequestsAsCount strategy: koordinator.sh/rdma: 1 is one VF, not 1% of
	// a NIC); attribution reads the containers' requests the same way.
	CountsRequests bool `json:"countsRequests,omitempty"`
}

// ContainerScope names the containers of a PodSpec that a per-container
// allocator's list covers, in PodSpec order.
type ContainerScope string

const (
	// ScopeRequesting: the app containers that request the device, as the
	// allocator's decoder judges requests (Volcano vGPU).
	ScopeRequesting ContainerScope = "requesting"
	// ScopeRequestingAll: every container that requests the device, init
	// and sidecar containers first, as the allocator's decoder judges
	// requests; ContainerIndex then counts the allocator's non-empty entries
	// (HAMi, whose device plugin hands its k-th non-empty entry to the k-th
	// container asking for the vendor's resource, whatever the list's
	// padding).
	ScopeRequestingAll ContainerScope = "requesting-all"
)

// Refused is a decoded device that was not reported, and why. Reason is
// one of the trust rules' reasons (a metric label too); Class tells an
// operator whether the annotation looks forged ("forged": it names a device
// the pod has no right to) or broken ("malformed": an id no device can
// have), or the pod could not be checked yet ("unvetted").
type Refused struct {
	Allocator string   `json:"allocator"`
	Resource  string   `json:"resource"`
	IDs       []string `json:"ids"`
	Reason    string   `json:"reason"`
	Class     string   `json:"class"`
	Detail    string   `json:"detail,omitempty"`
}

// MapIDs returns devs with each id of each device replaced by f(device, id).
// devs is never modified (records are shared between readers); when f
// changes nothing the result is devs itself, so the common case allocates
// nothing.
func MapIDs(devs []Device, f func(dev Device, id string) string) []Device {
	var out []Device // nil until an id changes: then a copy of devs
	for i, d := range devs {
		var ids []string // nil until one of d's ids changes: then a copy of d.IDs
		for j, id := range d.IDs {
			n := f(d, id)
			if n == id {
				continue
			}
			if ids == nil {
				ids = append([]string(nil), d.IDs...)
			}
			ids[j] = n
		}
		if ids == nil {
			continue
		}
		if out == nil {
			out = append([]Device(nil), devs...)
		}
		out[i].IDs = ids
	}
	if out == nil {
		return devs
	}
	return out
}
