package inventory

import (
	"testing"
)

// checkDevices holds for whatever a decoder accepts: every device can be
// found, its PCI addresses are in sysfs form, and a snapshot of them answers
// without panicking.
func checkDevices(t *testing.T, devices []Device) {
	t.Helper()
	for _, d := range devices {
		if d.ID == "" && d.BusID == "" {
			t.Fatalf("accepted a device without id or address: %s", describe(d))
		}
		if d.BusID != "" {
			if c, ok := CanonicalPCIAddress(d.BusID); !ok || c != d.BusID {
				t.Fatalf("busID %q is not in sysfs form", d.BusID)
			}
		}
		for _, vf := range d.VFs {
			if c, ok := CanonicalPCIAddress(vf.BusID); !ok || c != vf.BusID {
				t.Fatalf("VF busID %q is not in sysfs form", vf.BusID)
			}
		}
		for _, p := range []*int64{d.NUMANode, d.Minor, d.Index} {
			if p != nil && *p < 0 {
				t.Fatalf("negative number accepted as known: %s", describe(d))
			}
		}
	}
	snap := NewSnapshot(devices)
	for _, d := range devices {
		for _, id := range []string{d.ID, d.BusID} {
			if _, ok := snap.Lookup(id); id != "" && !ok {
				t.Fatalf("Lookup(%q) of an accepted device failed", id)
			}
		}
		_ = snap.ContainerDevices("r", d.ID)
	}
	for _, cd := range snap.Allocatable(DefaultResourceNames()) {
		if len(cd.DeviceIds) != 1 || cd.DeviceIds[0] == "" {
			t.Fatalf("allocatable entry %v does not name one device", cd)
		}
	}
}

func FuzzInventoryFile(f *testing.F) {
	f.Add(documentedExample(f))
	f.Add([]byte(`{"devices":[]}`))
	f.Add([]byte(`{"version":1,"devices":[{"type":"rdma","id":"00000000:D8:00.0","busID":"d8:00.0","vfs":[{"busID":"0000:d8:00.2","numaNode":-1}]}]}`))
	f.Add([]byte(`{"devices":[{"type":"gpu","id":"GPU-1"},{"type":"gpu","id":"gpu-1"}]}`))
	f.Add([]byte(`{"devices":[{"type":"gpu","busID":"10000:e1:00.0","minor":-1,"healthy":false}]} `))
	f.Fuzz(func(t *testing.T, data []byte) {
		devices, err := ParseFile(data)
		if err != nil {
			return
		}
		checkDevices(t, devices)
		// Ids and addresses are unique in an accepted file.
		seen := make(map[string]bool)
		for _, d := range devices {
			keys := []string{lookupKey(d.ID)}
			if lookupKey(d.BusID) != lookupKey(d.ID) {
				keys = append(keys, lookupKey(d.BusID))
			}
			for _, vf := range d.VFs {
				keys = append(keys, lookupKey(vf.BusID))
			}
			for _, k := range keys {
				if k != "" && seen[k] {
					t.Fatalf("accepted %q twice", k)
				}
				seen[k] = true
			}
		}
	})
}

func FuzzDeviceCR(f *testing.F) {
	f.Add([]byte(deviceObjectJSON))
	f.Add([]byte(`{"kind":"Device","metadata":{"name":"node-1"},"spec":{"devices":[{"type":"rdma","id":"0000:01:00.0","topology":{"nodeID":-1},"vfGroups":[{"vfs":[{"minor":-1,"busID":"0000:01:00.2"}]},{}]}]}}`))
	f.Add([]byte(`{"kind":"Status","code":404}`))
	f.Add([]byte(`{"spec":{"devices":[{"type":"gpu","id":"GPU-1","topology":null},{"id":"","topology":{"busID":"zz"}}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		devices, err := decodeDeviceCR(data, "node-1")
		if err != nil {
			return
		}
		checkDevices(t, devices)
	})
}
