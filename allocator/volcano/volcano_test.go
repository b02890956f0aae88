package volcano

import (
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

// vv builds the device the Volcano vGPU decoder reports.
func vv(id string, index, count int, isShared bool) model.Device {
	return model.Device{
		Allocator: VGPUName, Type: "NVIDIA", Resource: parse.DefaultGPUResource, IDs: []string{id},
		Shared: isShared, ContainerIndex: ptr(index), ContainerScope: model.ScopeRequesting,
		ContainerCount: count, Replace: true,
	}
}

func TestVolcanoVGPUDecode(t *testing.T) {
	tests := []struct {
		name  string
		opts  VGPUOptions
		value string
		want  []model.Device
	}{
		{
			name:  "one container's vGPU, as Volcano writes it (no trailing ';')",
			value: uuidA + ",NVIDIA,1024,25:",
			want:  []model.Device{vv(uuidA, 0, 1, true)},
		},
		{
			name:  "two requesting containers joined by ';'",
			value: uuidA + ",NVIDIA,1024,25:;" + uuidB + ",NVIDIA,40960,100:" + uuidA + ",NVIDIA,1024,0:",
			want:  []model.Device{vv(uuidA, 0, 2, true), vv(uuidB, 1, 2, false), vv(uuidA, 1, 2, true)},
		},
		{
			name:  "MIG mode ids name their parent GPU",
			value: uuidA + "[mig-1g.10gb-2],NVIDIA,10240,0:",
			want:  []model.Device{vv(uuidA, 0, 1, true)},
		},
		{
			name:  "a HAMi-style trailing ';' is not a container",
			value: uuidA + ",NVIDIA,1024,25:;",
			want:  []model.Device{vv(uuidA, 0, 1, true)},
		},
		{
			name:  "the resource name is configurable",
			opts:  VGPUOptions{Resource: "volcano.sh/vgpu-number"},
			value: uuidA + ",NVIDIA,1024,25:",
			want:  []model.Device{resourced(vv(uuidA, 0, 1, true), "NVIDIA", "volcano.sh/vgpu-number")},
		},
		{name: "an empty value allocates nothing", value: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewVGPU(tt.opts).Decode(map[string]string{VGPUAnnotation: tt.value})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestVolcanoVGPUDecodeDropsOnlyTheMalformedContainer(t *testing.T) {
	got, err := NewVGPU(VGPUOptions{}).Decode(map[string]string{
		VGPUAnnotation: uuidA + ",NVIDIA,-1,25:;" + uuidB + ",NVIDIA,1024,25:",
	})
	if err == nil || !strings.HasPrefix(err.Error(), "decode "+VGPUAnnotation+": container 0 ") ||
		!strings.Contains(err.Error(), "memory -1 is negative") {
		t.Errorf("error = %v; want one naming the annotation, container 0 and the memory", err)
	}
	if want := []model.Device{vv(uuidB, 1, 2, true)}; !reflect.DeepEqual(got, want) {
		t.Errorf("kept %+v; want %+v", got, want)
	}
}

func TestVolcanoVGPUDecodeWithoutAnnotationReturnsNothing(t *testing.T) {
	got, err := NewVGPU(VGPUOptions{}).Decode(map[string]string{"volcano.sh/devices-to-allocate": uuidA + ",NVIDIA,1,1:"})
	if got != nil || err != nil {
		t.Errorf("Decode = %v, %v; want nil, nil", got, err)
	}
}

func TestVolcanoVGPUWants(t *testing.T) {
	v := NewVGPU(VGPUOptions{})
	dev := vv(uuidA, 0, 1, true)
	for _, tt := range []struct {
		requests  map[string]string
		wantWhole int64
		wantShare bool
	}{
		{map[string]string{"volcano.sh/vgpu-number": "2", "volcano.sh/vgpu-memory": "1024"}, 2, false},
		{map[string]string{"volcano.sh/vgpu-memory": "1024"}, 1, false},
		{map[string]string{"volcano.sh/vgpu-cores": "50"}, 0, false},
		{map[string]string{"nvidia.com/gpu": "1"}, 0, false},
		{nil, 0, false},
	} {
		whole, share := v.Wants(dev, tt.requests)
		if whole != tt.wantWhole || share != tt.wantShare {
			t.Errorf("Wants(%v) = %d, %v; want %d, %v", tt.requests, whole, share, tt.wantWhole, tt.wantShare)
		}
	}
}

// gs builds the device the gpushare decoder reports for a GPU index.
func gs(index int64) model.Device {
	return model.Device{Allocator: GPUShareName, Type: "gpu", Resource: parse.DefaultGPUResource, Index: ptr(index)}
}

func TestVolcanoGPUShareDecode(t *testing.T) {
	tests := []struct {
		name  string
		opts  GPUShareOptions
		value string
		want  []model.Device
	}{
		{name: "one shared GPU", value: "1", want: []model.Device{gs(1)}},
		{name: "several GPUs keep their order", value: "3,0,2", want: []model.Device{gs(3), gs(0), gs(2)}},
		{name: "spaces around indices are ignored", value: " 0 , 2 ", want: []model.Device{gs(0), gs(2)}},
		{name: "the largest int32 index", value: "2147483647", want: []model.Device{gs(2147483647)}},
		{
			name:  "the resource name is configurable",
			opts:  GPUShareOptions{Resource: "volcano.sh/gpu-memory"},
			value: "0",
			want:  []model.Device{{Allocator: GPUShareName, Type: "gpu", Resource: "volcano.sh/gpu-memory", Index: ptr(int64(0))}},
		},
		{name: "an empty value allocates nothing", value: ""},
		{name: "a blank value allocates nothing", value: "  "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewGPUShare(tt.opts).Decode(map[string]string{GPUShareAnnotation: tt.value})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestVolcanoGPUShareDecodeRejectsMalformedLists(t *testing.T) {
	tests := []struct{ name, value, wantErr string }{
		{"a trailing comma", "0,", `index 1 is empty in "0,"`},
		{"an empty index between", "0,,2", "index 1 is empty"},
		{"a lone comma", ",", "index 0 is empty"},
		{"a negative index", "0,-1", "index 1: GPU index -1 is negative"},
		{"a non-numeric index", "gpu0", `index 0: GPU index "gpu0" is not a number`},
		{"a UUID instead of an index", uuidA, "is not a number"},
		{"a plus sign", "+1", "is not a number"},
		{"a fractional index", "1.5", "is not a number"},
		{"semicolons", "0;1", "is not a number"},
		{"an index beyond int32", "2147483648", "index 0: GPU index 2147483648 is out of range"},
		{"a huge index", strings.Repeat("9", 30), "is out of range"},
		{"one GPU twice", "1,2,1", "index 2: GPU 1 already listed at index 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewGPUShare(GPUShareOptions{}).Decode(map[string]string{GPUShareAnnotation: tt.value})
			if err == nil {
				t.Fatalf("Decode = %+v, nil; want an error", got)
			}
			if got != nil {
				t.Errorf("Decode kept devices %+v of a malformed list", got)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "decode "+GPUShareAnnotation+": ") || !strings.Contains(msg, tt.wantErr) {
				t.Errorf("error = %q; want it to start with the annotation and contain %q", msg, tt.wantErr)
			}
		})
	}
}

func TestVolcanoRelevantToTheirOwnKeys(t *testing.T) {
	vg, sh := NewVGPU(VGPUOptions{}), NewGPUShare(GPUShareOptions{})
	for key, want := range map[string][2]bool{
		VGPUAnnotation:                   {true, false},
		GPUShareAnnotation:               {false, true},
		"volcano.sh/devices-to-allocate": {false, false},
		"volcano.sh/vgpu-node":           {false, false},
		"volcano.sh/predicate-time":      {false, false},
		hami.NVIDIAAnnotation:            {false, false},
	} {
		if got := [2]bool{vg.Relevant(key), sh.Relevant(key)}; got != want {
			t.Errorf("Relevant(%q) = vgpu %v, gpushare %v; want %v", key, got[0], got[1], want)
		}
	}
}

const (
	uuidA = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"
	uuidB = "GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"
)

func ptr[T any](v T) *T                                      { return &v }
func resourced(d model.Device, typ, res string) model.Device { d.Type, d.Resource = typ, res; return d }
