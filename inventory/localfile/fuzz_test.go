package localfile

import (
	"testing"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
)

func FuzzInventoryFile(f *testing.F) {
	f.Add(documentedExample(f))
	f.Add([]byte(`{"devices":[]}`))
	f.Add([]byte(`{"version":1,"devices":[{"type":"rdma","id":"00000000:D8:00.0","busID":"d8:00.0","vfs":[{"busID":"0000:d8:00.2","numaNode":-1}]}]}`))
	f.Add([]byte(`{"devices":[{"type":"gpu","id":"GPU-1"},{"type":"gpu","id":"gpu-1"}]}`))
	f.Add([]byte(`{"devices":[{"type":"gpu","busID":"10000:e1:00.0","minor":-1,"healthy":false}]} `))
	f.Fuzz(func(t *testing.T, data []byte) {
		devices, err := Parse(data)
		if err != nil {
			return
		}
		inventorytest.CheckDecoded(t, devices)
		// Ids and addresses are unique in an accepted file.
		seen := make(map[string]bool)
		for _, d := range devices {
			keys := []string{inventory.IDKey(d.ID)}
			if inventory.IDKey(d.BusID) != inventory.IDKey(d.ID) {
				keys = append(keys, inventory.IDKey(d.BusID))
			}
			for _, vf := range d.VFs {
				keys = append(keys, inventory.IDKey(vf.BusID))
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
