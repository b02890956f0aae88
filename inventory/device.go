package inventory

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
)

// Device types, as Koordinator's Device object and allocations name them.
const (
	TypeGPU  = "gpu"
	TypeRDMA = "rdma"
	TypeFPGA = "fpga"
)

// Source names, as they appear in Device.Source and in logs.
const (
	SourceDeviceCR = "device-cr"
	SourceFile     = "file"
	SourceSysfs    = "sysfs"
)

// Vendors the sysfs source recognises; other sources may set any string.
const (
	VendorNVIDIA = "nvidia"
	VendorAMD    = "amd"
)

// Device is one device of the node. Values handed out by a Snapshot share
// their pointers and slices with it and must not be modified.
type Device struct {
	// Type is "gpu", "rdma", "fpga" or whatever another source says.
	Type string `json:"type"`
	// ID is the id pods are given: the GPU UUID ("GPU-..."), the PF's PCI
	// address for RDMA. Empty when no source knows it (a GPU found in sysfs
	// whose UUID NVIDIA's procfs does not show): the device is then known
	// by BusID only and left out of the allocatable list.
	ID string `json:"id,omitempty"`
	// Vendor is "nvidia", "amd"... when known; it selects a per-vendor
	// resource name (see ResourceNames).
	Vendor string `json:"vendor,omitempty"`
	// Minor is the device minor when known: N of /dev/nvidiaN for NVIDIA
	// GPUs, N of the mlx5_N RDMA device for RDMA (Koordinator's numbering).
	Minor *int64 `json:"minor,omitempty"`
	// Index is the vendor's enumeration index (nvidia-smi index) when known;
	// Volcano's gpushare annotation names GPUs by it.
	Index *int64 `json:"index,omitempty"`
	// BusID is the device's PCI address in sysfs form (0000:3b:00.0).
	BusID string `json:"busID,omitempty"`
	// NUMANode is the device's NUMA node; nil when unknown (sysfs says -1 on
	// single-node machines and some VMs).
	NUMANode *int64 `json:"numaNode,omitempty"`
	// NUMASource is the source NUMANode came from, set by the Inventory; it
	// can differ from Source, since a lower source fills in the node a
	// higher one left out, and operators asking why a device sits on a
	// node need to know which source to check.
	NUMASource string `json:"numaSource,omitempty"`
	// Healthy devices are the only ones reported as allocatable, as the
	// kubelet does.
	Healthy bool `json:"healthy"`
	// VFs are an RDMA NIC's SR-IOV virtual functions: the ids pods get.
	VFs []VF `json:"vfs,omitempty"`
	// PhysFn is set only on what Lookup returns for a VF address: the PF's
	// PCI address. The VF is then described as a device of its own.
	PhysFn string `json:"physFn,omitempty"`
	// Source is the source of highest precedence that reported the device.
	Source string `json:"source"`
}

// VF is an SR-IOV virtual function of a device.
type VF struct {
	// BusID is the VF's PCI address, the id sriov-cni and rdma-cni need.
	BusID string `json:"busID"`
	// NUMANode is the VF's NUMA node; nil means the PF's.
	NUMANode *int64 `json:"numaNode,omitempty"`
	// NUMASource is the source NUMANode came from, as Device.NUMASource.
	NUMASource string `json:"numaSource,omitempty"`
}

// CanonicalPCIAddress returns a PCI address in the form sysfs names devices
// (lower case, four-digit domain: 0000:3b:00.0), accepting the forms other
// tools print: NVML's 00000000:3B:00.0, lspci's 3b:00.0. ok is false when s
// is not a PCI address.
func CanonicalPCIAddress(s string) (canonical string, ok bool) {
	s = strings.TrimSpace(s)
	domain := "0"
	rest := s
	if strings.Count(s, ":") == 2 {
		domain, rest, _ = strings.Cut(s, ":")
	}
	bus, devfn, found := strings.Cut(rest, ":")
	if !found {
		return "", false
	}
	dev, fn, found := strings.Cut(devfn, ".")
	if !found || len(domain) < 1 || len(domain) > 8 || len(bus) != 2 || len(dev) != 2 || len(fn) != 1 {
		return "", false
	}
	d, err1 := strconv.ParseUint(domain, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	v, err3 := strconv.ParseUint(dev, 16, 8)
	f, err4 := strconv.ParseUint(fn, 8, 8) // functions are 0-7
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || v > 0x1f {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", d, b, v, f), true
}

// IDKey is the form ids are compared in: PCI addresses in canonical form,
// other ids (UUIDs) lower case, since tools differ in case. Two ids name the
// same device when their keys are equal.
func IDKey(id string) string {
	if c, ok := CanonicalPCIAddress(id); ok {
		return c
	}
	return strings.ToLower(strings.TrimSpace(id))
}

// ComparePCI orders PCI addresses numerically (a five-digit VMD domain
// sorts after 0000) and before anything else, which is ordered by string.
func ComparePCI(a, b string) int {
	ca, oka := CanonicalPCIAddress(a)
	cb, okb := CanonicalPCIAddress(b)
	switch {
	case oka && okb:
		// Only the domain's width varies, and it is never padded past
		// four digits: the longer address has the larger domain.
		return cmp.Or(cmp.Compare(len(ca), len(cb)), strings.Compare(ca, cb))
	case oka:
		return -1
	case okb:
		return 1
	}
	return strings.Compare(a, b)
}

// clone returns a deep copy so that sources and snapshots never share
// mutable state.
func (d Device) clone() Device {
	d.Minor = clonePtr(d.Minor)
	d.Index = clonePtr(d.Index)
	d.NUMANode = clonePtr(d.NUMANode)
	if d.VFs != nil {
		vfs := make([]VF, len(d.VFs))
		for i, vf := range d.VFs {
			vfs[i] = VF{BusID: vf.BusID, NUMANode: clonePtr(vf.NUMANode), NUMASource: vf.NUMASource}
		}
		d.VFs = vfs
	}
	return d
}

// Known returns a copy of n, or nil when n is nil or negative: sysfs,
// Koordinator and the inventory file write -1 for "unknown".
func Known(n *int64) *int64 {
	if n == nil || *n < 0 {
		return nil
	}
	return clonePtr(n)
}

func clonePtr(p *int64) *int64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
