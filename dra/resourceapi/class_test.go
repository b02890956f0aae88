package resourceapi

import (
	"reflect"
	"testing"
)

func TestClassResourceUnderstandsOnlyDriverSelectors(t *testing.T) {
	for _, tc := range []struct {
		class  deviceClass
		driver string
	}{
		{deviceClass{ExtendedResourceName: "example.com/gpu", Selectors: []string{`device.driver == "gpu.example.com"`}}, "gpu.example.com"},
		{deviceClass{ExtendedResourceName: "example.com/gpu", Selectors: []string{` device.driver=='gpu.example.com' `, `device.driver == "gpu.example.com"`}}, "gpu.example.com"},
		{deviceClass{Selectors: []string{`device.driver == "gpu.example.com"`}}, ""},
		{deviceClass{ExtendedResourceName: "example.com/gpu"}, ""},
		{deviceClass{ExtendedResourceName: "example.com/gpu", Selectors: []string{`device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "a100"`}}, ""},
		{deviceClass{ExtendedResourceName: "example.com/gpu", Selectors: []string{`device.driver == "a"`, `device.driver == "b"`}}, ""},
	} {
		driver, ok := classResource(tc.class)
		if driver != tc.driver || ok != (tc.driver != "") {
			t.Errorf("%+v: driver %q %v, want %q", tc.class, driver, ok, tc.driver)
		}
	}
	got, skipped := classResources([]deviceClass{
		{Name: "gpu", ExtendedResourceName: "example.com/gpu", Selectors: []string{`device.driver == "gpu.example.com"`}},
		{Name: "a100", ExtendedResourceName: "example.com/a100", Selectors: []string{`device.attributes["gpu.example.com"].model == "a100"`}},
		{Name: "nic", ExtendedResourceName: "example.com/nic", Selectors: []string{`device.driver == "nic.example.com"`}},
		{Name: "nic-too", ExtendedResourceName: "example.com/other-nic", Selectors: []string{`device.driver == "nic.example.com"`}},
	})
	if !reflect.DeepEqual(got, map[string]string{"gpu.example.com": "example.com/gpu"}) || !reflect.DeepEqual(skipped, []string{"a100"}) {
		t.Errorf("class resources %v, skipped %v", got, skipped)
	}
}
