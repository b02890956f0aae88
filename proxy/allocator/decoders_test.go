package allocator

import (
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/state"
)

func decoderNames(ds []Decoder) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name())
	}
	return out
}

func TestNewDecodersBuildsTheNamedOnesReplacingDecodersFirst(t *testing.T) {
	ds, err := NewDecoders([]string{"volcano-gpushare", " koordinator", "hami "}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := decoderNames(ds), []string{HAMiName, KoordinatorName, VolcanoGPUShareName}; !reflect.DeepEqual(got, want) {
		t.Errorf("decoders = %v; want %v", got, want)
	}
}

func TestNewDecodersOfAllNames(t *testing.T) {
	ds, err := NewDecoders(Names(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{HAMiName, VolcanoVGPUName, KoordinatorName, VolcanoGPUShareName, TensorFusionName}
	if got := decoderNames(ds); !reflect.DeepEqual(got, want) {
		t.Errorf("decoders = %v; want %v", got, want)
	}
	NewSet(quietLog(), nil, ds...) // distinct names: no panic
}

func TestNewDecodersPassesEachItsOptions(t *testing.T) {
	ds, err := NewDecoders(Names(), Options{
		Koordinator:     KoordinatorOptions{GPUResource: "k.example/gpu"},
		HAMi:            HAMiOptions{Resources: map[string]string{"vgpu": "h.example/gpu"}, LegacyIndexing: true},
		VolcanoVGPU:     VolcanoVGPUOptions{Resource: "v.example/gpu"},
		VolcanoGPUShare: VolcanoGPUShareOptions{Resource: "s.example/gpu"},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := NewSet(quietLog(), nil, ds...)
	devices, errs := s.Decode(testPod, map[string]string{
		KoordinatorAnnotation:     `{"gpu":[{"minor":0,"id":"GPU-k"}]}`,
		HAMiNVIDIAAnnotation:      "GPU-h,NVIDIA,1,1:;",
		VolcanoVGPUAnnotation:     "GPU-v,NVIDIA,1,1:",
		VolcanoGPUShareAnnotation: "0",
	})
	if errs != nil {
		t.Fatal(errs)
	}
	got := map[string]string{}
	for _, d := range devices {
		got[d.Allocator] = d.Resource
		if d.Allocator == HAMiName && d.ContainerScope != state.ScopeRequestingAll {
			t.Errorf("HAMi device scope = %q; want %q whatever LegacyIndexing says", d.ContainerScope, state.ScopeRequestingAll)
		}
	}
	want := map[string]string{KoordinatorName: "k.example/gpu", HAMiName: "h.example/gpu", VolcanoVGPUName: "v.example/gpu", VolcanoGPUShareName: "s.example/gpu"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("resources = %v; want %v", got, want)
	}
}

func TestNewDecodersRejectsBadNames(t *testing.T) {
	for _, tt := range []struct {
		names   []string
		wantErr string
	}{
		{[]string{"koordinator", "kueue"}, `unknown allocator "kueue" (known: hami, volcano-vgpu, koordinator, volcano-gpushare, tensorfusion)`},
		{[]string{"hami", "hami"}, `allocator "hami" named twice`},
		{[]string{"hami", ""}, "empty allocator name"},
		{nil, "no allocator named"},
		{[]string{"HAMi"}, `unknown allocator "HAMi"`},
	} {
		ds, err := NewDecoders(tt.names, Options{})
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("NewDecoders(%q) = %v, %v; want an error containing %q", tt.names, decoderNames(ds), err, tt.wantErr)
		}
	}
}

func TestNamesIsACopy(t *testing.T) {
	Names()[0] = "changed"
	if Names()[0] != HAMiName {
		t.Error("Names exposes the package's list")
	}
}

func TestParseResourceMap(t *testing.T) {
	got, err := ParseResourceMap(" vgpu=example.com/vgpu , dcu=hygon.com/dcunum,mlu=")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"vgpu": "example.com/vgpu", "dcu": "hygon.com/dcunum", "mlu": ""}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseResourceMap = %v; want %v", got, want)
	}
	if got, err := ParseResourceMap(""); err != nil || len(got) != 0 {
		t.Errorf("ParseResourceMap(\"\") = %v, %v; want an empty map", got, err)
	}
	for _, bad := range []string{"vgpu", "=nvidia.com/gpu", "vgpu=a,vgpu=b", "vgpu=a,,dcu=b"} {
		if _, err := ParseResourceMap(bad); err == nil {
			t.Errorf("ParseResourceMap(%q): no error", bad)
		}
	}
}

// A pod carrying two allocators' annotations for one GPU: each decoder reads
// its own key, and the replacing one comes first, so that its replacement
// never drops the other allocator's device.
func TestSeveralAllocatorsOnOnePodReplacingDevicesComeFirst(t *testing.T) {
	ds, err := NewDecoders([]string{KoordinatorName, HAMiName}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := NewSet(quietLog(), nil, ds...)
	devices, errs := s.Decode(testPod, map[string]string{
		KoordinatorAnnotation: `{"gpu":[{"minor":1,"id":"` + uuidB + `"}]}`,
		HAMiNVIDIAAnnotation:  hamiExample,
	})
	if errs != nil {
		t.Fatal(errs)
	}
	if len(devices) != 2 || devices[0].Allocator != HAMiName || !devices[0].Replace || devices[1].Allocator != KoordinatorName {
		t.Errorf("devices = %+v; want HAMi's replacing device, then Koordinator's", devices)
	}
}
