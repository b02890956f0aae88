package registry

import (
	"reflect"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
	"github.com/podres-proxy/podres-proxy/model"
)

func decoderNames(ds []allocator.Format) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name())
	}
	return out
}

func TestNewFormatsBuildsTheNamedOnesReplacingDecodersFirst(t *testing.T) {
	ds, err := NewFormats([]string{"volcano-gpushare", " koordinator", "hami "}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := decoderNames(ds), []string{hami.Name, koordinator.Name, volcano.GPUShareName}; !reflect.DeepEqual(got, want) {
		t.Errorf("decoders = %v; want %v", got, want)
	}
}

func TestNewFormatsOfAllNames(t *testing.T) {
	ds, err := NewFormats(Names(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{hami.Name, volcano.VGPUName, koordinator.Name, volcano.GPUShareName, tensorfusion.Name}
	if got := decoderNames(ds); !reflect.DeepEqual(got, want) {
		t.Errorf("decoders = %v; want %v", got, want)
	}
	allocator.NewSet(quietLog(), nil, ds...) // distinct names: no panic
}

func TestNewFormatsPassesEachItsOptions(t *testing.T) {
	ds, err := NewFormats(Names(), Options{
		Koordinator:     koordinator.Options{GPUResource: "k.example/gpu"},
		HAMi:            hami.Options{Resources: map[string]string{"vgpu": "h.example/gpu"}},
		VolcanoVGPU:     volcano.VGPUOptions{Resource: "v.example/gpu"},
		VolcanoGPUShare: volcano.GPUShareOptions{Resource: "s.example/gpu"},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := allocator.NewSet(quietLog(), nil, ds...)
	devices, errs := s.Decode(testPod, map[string]string{
		koordinator.Annotation:     `{"gpu":[{"minor":0,"id":"GPU-k"}]}`,
		hami.NVIDIAAnnotation:      "GPU-h,NVIDIA,1,1:;",
		volcano.VGPUAnnotation:     "GPU-v,NVIDIA,1,1:",
		volcano.GPUShareAnnotation: "0",
	})
	if errs != nil {
		t.Fatal(errs)
	}
	got := map[string]string{}
	for _, d := range devices {
		got[d.Allocator] = d.Resource
		if d.Allocator == hami.Name && d.ContainerScope != model.ScopeRequestingAll {
			t.Errorf("HAMi device scope = %q; want %q", d.ContainerScope, model.ScopeRequestingAll)
		}
	}
	want := map[string]string{koordinator.Name: "k.example/gpu", hami.Name: "h.example/gpu", volcano.VGPUName: "v.example/gpu", volcano.GPUShareName: "s.example/gpu"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("resources = %v; want %v", got, want)
	}
}

func TestNewFormatsRejectsBadNames(t *testing.T) {
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
		ds, err := NewFormats(tt.names, Options{})
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("NewFormats(%q) = %v, %v; want an error containing %q", tt.names, decoderNames(ds), err, tt.wantErr)
		}
	}
}

func TestNamesIsACopy(t *testing.T) {
	Names()[0] = "changed"
	if Names()[0] != hami.Name {
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
	ds, err := NewFormats([]string{koordinator.Name, hami.Name}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := allocator.NewSet(quietLog(), nil, ds...)
	devices, errs := s.Decode(testPod, map[string]string{
		koordinator.Annotation: `{"gpu":[{"minor":1,"id":"` + uuidB + `"}]}`,
		hami.NVIDIAAnnotation:  hamiExample,
	})
	if errs != nil {
		t.Fatal(errs)
	}
	if len(devices) != 2 || devices[0].Allocator != hami.Name || !devices[0].Replace || devices[1].Allocator != koordinator.Name {
		t.Errorf("devices = %+v; want HAMi's replacing device, then Koordinator's", devices)
	}
}

func quietLog() *logrus.Logger { l, _ := logtest.NewNullLogger(); return l }

var testPod = model.PodRef{UID: "u-1", Namespace: "ml", Name: "train-0"}

const (
	uuidB       = "GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"
	hamiExample = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76,NVIDIA,500,5:;"
)
