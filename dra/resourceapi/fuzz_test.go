package resourceapi

import (
	"encoding/json"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What the watches keep is whatever the API server sends; a strange object
// must cost nothing but its own devices, and what is kept must be usable.
func FuzzSlices(f *testing.F) {
	f.Add([]byte(`{"spec":{"driver":"gpu.example.com","nodeName":"node-1","pool":{"name":"p","generation":2},"devices":[{"name":"gpu-0","attributes":{"uuid":{"string":"GPU-1"},"numaNode":{"int":1},"resource.kubernetes.io/pciBusID":{"string":"0000:3b:00.0"}}}]}}`))
	f.Add([]byte(`{"spec":{"driver":"d","nodeName":"node-2"}}`))
	f.Add([]byte(`{"spec":{"driver":"d","nodeName":"node-1","pool":{"name":"p"},"devices":[{"name":"x","attributes":{"d/numaNode":{"int":-3},"d/uuid":{"int":4}}}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m map[string]any
		if json.Unmarshal(data, &m) != nil {
			return
		}
		src := &Source{opts: Options{Attributes: DefaultAttributes}, kept: map[string]int{}}
		obj, err := src.trimSlice(&unstructured.Unstructured{Object: m})
		if err != nil {
			t.Fatalf("the transform failed: %v", err)
		}
		kept := obj.(*slice)
		if len(kept.devices) > maxSliceDevices {
			t.Errorf("%d devices kept of one slice", len(kept.devices))
		}
		devices, _ := nodeDevices([]*slice{kept}, "node-1", 16)
		if len(devices) > 16 {
			t.Errorf("%d devices past the bound", len(devices))
		}
		for ref, d := range devices {
			if ref.Driver != kept.driver || ref.Pool != kept.pool || ref.Device == "" {
				t.Errorf("device %v kept of slice %s/%s", ref, kept.driver, kept.pool)
			}
			if d.NUMANode < -1 {
				t.Errorf("device %v on NUMA node %d", ref, d.NUMANode)
			}
		}
	})
}

func FuzzClasses(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"gpu"},"spec":{"extendedResourceName":"example.com/gpu","selectors":[{"cel":{"expression":"device.driver == \"gpu.example.com\""}},{}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c resourcev1.DeviceClass
		if json.Unmarshal(data, &c) != nil {
			return
		}
		resources, _ := classResources([]deviceClass{classOf(trimClass(&c))})
		for driver, r := range resources {
			if driver == "" || r == "" {
				t.Errorf("driver %q allocatable as %q", driver, r)
			}
		}
	})
}

func FuzzClaim(f *testing.F) {
	f.Add([]byte(`{"metadata":{"namespace":"ml","name":"c"},"status":{"allocation":{"devices":{"results":[{"request":"r/s","driver":"d","pool":"p","device":"x"}]}}}}`))
	f.Add([]byte(`{"metadata":{"namespace":"ml","name":"c"},"status":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c resourcev1.ResourceClaim
		if json.Unmarshal(data, &c) != nil {
			return
		}
		alloc, _ := allocationOf(&c)
		for req := range alloc {
			if strings.Contains(req, "/") {
				t.Errorf("request %q kept its subrequest separator", req)
			}
		}
	})
}
