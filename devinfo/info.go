package devinfo

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// SpecVersion is the NPWG device-info spec version written.
const SpecVersion = "1.1.0"

// Info is a device-info file's content (NPWG device-info spec 1.1.0,
// type pci; the field names are the spec's).
type Info struct {
	Type    string `json:"type"`
	Version string `json:"version"`
	PCI     PCI    `json:"pci"`
}

// PCI is the pci member of Info.
type PCI struct {
	PCIAddress   string `json:"pci-address"`
	RDMADevice   string `json:"rdma-device,omitempty"`
	PFPCIAddress string `json:"pf-pci-address,omitempty"`
}

// info says what is known of a PCI device: its PF (a VF's physfn link in
// sysfs, else the PF the inventory lists it under) and its RDMA device (the
// entry of its infiniband directory in sysfs). Whatever neither says is
// left out. Without a sysfs root nothing is read from disk: falling back to
// the host's /sys would describe another machine's devices in a test or a
// container that was told there is no sysfs.
func (w *Writer) info(id string) Info {
	addr, _ := inventory.CanonicalPCIAddress(id)
	in := Info{Type: "pci", Version: SpecVersion, PCI: PCI{PCIAddress: addr}}
	if w.sysfs != "" {
		dev := filepath.Join(w.sysfs, "bus", "pci", "devices", addr)
		if target, err := os.Readlink(filepath.Join(dev, "physfn")); err == nil {
			if pf, ok := inventory.CanonicalPCIAddress(filepath.Base(target)); ok {
				in.PCI.PFPCIAddress = pf
			}
		}
		if entries, err := os.ReadDir(filepath.Join(dev, "infiniband")); err == nil && len(entries) > 0 {
			names := make([]string, 0, len(entries))
			for _, e := range entries {
				names = append(names, e.Name())
			}
			slices.Sort(names)
			in.PCI.RDMADevice = names[0]
		}
	}
	if in.PCI.PFPCIAddress == "" && w.inv != nil {
		// The inventory knows no VF's RDMA device (only a PF's minor, whose
		// mlx5_N a VF does not share), so only the PF comes from it.
		if d, ok := w.inv().Lookup(addr); ok && d.PhysFn != "" {
			if pf, ok := inventory.CanonicalPCIAddress(d.PhysFn); ok {
				in.PCI.PFPCIAddress = pf
			}
		}
	}
	return in
}

// Wants reports whether a device gets device-info files: an RDMA NIC or VF
// (a PCI device Multus hands to sriov-cni, rdma-cni or host-device). Only
// the answers that hand such a device out wait for Hold (package
// proxy/plans).
func (w *Writer) Wants(d model.Device) bool { return d.Type == inventory.TypeRDMA }

// content is the device-info file of a device, as this writer writes it.
func (w *Writer) content(id string) ([]byte, error) {
	data, err := json.Marshal(w.info(id))
	if err != nil {
		return nil, fmt.Errorf("encode the device-info of %s: %w", id, err)
	}
	return data, nil
}
