package inventory

import (
	"cmp"
	"slices"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Snapshot is the inventory at one moment. It is immutable: readers on the
// proxy's hot path share it without locks or copies, and several questions
// asked of one Snapshot get consistent answers. A nil *Snapshot is the
// inventory of a daemon run without one: it knows no device.
type Snapshot struct {
	devices []Device
	// byKey maps every id and PCI address (lookupKey form) to a device, and
	// VF addresses to their VF.
	byKey map[string]ref
}

// ref points at a device and, for a VF address, at one of its VFs.
type ref struct {
	dev int
	vf  int // -1 for the device itself
}

// NewSnapshot returns a snapshot of the given devices, which it copies. It is
// how the Inventory publishes what its sources found, and how tests of other
// packages build an inventory without sources. Devices are ordered by type,
// then PCI address, then id; when two devices claim the same id, PCI
// address, minor or index, the first in that order answers lookups.
func NewSnapshot(devices []Device) *Snapshot {
	s := &Snapshot{
		devices: make([]Device, 0, len(devices)),
		byKey:   make(map[string]ref),
	}
	for _, d := range devices {
		s.devices = append(s.devices, d.clone())
	}
	slices.SortStableFunc(s.devices, func(a, b Device) int {
		return cmp.Or(cmp.Compare(a.Type, b.Type), ComparePCI(a.BusID, b.BusID), cmp.Compare(a.ID, b.ID))
	})
	for i := range s.devices {
		d := &s.devices[i]
		slices.SortStableFunc(d.VFs, func(a, b VF) int { return ComparePCI(a.BusID, b.BusID) })
		s.addKey(d.ID, ref{dev: i, vf: -1})
		s.addKey(d.BusID, ref{dev: i, vf: -1})
		for j, vf := range d.VFs {
			s.addKey(vf.BusID, ref{dev: i, vf: j})
		}
	}
	return s
}

func (s *Snapshot) addKey(id string, r ref) {
	if id == "" {
		return
	}
	k := IDKey(id)
	if _, dup := s.byKey[k]; !dup {
		s.byKey[k] = r
	}
}

// Devices returns every device, healthy or not. The slice and its devices
// are shared and must not be modified.
func (s *Snapshot) Devices() []Device {
	if s == nil {
		return nil
	}
	return s.devices
}

// Lookup finds a device by id (GPU UUID) or PCI address, in any of the forms
// CanonicalPCIAddress accepts. A VF's address resolves to the VF, described
// as a device of its own: Type and Healthy of its PF, ID and BusID the VF's
// address, NUMANode the VF's (else the PF's), PhysFn the PF's address.
func (s *Snapshot) Lookup(id string) (Device, bool) {
	if s == nil {
		return Device{}, false
	}
	r, ok := s.byKey[IDKey(id)]
	if !ok {
		return Device{}, false
	}
	d := s.devices[r.dev]
	if r.vf < 0 {
		return d, true
	}
	vf := d.VFs[r.vf]
	numa, numaSource := vf.NUMANode, vf.NUMASource
	if numa == nil {
		numa, numaSource = d.NUMANode, d.NUMASource
	}
	return Device{
		Type:       d.Type,
		ID:         vf.BusID,
		Vendor:     d.Vendor,
		BusID:      vf.BusID,
		NUMANode:   numa,
		NUMASource: numaSource,
		Healthy:    d.Healthy,
		PhysFn:     d.BusID,
		Source:     d.Source,
	}, true
}

// ByMinor finds a device of the given type by its minor: older Koordinator
// allocations name devices by minor only.
func (s *Snapshot) ByMinor(typ string, minor int64) (Device, bool) {
	return s.find(typ, minor, func(d Device) *int64 { return d.Minor })
}

// ByIndex finds a device of the given type by its vendor index: Volcano's
// gpushare annotation names GPUs by nvidia-smi index.
func (s *Snapshot) ByIndex(typ string, index int64) (Device, bool) {
	return s.find(typ, index, func(d Device) *int64 { return d.Index })
}

// find returns the first device of type typ whose number (its minor or
// index) is n. A scan, since few allocations name devices so and a node
// has tens of devices.
func (s *Snapshot) find(typ string, n int64, number func(Device) *int64) (Device, bool) {
	for _, d := range s.Devices() {
		if p := number(d); d.Type == typ && p != nil && *p == n {
			return d, true
		}
	}
	return Device{}, false
}

// HasType reports whether the snapshot knows any device of the type, that
// is whether a source looks for that type on this node at all: an
// allocation naming a device of a type the inventory covers but not listed
// is not this node's. False on a nil snapshot.
func (s *Snapshot) HasType(typ string) bool {
	if s == nil {
		return false
	}
	_, found := slices.BinarySearchFunc(s.devices, typ, func(d Device, t string) int { return cmp.Compare(d.Type, t) })
	return found
}

// Topology returns the NUMA nodes of the device with this id or PCI address
// (a VF's address gives the VF's node), or nil when the device or its node
// is unknown.
func (s *Snapshot) Topology(id string) []int64 {
	d, ok := s.Lookup(id)
	if !ok || d.NUMANode == nil {
		return nil
	}
	return []int64{*d.NUMANode}
}

// ContainerDevices returns the entries the kubelet would report for device
// id under resource: one entry per NUMA node of the device, each naming
// only that node, or a single entry with nil topology when the node is
// unknown (kubelet's containerDevicesFromResourceDeviceInstances). The
// proxy's merge reports every device it adds to List and Get with it.
func (s *Snapshot) ContainerDevices(resource, id string) []*podresourcesv1.ContainerDevices {
	return containerDevices(resource, id, s.Topology(id))
}

// ContainerDevicesAt is ContainerDevices for device id reported on the NUMA
// nodes of the device at, which the inventory lists: a MIG instance, which
// it does not, on its parent GPU's (devids.TopologyID).
func (s *Snapshot) ContainerDevicesAt(resource, id, at string) []*podresourcesv1.ContainerDevices {
	return containerDevices(resource, id, s.Topology(at))
}

func containerDevices(resource, id string, numa []int64) []*podresourcesv1.ContainerDevices {
	if len(numa) == 0 {
		return []*podresourcesv1.ContainerDevices{{ResourceName: resource, DeviceIds: []string{id}}}
	}
	out := make([]*podresourcesv1.ContainerDevices, 0, len(numa))
	for _, n := range numa {
		out = append(out, &podresourcesv1.ContainerDevices{
			ResourceName: resource,
			DeviceIds:    []string{id},
			Topology:     &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: n}}},
		})
	}
	return out
}

