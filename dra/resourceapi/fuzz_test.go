package resourceapi

import (
	"strings"
	"testing"
)

// The decoders read what the API server sends; a strange answer must cost
// one failed read, never the daemon, and what they keep must be usable.
func FuzzDecodeSlices(f *testing.F) {
	f.Add([]byte(`{"kind":"ResourceSliceList","metadata":{"continue":"x"},"items":[{"spec":{"driver":"gpu.example.com","nodeName":"node-1","pool":{"name":"p","generation":2},"devices":[{"name":"gpu-0","attributes":{"uuid":{"string":"GPU-1"},"numaNode":{"int":1},"resource.kubernetes.io/pciBusID":{"string":"0000:3b:00.0"}}}]}}]}`))
	f.Add([]byte(`{"kind":"ResourceSliceList","items":[{"spec":{"driver":"d","nodeName":"node-2"}}]}`))
	f.Add([]byte(`{"kind":"ResourceSliceList","items":[{"spec":{"driver":"d","nodeName":"node-1","pool":{"name":"p"},"devices":[{"name":"x","attributes":{"d/numaNode":{"int":-3},"d/uuid":{"int":4}}}]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		pools := map[[2]string]*pool{}
		if _, err := decodeSlices(data, "node-1", DefaultAttributes, pools); err != nil {
			return
		}
		for key, p := range pools {
			for ref, d := range p.devices {
				if ref.Driver != key[0] || ref.Pool != key[1] || ref.Device == "" {
					t.Errorf("device %v kept in pool %v", ref, key)
				}
				if d.NUMANode < -1 {
					t.Errorf("device %v on NUMA node %d", ref, d.NUMANode)
				}
			}
		}
	})
}

func FuzzDecodeClasses(f *testing.F) {
	f.Add([]byte(`{"kind":"DeviceClassList","items":[{"metadata":{"name":"gpu"},"spec":{"extendedResourceName":"example.com/gpu","selectors":[{"cel":{"expression":"device.driver == \"gpu.example.com\""}},{}]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var classes []deviceClass
		if _, err := decodeClasses(data, &classes); err != nil {
			return
		}
		resources, _ := classResources(classes)
		for driver, r := range resources {
			if driver == "" || r == "" {
				t.Errorf("driver %q allocatable as %q", driver, r)
			}
		}
	})
}

func FuzzDecodeClaim(f *testing.F) {
	f.Add([]byte(`{"kind":"ResourceClaim","metadata":{"namespace":"ml","name":"c"},"status":{"allocation":{"devices":{"results":[{"request":"r/s","driver":"d","pool":"p","device":"x"}]}}}}`))
	f.Add([]byte(`{"kind":"ResourceClaim","metadata":{"namespace":"ml","name":"c"},"status":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		alloc, err := decodeClaim(data, "ml", "c")
		if err != nil {
			return
		}
		for req := range alloc {
			if strings.Contains(req, "/") {
				t.Errorf("request %q kept its subrequest separator", req)
			}
		}
	})
}
