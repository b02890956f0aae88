package devicecr

import (
	"testing"

	"github.com/podres-proxy/podres-proxy/test/inventorytest"
)

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
		inventorytest.CheckDecoded(t, devices)
	})
}
