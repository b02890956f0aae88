package devinfo

import (
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// wanted reports whether a device gets device-info files: an RDMA NIC or
// VF (a PCI device Multus hands to sriov-cni, rdma-cni or host-device).
func wanted(d model.Device) bool { return d.Type == inventory.TypeRDMA }

// Wants reports whether Hold writes a file for a device, so that only the
// answers that hand such a device out wait for Hold (package proxy/plans).
func (w *Writer) Wants(d model.Device) bool { return wanted(d) }