// ResourceNames maps device types to the resource names devices are reported
// under. A key "type/vendor" (for example "gpu/amd") overrides "type" for
// that vendor's devices. Types with no name are not reported.
type ResourceNames map[string]string

// DefaultResourceNames returns the names the proxy reports Koordinator's
// devices under: DCGM exporter only looks at nvidia.com/gpu, Multus finds
// RDMA VFs by the NetworkAttachmentDefinition's koordinator.sh/rdma.
func DefaultResourceNames() ResourceNames {
	return ResourceNames{
		TypeGPU:  "nvidia.com/gpu",
		TypeRDMA: "koordinator.sh/rdma",
		TypeFPGA: "koordinator.sh/fpga",
	}
}

// Resource returns the resource name device d is reported under.
func (n ResourceNames) Resource(d Device) (string, bool) {
	if d.Vendor != "" {
		if r, ok := n[d.Type+"/"+d.Vendor]; ok && r != "" {
			return r, true
		}
	}
	r, ok := n[d.Type]
	return r, ok && r != ""
}

// Allocatable returns the healthy devices in the shape of the kubelet's
// GetAllocatableResources: one ContainerDevices per device id and NUMA
// node, topology nil when the node is unknown. An RDMA NIC with VFs is
// listed by its VF addresses, the ids pods are given; without VFs by its
// id. Devices without an id or a resource name are left out, as are ids
// already listed under the same resource. Entries are sorted by resource
// name, then id, so that answers are stable.
func (s *Snapshot) Allocatable(names ResourceNames) []*podresourcesv1.ContainerDevices {
	var out []*podresourcesv1.ContainerDevices
	seen := make(map[[2]string]bool)
	add := func(resource, id string, numa *int64) {
		k := [2]string{resource, IDKey(id)}
		if id == "" || seen[k] {
			return
		}
		seen[k] = true
		var nodes []int64
		if numa != nil {
			nodes = []int64{*numa}
		}
		out = append(out, containerDevices(resource, id, nodes)...)
	}
	for _, d := range s.Devices() {
		resource, ok := names.Resource(d)
		if !d.Healthy || !ok {
			continue
		}
		if len(d.VFs) == 0 {
			add(resource, d.ID, d.NUMANode)
			continue
		}
		for _, vf := range d.VFs {
			add(resource, vf.BusID, cmp.Or(vf.NUMANode, d.NUMANode))
		}
	}
	slices.SortFunc(out, func(a, b *podresourcesv1.ContainerDevices) int {
		return cmp.Or(cmp.Compare(a.ResourceName, b.ResourceName), ComparePCI(a.DeviceIds[0], b.DeviceIds[0]))
	})
	return out
}

// merge combines the sources' answers, given in order of precedence, into
// one device list. A device of a later source is the same device as an
// earlier one when their PCI addresses match, or their types and ids do;
// each field the earlier one lacks is then taken from the later one, and VFs
// are joined by address. Health is decided by the earliest source: only it
// has an opinion (sysfs reports every device healthy).
func merge(lists ...[]Device) []Device {
	var out []Device
	for _, list := range lists {
		for _, d := range list {
			i := slices.IndexFunc(out, func(o Device) bool { return sameDevice(o, d) })
			if i < 0 {
				out = append(out, d.clone())
				continue
			}
			fillIn(&out[i], d)
		}
	}
	return out
}

func sameDevice(a, b Device) bool {
	if a.BusID != "" && b.BusID != "" && IDKey(a.BusID) == IDKey(b.BusID) {
		return true
	}
	return a.ID != "" && a.Type == b.Type && IDKey(a.ID) == IDKey(b.ID)
}

func fillIn(dst *Device, src Device) {
	if dst.ID == "" {
		dst.ID = src.ID
	}
	if dst.Vendor == "" {
		dst.Vendor = src.Vendor
	}
	if dst.Minor == nil {
		dst.Minor = clonePtr(src.Minor)
	}
	if dst.Index == nil {
		dst.Index = clonePtr(src.Index)
	}
	if dst.BusID == "" {
		dst.BusID = src.BusID
	}
	if dst.NUMANode == nil {
		dst.NUMANode, dst.NUMASource = clonePtr(src.NUMANode), src.NUMASource
	}
	for _, vf := range src.VFs {
		j := slices.IndexFunc(dst.VFs, func(o VF) bool { return IDKey(o.BusID) == IDKey(vf.BusID) })
		if j < 0 {
			dst.VFs = append(dst.VFs, VF{BusID: vf.BusID, NUMANode: clonePtr(vf.NUMANode), NUMASource: vf.NUMASource})
			continue
		}
		if dst.VFs[j].NUMANode == nil {
			dst.VFs[j].NUMANode, dst.VFs[j].NUMASource = clonePtr(vf.NUMANode), vf.NUMASource
		}
	}
}
