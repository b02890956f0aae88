package koordinator

import (
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
)

func ptr[T any](v T) *T { return &v }

// The reference's realistic annotation: a whole GPU with its UUID and one
// RDMA VF of PF 0000:01:00.0 (GPU & RDMA joint allocation).
const realisticGPUAndVF = `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"23040Mi","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"}],
 "rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:01:00.0","extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"}]}}]}`

func gpu(id string, minor int64) model.Device {
	d := model.Device{Allocator: Name, Type: "gpu", Resource: "nvidia.com/gpu", Minor: ptr(minor)}
	if id != "" {
		d.IDs = []string{id}
	}
	return d
}

func rdma(minor int64, ids ...string) model.Device {
	return model.Device{Allocator: Name, Type: "rdma", Resource: "koordinator.sh/rdma", Minor: ptr(minor), IDs: ids}
}

func shared(d model.Device) model.Device { d.Shared = true; return d }

func TestKoordinatorDecode(t *testing.T) {
	tests := []struct {
		name  string
		opts  Options
		value string
		want  []model.Device
	}{
		{
			name:  "realistic GPU UUID and RDMA VF: the UUID and the VF address, not the PF",
			value: realisticGPUAndVF,
			want:  []model.Device{gpu("GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", 0), rdma(0, "0000:01:00.2")},
		},
		{
			name:  "RDMA PF without VFs reports the PF address",
			value: `{"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}`,
			want:  []model.Device{rdma(0, "0000:09:00.0")},
		},
		{
			name:  "RDMA with an empty VF list reports the PF address",
			value: `{"rdma":[{"minor":1,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":"100"},"extension":{"vfs":[]}}]}`,
			want:  []model.Device{rdma(1, "0000:09:00.0")},
		},
		{
			name:  "RDMA with several VFs reports each VF in order",
			value: `{"rdma":[{"minor":0,"id":"0000:01:00.0","resources":{"koordinator.sh/rdma":"2"},"extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.3"},{"minor":-1,"busID":"0000:01:00.2"}]}}]}`,
			want:  []model.Device{rdma(0, "0000:01:00.3", "0000:01:00.2")},
		},
		{
			name:  "part of a PF without VFs is shared",
			value: `{"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":"50"}}]}`,
			want:  []model.Device{shared(rdma(0, "0000:09:00.0"))},
		},
		{
			name:  "FPGA is reported as koordinator.sh/fpga with its id",
			value: `{"fpga":[{"minor":2,"id":"0000:5e:00.0","resources":{"koordinator.sh/fpga":"100"}}]}`,
			want: []model.Device{{Allocator: Name, Type: "fpga", Resource: "koordinator.sh/fpga",
				IDs: []string{"0000:5e:00.0"}, Minor: ptr(int64(2))}},
		},
		{
			name: "several GPUs keep the annotation's order",
			value: `{"gpu":[{"minor":3,"id":"GPU-3","resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}},
			               {"minor":1,"id":"GPU-1","resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}}]}`,
			want: []model.Device{gpu("GPU-3", 3), gpu("GPU-1", 1)},
		},
		{
			name:  "gpu-core 50 is a shared GPU",
			value: `{"gpu":[{"minor":0,"id":"GPU-a","resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}`,
			want:  []model.Device{shared(gpu("GPU-a", 0))},
		},
		{
			name:  "gpu-memory-ratio below 100 alone is a shared GPU",
			value: `{"gpu":[{"minor":0,"id":"GPU-a","resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"25"}}]}`,
			want:  []model.Device{shared(gpu("GPU-a", 0))},
		},
		{
			name:  "an allocation without id keeps its minor and no ids",
			value: `{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"}}]}`,
			want:  []model.Device{gpu("", 1)},
		},
		{
			name:  "an empty id is no id",
			value: `{"gpu":[{"minor":4,"id":"","resources":{"koordinator.sh/gpu-core":"100"}}]}`,
			want:  []model.Device{gpu("", 4)},
		},
		{
			name:  "an RDMA PF without id or VFs keeps its minor",
			value: `{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"100"}}]}`,
			want:  []model.Device{rdma(0)},
		},
		{
			name:  "a GPU with gpuSharedResourceTemplate keeps its id and is shared",
			value: `{"gpu":[{"minor":0,"id":"NPU-1","extension":{"gpuSharedResourceTemplate":"vir02"}}]}`,
			want:  []model.Device{shared(gpu("NPU-1", 0))},
		},
		{
			name:  "VFs are read for RDMA only: a GPU keeps its UUID",
			value: `{"gpu":[{"minor":0,"id":"GPU-a","extension":{"vfs":[{"busID":"0000:02:00.1"}]}}]}`,
			want:  []model.Device{gpu("GPU-a", 0)},
		},
		{
			name:  "an id without minor is kept without minor",
			value: `{"gpu":[{"id":"0"}]}`,
			want:  []model.Device{{Allocator: Name, Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{"0"}}},
		},
		{
			name:  "null fields count as absent",
			value: `{"gpu":[{"minor":0,"id":"GPU-a","resources":null,"extension":null}],"rdma":[{"minor":0,"id":"0000:09:00.0","extension":{"vfs":null,"gpuSharedResourceTemplate":null}}]}`,
			want:  []model.Device{gpu("GPU-a", 0), rdma(0, "0000:09:00.0")},
		},
		{
			name:  "quantities may be bare numbers",
			value: `{"gpu":[{"minor":0,"id":"GPU-a","resources":{"koordinator.sh/gpu-core":50,"koordinator.sh/gpu-memory-ratio":1e2}}]}`,
			want:  []model.Device{shared(gpu("GPU-a", 0))},
		},
		{
			name:  "resource names are configurable",
			opts:  Options{GPUResource: "huawei.com/Ascend910", RDMAResource: "example.com/rail1", FPGAResource: "xilinx.com/fpga"},
			value: `{"gpu":[{"minor":0,"id":"NPU-a"}],"rdma":[{"minor":0,"id":"0000:09:00.0"}],"fpga":[{"minor":0,"id":"f0"}]}`,
			want: []model.Device{
				{Allocator: Name, Type: "fpga", Resource: "xilinx.com/fpga", IDs: []string{"f0"}, Minor: ptr(int64(0))},
				{Allocator: Name, Type: "gpu", Resource: "huawei.com/Ascend910", IDs: []string{"NPU-a"}, Minor: ptr(int64(0))},
				{Allocator: Name, Type: "rdma", Resource: "example.com/rail1", IDs: []string{"0000:09:00.0"}, Minor: ptr(int64(0))},
			},
		},
		{
			name:  "unknown fields are ignored",
			value: `{"gpu":[{"minor":0,"id":"GPU-a","future":{"x":1},"extension":{"future":true}}]}`,
			want:  []model.Device{gpu("GPU-a", 0)},
		},
		{name: "an empty object allocates nothing", value: `{}`},
		{name: "a type with a null list allocates nothing", value: `{"gpu":null}`},
		{name: "a type with an empty list allocates nothing", value: `{"gpu":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(tt.opts).Decode(map[string]string{Annotation: tt.value})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestKoordinatorDecodeWithoutAnnotationReturnsNothing(t *testing.T) {
	got, err := New(Options{}).Decode(map[string]string{"other": `{"gpu":[{"id":"x"}]}`})
	if got != nil || err != nil {
		t.Errorf("Decode = %v, %v; want nil, nil", got, err)
	}
}

func TestKoordinatorDecodeSkipsUnknownTypeButKeepsTheOthers(t *testing.T) {
	value := `{"xpu":[{"minor":0,"id":"X-1"}],"gpu":[{"minor":0,"id":"GPU-a"}],"npu":"garbage"}`
	got, err := New(Options{}).Decode(map[string]string{Annotation: value})
	if err == nil || !strings.Contains(err.Error(), `unknown device type "npu", "xpu"`) {
		t.Errorf("error = %v; want one naming the unknown types", err)
	}
	if want := []model.Device{gpu("GPU-a", 0)}; !reflect.DeepEqual(got, want) {
		t.Errorf("devices = %+v; want %+v", got, want)
	}
}

func TestKoordinatorDecodeRejectsMalformedAnnotations(t *testing.T) {
	tests := []struct {
		name, value, wantErr string
	}{
		{"invalid JSON", `{"gpu":[{"minor":0,`, "want a JSON object of device types"},
		{"empty value", ``, "want a JSON object of device types"},
		{"top-level array", `[{"minor":0}]`, "want a JSON object of device types"},
		{"top-level null", `null`, "got null"},
		{"a type that is not a list", `{"gpu":{"minor":0,"id":"GPU-a"}}`, `gpu: want a list of allocations`},
		{"a null allocation", `{"gpu":[{"minor":0,"id":"GPU-a"},null]}`, "gpu[1]: null allocation"},
		{"an allocation that is not an object", `{"gpu":["GPU-a"]}`, "gpu[0]: want a JSON object"},
		{"minor of the wrong type", `{"gpu":[{"minor":"0","id":"GPU-a"}]}`, `gpu[0]: minor: want an integer, got "\"0\""`},
		{"fractional minor", `{"gpu":[{"minor":1.5,"id":"GPU-a"}]}`, "minor: want an integer"},
		{"negative minor", `{"gpu":[{"minor":-1,"id":"GPU-a"}]}`, "gpu[0]: minor -1 out of range"},
		{"minor beyond int32", `{"gpu":[{"minor":2147483648,"id":"GPU-a"}]}`, "minor 2147483648 out of range"},
		{"id of the wrong type", `{"gpu":[{"minor":0,"id":7}]}`, "gpu[0]: id: want a string"},
		{"resources not an object", `{"gpu":[{"minor":0,"id":"a","resources":[1]}]}`, "resources: want a JSON object"},
		{"a quantity of the wrong type", `{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-core":true}}]}`, "resources koordinator.sh/gpu-core: want a quantity"},
		{"a null quantity", `{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-core":null}}]}`, "resources koordinator.sh/gpu-core: want a quantity"},
		{"an invalid quantity", `{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-memory":"lots"}}]}`, `resources koordinator.sh/gpu-memory: "lots"`},
		// resource.ParseQuantity of this does not return, and comparing
		// the next with 100 takes time growing with 10^exponent: one
		// tenant's annotation must not stall every answer.
		{"an exponent beyond any count", `{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-core":"1e-999999999"}}]}`, `resources koordinator.sh/gpu-core: "1e-999999999": exponent of more than 2 digits`},
		{"a huge exponent as a bare number", `{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-core":1e999999999}}]}`, `resources koordinator.sh/gpu-core: "1e999999999": exponent of more than 2 digits`},
		{"a negative quantity", `{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-core":"-50"}}]}`, "negative quantity -50"},
		{"a negative bare number", `{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-core":-50}}]}`, "negative quantity -50"},
		{"extension not an object", `{"rdma":[{"minor":0,"id":"p","extension":"vf"}]}`, "rdma[0]: extension: want a JSON object"},
		{"vfs not a list", `{"rdma":[{"minor":0,"id":"p","extension":{"vfs":{"busID":"0000:01:00.2"}}}]}`, "extension: vfs: want a list"},
		{"a null VF", `{"rdma":[{"minor":0,"id":"p","extension":{"vfs":[null]}}]}`, "vfs[0]: null VF"},
		{"an empty VF busID", `{"rdma":[{"minor":0,"id":"p","extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"},{"minor":-1,"busID":""}]}}]}`, "vfs[1]: no busID"},
		{"a VF without busID", `{"rdma":[{"minor":0,"id":"p","extension":{"vfs":[{"minor":-1}]}}]}`, "vfs[0]: no busID"},
		{"a busID of the wrong type", `{"rdma":[{"minor":0,"id":"p","extension":{"vfs":[{"busID":12}]}}]}`, "busID: want a string"},
		{"a VF minor of the wrong type", `{"rdma":[{"minor":0,"id":"p","extension":{"vfs":[{"minor":"x","busID":"b"}]}}]}`, "vfs[0]: minor: want an integer"},
		{"a template of the wrong type", `{"gpu":[{"minor":0,"id":"a","extension":{"gpuSharedResourceTemplate":1}}]}`, "gpuSharedResourceTemplate: want a string"},
		{"an allocation naming no device", `{"gpu":[{"resources":{"koordinator.sh/gpu-core":"100"}}]}`, "gpu[0]: allocation has neither id, VFs nor minor"},
		{"one GPU id twice", `{"gpu":[{"minor":0,"id":"GPU-a"},{"minor":1,"id":"GPU-a"}]}`, `gpu[1]: device id "GPU-a" already allocated by gpu[0]`},
		{"one VF twice", `{"rdma":[{"minor":0,"id":"p0","extension":{"vfs":[{"busID":"0000:01:00.2"}]}},{"minor":1,"id":"p1","extension":{"vfs":[{"busID":"0000:01:00.2"}]}}]}`, `rdma[1]: device id "0000:01:00.2" already allocated by rdma[0]`},
		{"one id under two types", `{"gpu":[{"minor":0,"id":"0000:01:00.0"}],"rdma":[{"minor":0,"id":"0000:01:00.0"}]}`, `rdma[0]: device id "0000:01:00.0" already allocated by gpu[0]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(Options{}).Decode(map[string]string{Annotation: tt.value})
			if err == nil {
				t.Fatalf("Decode = %+v, nil; want an error", got)
			}
			if got != nil {
				t.Errorf("Decode kept devices %+v of a malformed annotation", got)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "decode "+Annotation+": ") || !strings.Contains(msg, tt.wantErr) {
				t.Errorf("error = %q; want it to start with the annotation and contain %q", msg, tt.wantErr)
			}
		})
	}
}

func TestKoordinatorRelevantToTheAllocationAndTheHint(t *testing.T) {
	k := New(Options{})
	for _, key := range []string{Annotation, HintAnnotation} {
		if !k.Relevant(key) {
			t.Errorf("Relevant(%q) = false", key)
		}
	}
	for _, key := range []string{"scheduling.koordinator.sh/device-joint-allocate", "hami.io/vgpu-devices-allocated", ""} {
		if k.Relevant(key) {
			t.Errorf("Relevant(%q) = true", key)
		}
	}
}

func TestKoordinatorWants(t *testing.T) {
	gpuDev := gpu("GPU-a", 0)
	rdmaDev := rdma(0, "0000:01:00.2")
	fpgaDev := model.Device{Allocator: Name, Type: "fpga", Resource: "koordinator.sh/fpga", IDs: []string{"f"}}
	tests := []struct {
		name      string
		opts      Options
		dev       model.Device
		requests  map[string]string
		wantWhole int64
		wantShare bool
	}{
		{"nvidia.com/gpu counts devices", Options{}, gpuDev, map[string]string{"nvidia.com/gpu": "2"}, 2, false},
		{"koordinator.sh/gpu counts 100 per GPU", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu": "200"}, 2, false},
		{"gpu-core 200 is two GPUs", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu-core": "200", "koordinator.sh/gpu-memory-ratio": "200"}, 2, false},
		{"gpu-core 50 is a share", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu-core": "50"}, 0, true},
		{"gpu-core 150 is a share", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu-core": "150"}, 0, true},
		{"gpu-memory-ratio 30 is a share", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu-memory-ratio": "30"}, 0, true},
		{"gpu-memory alone is a share", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu-memory": "4Gi"}, 0, true},
		{"gpu.shared is a share", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu.shared": "1", "koordinator.sh/gpu-memory": "4Gi"}, 0, true},
		{"gpu-core 100 with gpu-memory is one whole GPU", Options{}, gpuDev, map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "23040Mi"}, 1, false},
		{"a fractional nvidia.com/gpu is a share", Options{}, gpuDev, map[string]string{"nvidia.com/gpu": "500m"}, 0, true},
		{"zero asks nothing", Options{}, gpuDev, map[string]string{"nvidia.com/gpu": "0"}, 0, false},
		{"an unreadable quantity asks nothing", Options{}, gpuDev, map[string]string{"nvidia.com/gpu": "two"}, 0, false},
		{"another type's resource asks nothing", Options{}, gpuDev, map[string]string{"koordinator.sh/rdma": "100"}, 0, false},
		{"a vendor GPU name not configured asks nothing", Options{}, gpuDev, map[string]string{"amd.com/gpu": "1"}, 0, false},
		{"the configured GPU resource counts devices", Options{GPUResource: "amd.com/gpu"}, gpuDev, map[string]string{"amd.com/gpu": "3"}, 3, false},
		{"nvidia.com/gpu asks nothing once another GPU resource is configured", Options{GPUResource: "amd.com/gpu"}, gpuDev, map[string]string{"nvidia.com/gpu": "1"}, 0, false},
		{"koordinator.sh/rdma 100 is one RDMA device", Options{}, rdmaDev, map[string]string{"koordinator.sh/rdma": "100"}, 1, false},
		{"koordinator.sh/rdma 1 is a share", Options{}, rdmaDev, map[string]string{"koordinator.sh/rdma": "1"}, 0, true},
		{"a configured vendor RDMA resource counts devices", Options{RDMAResource: "example.com/rail1"}, model.Device{Type: "rdma", Resource: "example.com/rail1"}, map[string]string{"example.com/rail1": "2", "koordinator.sh/rdma": "100"}, 2, false},
		{"koordinator.sh/fpga 100 is one FPGA", Options{}, fpgaDev, map[string]string{"koordinator.sh/fpga": "100"}, 1, false},
		{"a device without type is known by its resource", Options{}, model.Device{Resource: "nvidia.com/gpu"}, map[string]string{"nvidia.com/gpu": "1"}, 1, false},
		{"an unknown device asks nothing", Options{}, model.Device{Type: "xpu", Resource: "x.com/xpu"}, map[string]string{"x.com/xpu": "1"}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			whole, share := New(tt.opts).Wants(tt.dev, tt.requests)
			if whole != tt.wantWhole || share != tt.wantShare {
				t.Errorf("Wants = (%d, %v); want (%d, %v)", whole, share, tt.wantWhole, tt.wantShare)
			}
		})
	}
}

// A hint that cannot be read is reported, and the allocation is still read,
// its requests in percent.
func TestKoordinatorMalformedHintKeepsTheDevices(t *testing.T) {
	devices, err := New(Options{}).Decode(map[string]string{
		Annotation:     `{"rdma":[{"minor":0,"id":"0000:01:00.0","extension":{"vfs":[{"busID":"0000:01:00.2"}]}}]}`,
		HintAnnotation: `{"rdma":{"allocateStrategy":7}}`,
	})
	if err == nil || !strings.HasPrefix(err.Error(), "decode "+HintAnnotation+": ") {
		t.Errorf("error = %v; want one naming the hint", err)
	}
	if len(devices) != 1 || devices[0].CountsRequests {
		t.Errorf("devices = %+v; want the VF, its requests in percent", devices)
	}
}
