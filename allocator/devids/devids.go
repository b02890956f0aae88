// Package devids says how a decoded device's ids are answered: spelt as
// consumers match them (NormalizeID, run where a pod's devices are answered,
// before the trust gate), MIG instances under a configurable resource
// (MIGResource) and on their parent GPU's NUMA node (TopologyID), and the
// id shapes the trust gate checks. Decoding itself never changes an id's
// spelling.
package devids

import (
	"regexp"
	"slices"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// Consumers match device ids as exact strings, and each expects one
// spelling: DCGM exporter compares a GPU's id with NVML's "GPU-<uuid>"
// (upper-case prefix, lower-case hex) and ignores "gpu-<uuid>"; sriov-cni,
// rdma-cni and host-device look a VF up under /sys/bus/pci/devices, whose
// names are lower-case hex with a four-digit domain. Allocators write what
// they got from their own sources (Koordinator's Device object, HAMi's
// node registration, an operator's hand), so the proxy answers with the
// consumers' spelling: NormalizeIDs runs where a pod's devices are
// answered, before the trust gate, so that the gate, the shared-GPU slots
// and the device-info files all see the spelling consumers will.

// NormalizeID returns id as consumers match it: a GPU or MIG UUID with an
// upper-case "GPU-"/"MIG-" prefix and lower-case hex, a PCI address
// lower-case with its domain (0000:3b:02.1). Anything else (a CDI name,
// HAMi's vendor ids, an id of no known shape, a GPU id with anything after
// its UUID) is returned unchanged: its spelling belongs to its allocator,
// and the trust gate must see a malformed id as it was written.
func NormalizeID(id string) string {
	if gpuIDShape.MatchString(id) {
		p, rest := strings.ToUpper(id[:4]), id[4:]
		if p == "MIG-" && strings.EqualFold(rest[:4], "GPU-") {
			// MIG-GPU-<uuid>/<gi>/<ci>, the pre-R470 form.
			return p + "GPU-" + strings.ToLower(rest[4:])
		}
		return p + strings.ToLower(rest)
	}
	if pciShape.MatchString(id) || strings.Count(id, ":") == 1 {
		if c, ok := inventory.CanonicalPCIAddress(id); ok {
			return c
		}
	}
	return id
}

// NormalizeIDs returns devs with every id normalised (NormalizeID). devs is
// never modified: records are shared. When nothing changes the result is
// devs itself, so the common case costs no allocation.
func NormalizeIDs(devs []model.Device) []model.Device {
	out := model.MapIDs(devs, func(_ model.Device, id string) string { return NormalizeID(id) })
	if !slices.ContainsFunc(out, func(d model.Device) bool { return NormalizeID(d.Parent) != d.Parent }) {
		return out
	}
	// Rare (a MIG parent written in another spelling): copy once more
	// rather than track whether out is already a copy.
	out = slices.Clone(out)
	for i := range out {
		out[i].Parent = NormalizeID(out[i].Parent)
	}
	return out
}

const uuidPattern = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`

var (
	// gpuIDShape: what DCGM and NVIDIA's CDI specs name a GPU or MIG
	// instance by; case-insensitive, as nvidia-smi and the allocators differ.
	gpuIDShape = regexp.MustCompile(`^(?i)(?:(?:GPU|MIG)-` + uuidPattern + `|MIG-GPU-` + uuidPattern + `/[0-9]{1,3}/[0-9]{1,3})$`)
	// pciShape: a PCI address, domain:bus:device.function (a VMD domain
	// has five digits).
	pciShape = regexp.MustCompile(`^[0-9a-fA-F]{4,5}:[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]$`)
)

// IsGPUID reports whether id has the shape of a GPU or MIG instance id as
// DCGM and NVIDIA's CDI specs name them, in any case.
func IsGPUID(id string) bool { return gpuIDShape.MatchString(id) }

// IsPCIAddress reports whether id has the shape of a PCI address with its
// domain (domain:bus:device.function), in any case.
func IsPCIAddress(id string) bool { return pciShape.MatchString(id) }

// InventoryType is the inventory's type for a decoded device, "" when the
// inventory has none: Koordinator and Volcano gpushare name gpu, rdma and
// fpga; HAMi and Volcano vGPU name the vendor, and an NVIDIA resource is a
// GPU.
func InventoryType(dev model.Device) string {
	switch t := strings.ToLower(dev.Type); {
	case t == inventory.TypeGPU || t == inventory.TypeRDMA || t == inventory.TypeFPGA:
		return t
	case strings.HasPrefix(dev.Resource, "nvidia.com/"):
		return inventory.TypeGPU
	}
	return ""
}

// IsMIG reports whether id names a MIG instance ("MIG-...", any case).
func IsMIG(id string) bool { return parse.IsMIG(id) }
