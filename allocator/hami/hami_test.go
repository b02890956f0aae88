package hami

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
)

// The reference's example: one vGPU (500 MiB, 5% of the cores) for the only
// container, its entry ended by ';' as HAMi writes every entry.
const hamiExample = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76,NVIDIA,500,5:;"

const (
	uuidA = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"
	uuidB = "GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"
)

// hv builds the device the HAMi decoder reports for an NVIDIA vGPU.
func hv(id string, index, count int, isShared bool) model.Device {
	return model.Device{
		Allocator: Name, Type: "NVIDIA", Resource: parse.DefaultGPUResource, IDs: []string{id},
		Shared: isShared, ContainerIndex: ptr(index), ContainerScope: model.ScopeRequestingAll,
		ContainerCount: count, Replace: true,
	}
}

func resourced(d model.Device, typ, res string) model.Device { d.Type, d.Resource = typ, res; return d }

func TestHAMiDecode(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		ann  map[string]string
		want []model.Device
	}{
		{
			name: "the reference example: one shared vGPU for container 0",
			ann:  map[string]string{NVIDIAAnnotation: hamiExample},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "several GPUs for one container keep their order; all cores is not shared",
			ann:  map[string]string{NVIDIAAnnotation: uuidB + ",NVIDIA,81920,100:" + uuidA + ",NVIDIA,81920,100:;"},
			want: []model.Device{hv(uuidB, 0, 1, false), hv(uuidA, 0, 1, false)},
		},
		{
			name: "empty entries (older HAMi's padding) are not counted: the k-th non-empty entry is index k",
			ann:  map[string]string{NVIDIAAnnotation: ";" + uuidA + ",NVIDIA,1000,30:;;" + uuidB + ",NVIDIA,2000,0:;"},
			want: []model.Device{hv(uuidA, 0, 2, true), hv(uuidB, 1, 2, true)},
		},
		{
			name: "an entry of separators only is an empty entry",
			ann:  map[string]string{NVIDIAAnnotation: ":;" + uuidA + ",NVIDIA,3000,50:;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "one GPU shared by two containers is reported in each",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + ",NVIDIA,1000,20:;" + uuidA + ",NVIDIA,1000,20:;"},
			want: []model.Device{hv(uuidA, 0, 2, true), hv(uuidA, 1, 2, true)},
		},
		{
			name: "cores 0 (no core limit) is shared",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + ",NVIDIA,4096,0:;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "a legacy MIG id is reported as its parent GPU, shared even with all cores",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + "[1-0],NVIDIA,10240,100:;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "Volcano's MIG id with a named profile is reported as its parent GPU",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + "[group-1g.10gb-3],NVIDIA,10240,0:;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "two MIG slices of one GPU in a container are that GPU once",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + "[1-0],NVIDIA,10240,0:" + uuidA + "[1-1],NVIDIA,10240,0:;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "whitespace around fields and entries is ignored",
			ann:  map[string]string{NVIDIAAnnotation: "  " + uuidA + " , NVIDIA , 500 , 5 : ;\n"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "fields after the fourth are ignored",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + ",NVIDIA,500,5,future,fields:;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "without a trailing ';' the last entry is still a container",
			ann:  map[string]string{NVIDIAAnnotation: uuidB + ",NVIDIA,500,5:;" + uuidA + ",NVIDIA,500,5:"},
			want: []model.Device{hv(uuidB, 0, 2, true), hv(uuidA, 1, 2, true)},
		},
		{
			name: "a device without its trailing ':' is still a device",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + ",NVIDIA,500,5;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{name: "an empty value allocates nothing", ann: map[string]string{NVIDIAAnnotation: ""}},
		{name: "only separators allocate nothing", ann: map[string]string{NVIDIAAnnotation: ":;;:;"}},
		{name: "whitespace only allocates nothing", ann: map[string]string{NVIDIAAnnotation: " \n"}},
		{
			name: "another vendor's key is reported under its default resource",
			ann:  map[string]string{"hami.io/dcu-devices-allocated": "DCU-0a1b,DCU,16384,60:;"},
			want: []model.Device{resourced(hv("DCU-0a1b", 0, 1, true), "DCU", "hygon.com/dcunum")},
		},
		{
			name: "an Ascend chip's key is reported as huawei.com/<chip>",
			ann:  map[string]string{"hami.io/Ascend910B2-devices-allocated": "NPU-7,Ascend910B2,16384,100:;"},
			want: []model.Device{resourced(hv("NPU-7", 0, 1, false), "Ascend910B2", "huawei.com/Ascend910B2")},
		},
		{
			name: "keys are read in sorted order",
			ann: map[string]string{
				NVIDIAAnnotation: uuidA + ",NVIDIA,500,5:;",
				"hami.io/cambricon-mlu-devices-allocated": "MLU-1,MLU,1024,10:;",
			},
			want: []model.Device{resourced(hv("MLU-1", 0, 1, true), "MLU", "cambricon.com/vmlu"), hv(uuidA, 0, 1, true)},
		},
		{
			name: "resource names are configurable per vendor",
			opts: Options{Resources: map[string]string{"vgpu": "example.com/vgpu", "newchip": "example.com/chip"}},
			ann: map[string]string{
				NVIDIAAnnotation:                    uuidA + ",NVIDIA,500,5:;",
				"hami.io/newchip-devices-allocated": "C-1,NEW,1,100:;",
			},
			want: []model.Device{
				resourced(hv("C-1", 0, 1, false), "NEW", "example.com/chip"),
				resourced(hv(uuidA, 0, 1, true), "NVIDIA", "example.com/vgpu"),
			},
		},
		{
			name: "dynamic MIG: two slices of one GPU written as the parent twice are that GPU once",
			ann:  map[string]string{NVIDIAAnnotation: uuidA + ",NVIDIA,9856,14:" + uuidA + ",NVIDIA,9856,14:;"},
			want: []model.Device{hv(uuidA, 0, 1, true)},
		},
		{
			name: "dynamic MIG: slices whose instance the device plugin recorded are their MIG-<uuid>",
			ann: map[string]string{
				NVIDIAAnnotation: uuidA + ",NVIDIA,9856,14:" + uuidA + ",NVIDIA,9856,14:;",
				MIGAnnotation: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","profile":"1g.10gb","placement":{"start":6,"size":1},"migUUID":"MIG-aaaa","gpuInstanceID":6,"computeInstanceID":0},` +
					`{"containerIndex":0,"deviceIndex":1,"gpuUUID":"` + uuidA + `","profile":"1g.10gb","placement":{"start":5,"size":1},"migUUID":"MIG-bbbb"}]`,
			},
			want: []model.Device{withParent(hv("MIG-aaaa", 0, 1, false), uuidA), withParent(hv("MIG-bbbb", 0, 1, false), uuidA)},
		},
		{
			name: "dynamic MIG: a slice not yet realized stays its parent GPU; an entry for another GPU is not used",
			ann: map[string]string{
				NVIDIAAnnotation: uuidA + ",NVIDIA,9856,14:" + uuidA + ",NVIDIA,9856,14:;",
				MIGAnnotation: `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","migUUID":"MIG-aaaa"},` +
					`{"containerIndex":0,"deviceIndex":1,"gpuUUID":"` + uuidB + `","migUUID":"MIG-bbbb"}]`,
			},
			want: []model.Device{withParent(hv("MIG-aaaa", 0, 1, false), uuidA), hv(uuidA, 0, 1, true)},
		},
		{
			name: "the in-flight to-allocate key is not read",
			ann:  map[string]string{"hami.io/vgpu-devices-to-allocate": hamiExample},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(tt.opts).Decode(tt.ann)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestHAMiDecodeWithoutAnnotationReturnsNothing(t *testing.T) {
	got, err := New(Options{}).Decode(map[string]string{koordinator.Annotation: `{}`, "hami.io/vgpu-node": "node-1"})
	if got != nil || err != nil {
		t.Errorf("Decode = %v, %v; want nil, nil", got, err)
	}
}

// A malformed container entry loses its own devices; the others keep theirs
// at their positions, and the error names the annotation, the container and
// the device.
func TestHAMiDecodeDropsOnlyTheMalformedContainer(t *testing.T) {
	good := ";" + uuidB + ",NVIDIA,2000,20:;" // container 1
	tests := []struct {
		name, bad string // bad is container 0's entry
		wantErr   string
	}{
		{"missing UUID", ",NVIDIA,500,5:", `container 0 ",NVIDIA,500,5:": device 0 ",NVIDIA,500,5": no UUID`},
		{"blank UUID", "  ,NVIDIA,500,5:", "no UUID"},
		{"missing type", uuidA + ",,500,5:", "no device type"},
		{"too few fields", uuidA + ",NVIDIA,500:", "want UUID,Type,memory,cores"},
		{"a bare UUID", uuidA + ":", "want UUID,Type,memory,cores"},
		{"text without fields", "garbage", `device 0 "garbage": want UUID,Type,memory,cores`},
		{"non-numeric memory", uuidA + ",NVIDIA,lots,5:", `memory "lots" is not a number`},
		{"non-numeric cores", uuidA + ",NVIDIA,500,5%:", `cores "5%" is not a number`},
		{"fractional memory", uuidA + ",NVIDIA,0.5,5:", `memory "0.5" is not a number`},
		{"empty memory", uuidA + ",NVIDIA,,5:", `memory "" is not a number`},
		{"negative memory", uuidA + ",NVIDIA,-500,5:", "memory -500 is negative"},
		{"negative cores", uuidA + ",NVIDIA,500,-1:", "cores -1 is negative"},
		{"a plus sign", uuidA + ",NVIDIA,+500,5:", `memory "+500" is not a number`},
		{"memory beyond int32", uuidA + ",NVIDIA,2147483648,5:", "memory 2147483648 is out of range"},
		{"huge cores", uuidA + ",NVIDIA,5," + strings.Repeat("9", 40) + ":", "is out of range"},
		{"MIG id without slot", uuidA + "[1],NVIDIA,5,5:", "want GPU-<uuid> or a MIG id"},
		{"MIG id with a non-numeric slot", uuidA + "[1-x],NVIDIA,5,5:", "want GPU-<uuid> or a MIG id"},
		{"MIG id with text after the bracket", uuidA + "[1-0]x,NVIDIA,5,5:", "want GPU-<uuid> or a MIG id"},
		{"MIG id without parent", "[1-0],NVIDIA,5,5:", "want GPU-<uuid> or a MIG id"},
		{"nested brackets", uuidA + "[[1-0]],NVIDIA,5,5:", "want GPU-<uuid> or a MIG id"},
		{"a stray bracket", uuidA + "],NVIDIA,5,5:", "want GPU-<uuid> or a MIG id"},
		{"a MIG id whose parent holds a bracket (found by fuzzing)", "][0-0],NVIDIA,5,5:", "want GPU-<uuid> or a MIG id"},
		{"a UUID with a space", "GPU-903e cef4,NVIDIA,5,5:", "contains spaces or control characters"},
		{"a UUID with a control character", "GPU-903e\x00cef4,NVIDIA,5,5:", "contains spaces or control characters"},
		{"a good device before a bad one", uuidA + ",NVIDIA,500,5:" + uuidA + "x,NVIDIA,abc,5:", "device 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(Options{}).Decode(map[string]string{NVIDIAAnnotation: tt.bad + good})
			if err == nil {
				t.Fatalf("Decode = %+v, nil; want an error", got)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "decode "+NVIDIAAnnotation+": container 0 ") || !strings.Contains(msg, tt.wantErr) {
				t.Errorf("error = %q; want it to name the annotation and container 0 and contain %q", msg, tt.wantErr)
			}
			if want := []model.Device{hv(uuidB, 1, 2, true)}; !reflect.DeepEqual(got, want) {
				t.Errorf("kept %+v; want container 1's device only, %+v", got, want)
			}
		})
	}
}

func TestHAMiDecodeReportsEveryMalformedContainer(t *testing.T) {
	value := "a,NVIDIA,x,1:;" + uuidA + ",NVIDIA,1,1:;b,NVIDIA,1,-1:;"
	got, err := New(Options{}).Decode(map[string]string{NVIDIAAnnotation: value})
	if err == nil || !strings.Contains(err.Error(), "container 0 ") || !strings.Contains(err.Error(), "container 2 ") {
		t.Errorf("error = %v; want both containers named", err)
	}
	if want := []model.Device{hv(uuidA, 1, 3, true)}; !reflect.DeepEqual(got, want) {
		t.Errorf("kept %+v; want %+v", got, want)
	}
}

func TestHAMiDecodeSkipsVendorsWithoutResourceButKeepsTheOthers(t *testing.T) {
	ann := map[string]string{
		"hami.io/newchip-devices-allocated": "X-1,NEW,1,1:;",
		"hami.io/dcu-devices-allocated":     "DCU-1,DCU,1,100:;",
		NVIDIAAnnotation:                    hamiExample,
	}
	got, err := New(Options{Resources: map[string]string{"dcu": ""}}).Decode(ann)
	for _, want := range []string{
		`decode hami.io/newchip-devices-allocated: no resource name for vendor "newchip"`,
		`decode hami.io/dcu-devices-allocated: no resource name for vendor "dcu"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v; want it to contain %q", err, want)
		}
	}
	if want := []model.Device{hv(uuidA, 0, 1, true)}; !reflect.DeepEqual(got, want) {
		t.Errorf("kept %+v; want %+v", got, want)
	}
}

func TestHAMiDecodeHugeValuesStayLinearAndErrorsShort(t *testing.T) {
	const containers = 20000
	var b strings.Builder
	for i := range containers {
		if i%2 == 1 {
			fmt.Fprintf(&b, "GPU-%08d-0000-0000-0000-000000000000,NVIDIA,1024,10:GPU-%08d-1111-0000-0000-000000000000,NVIDIA,1024,10:", i, i)
		}
		b.WriteString(";")
	}
	got, err := New(Options{}).Decode(map[string]string{NVIDIAAnnotation: b.String()})
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if len(got) != containers {
		t.Fatalf("got %d devices; want %d", len(got), containers)
	}
	last := got[len(got)-1]
	// Every other entry is empty: the last device is the last non-empty one's.
	if *last.ContainerIndex != containers/2-1 || last.ContainerCount != containers/2 {
		t.Errorf("last device at %d of %d; want %d of %d", *last.ContainerIndex, last.ContainerCount, containers/2-1, containers/2)
	}

	bad := strings.Repeat("GPU-x,NVIDIA,abc,5:;", containers)
	_, err = New(Options{}).Decode(map[string]string{NVIDIAAnnotation: bad})
	if err == nil || len(err.Error()) > 1000 || !strings.Contains(err.Error(), fmt.Sprintf("%d more malformed containers", containers-3)) {
		t.Errorf("error for %d malformed containers is %d bytes (%.200v...); want three detailed and a count", containers, len(fmt.Sprint(err)), err)
	}

	huge := strings.Repeat("x", 1<<20) + ",NVIDIA,abc,5:;"
	_, err = New(Options{}).Decode(map[string]string{NVIDIAAnnotation: huge})
	if err == nil || len(err.Error()) > 400 {
		t.Errorf("error for a 1 MiB entry is %d bytes; want a short one", len(fmt.Sprint(err)))
	}
}

func TestHAMiRelevantToAllocatedKeysOnly(t *testing.T) {
	h := New(Options{})
	for key, want := range map[string]bool{
		NVIDIAAnnotation:                        true,
		"hami.io/dcu-devices-allocated":         true,
		"hami.io/Ascend910B2-devices-allocated": true,
		"hami.io/unknown-devices-allocated":     true, // decoded to say it is not understood
		"hami.io/vgpu-devices-to-allocate":      false,
		"hami.io/-devices-allocated":            false,
		"hami.io/vgpu-node":                     false,
		"hami.io/bind-phase":                    false,
		"example.com/vgpu-devices-allocated":    false,
		"volcano.sh/vgpu-ids-new":               false,
		koordinator.Annotation:                  false,
	} {
		if got := h.Relevant(key); got != want {
			t.Errorf("Relevant(%q) = %v; want %v", key, got, want)
		}
	}
}

func TestHAMiWantsCountsTheReportedResource(t *testing.T) {
	h := New(Options{})
	dev := hv(uuidA, 0, 1, true)
	for _, tt := range []struct {
		requests  map[string]string
		wantWhole int64
		wantShare bool
	}{
		{map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000"}, 2, false},
		{map[string]string{"nvidia.com/gpu": "500m"}, 0, true},
		{map[string]string{"nvidia.com/gpu": "0"}, 0, false},
		{map[string]string{"nvidia.com/gpu": "many"}, 0, false},
		{map[string]string{"nvidia.com/gpumem": "3000"}, 0, false},
		{nil, 0, false},
	} {
		whole, share := h.Wants(dev, tt.requests)
		if whole != tt.wantWhole || share != tt.wantShare {
			t.Errorf("Wants(%v) = %d, %v; want %d, %v", tt.requests, whole, share, tt.wantWhole, tt.wantShare)
		}
	}
}

// HAMi's awsneuron device counts a container asking only
// aws.amazon.com/neuroncore as asking Neuron devices (GenerateResourceRequests
// -> splitCoreRequest), so the decoder must too; the count resource, when
// present, is what HAMi reads first.
func TestHAMiWantsNeuronCoresAsHAMiSplitsThem(t *testing.T) {
	h := New(Options{})
	dev := model.Device{Allocator: Name, Type: "AWSNeuron", Resource: "aws.amazon.com/neuron", IDs: []string{"ip-10-0-1-23-AWSNeuron-0"}}
	for _, tt := range []struct {
		requests  map[string]string
		wantWhole int64
		wantShare bool
	}{
		{map[string]string{"aws.amazon.com/neuroncore": "1"}, 0, true},  // one core of a device
		{map[string]string{"aws.amazon.com/neuroncore": "2"}, 1, false}, // a device's two cores
		{map[string]string{"aws.amazon.com/neuroncore": "4"}, 2, false},
		{map[string]string{"aws.amazon.com/neuroncore": "3"}, 0, false}, // HAMi refuses: not a multiple of 2
		{map[string]string{"aws.amazon.com/neuroncore": "0"}, 0, false},
		{map[string]string{"aws.amazon.com/neuroncore": "-2"}, 0, false},
		{map[string]string{"aws.amazon.com/neuroncore": "1500m"}, 0, false},
		{map[string]string{"aws.amazon.com/neuroncore": "two"}, 0, false},
		{map[string]string{"aws.amazon.com/neuron": "3", "aws.amazon.com/neuroncore": "2"}, 3, false},
		{map[string]string{"aws.amazon.com/neuron": "1"}, 1, false},
	} {
		whole, share := h.Wants(dev, tt.requests)
		if whole != tt.wantWhole || share != tt.wantShare {
			t.Errorf("Wants(%v) = %d, %v; want %d, %v", tt.requests, whole, share, tt.wantWhole, tt.wantShare)
		}
	}
	// Cores ask for Neuron devices only: another vendor's devices are
	// counted in their own resource.
	if whole, share := h.Wants(hv(uuidA, 0, 1, true), map[string]string{"aws.amazon.com/neuroncore": "2"}); whole != 0 || share {
		t.Errorf("an NVIDIA vGPU wanted by neuroncore: %d, %v", whole, share)
	}
	// With aws-neuron reported under another name, its cores still count.
	renamed := New(Options{Resources: map[string]string{"aws-neuron": "example.com/neuron"}})
	dev.Resource = "example.com/neuron"
	if whole, _ := renamed.Wants(dev, map[string]string{"aws.amazon.com/neuroncore": "2"}); whole != 1 {
		t.Errorf("renamed Neuron resource: neuroncore 2 wants %d devices, want 1", whole)
	}
}

// FuzzHAMiWantsNeuronCores: whatever the core request, Wants never asks for
// more devices than the cores could fill, nor both whole devices and a share.
func FuzzHAMiWantsNeuronCores(f *testing.F) {
	for _, seed := range []string{"1", "2", "3", "4", "0", "-2", "1500m", "1e3", "9223372036854775807", "2Ki", "", "1e-999999999", "1e999999999"} {
		f.Add(seed)
	}
	h := New(Options{})
	dev := model.Device{Allocator: Name, Type: "AWSNeuron", Resource: "aws.amazon.com/neuron"}
	f.Fuzz(func(t *testing.T, cores string) {
		whole, share := h.Wants(dev, map[string]string{"aws.amazon.com/neuroncore": cores})
		if whole < 0 || (whole > 0 && share) {
			t.Fatalf("Wants(neuroncore %q) = %d, %v", cores, whole, share)
		}
		if whole > 0 {
			n, fraction, ok := parse.Quantity(cores)
			if !ok || fraction || whole*neuronCoresPerDevice != n {
				t.Fatalf("Wants(neuroncore %q) = %d devices, which %d cores per device do not make", cores, whole, neuronCoresPerDevice)
			}
		}
	})
}

// AlsoWrittenBy tells the devices of HAMi's Ascend keys, which Volcano writes too,
// from the others by the key they came from: a device of the NVIDIA key
// whose entry claims an Ascend type is not one.
func TestHAMiAscendIsDecidedByTheKey(t *testing.T) {
	h := New(Options{})
	const npu = "68496E64-20E05477-92C31323-6E78030A-BD003019"
	devs, err := h.Decode(map[string]string{
		"hami.io/Ascend310P-devices-allocated":  npu + ",Ascend310P,4096,90:;",
		"hami.io/Ascend910B2-devices-allocated": "Ascend910B2-1,Ascend910B2,65536,0:;",
		NVIDIAAnnotation:                        uuidA + ",Ascend310P,500,5:;" + uuidB + ",NVIDIA,500,5:;",
		"hami.io/dcu-devices-allocated":         "DCU-0,Ascend310P,500,5:;",
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, d := range devs {
		got[d.IDs[0]] = slices.Equal(h.AlsoWrittenBy(d), []string{VolcanoVGPUName})
	}
	want := map[string]bool{npu: true, "Ascend910B2-1": true, uuidA: false, uuidB: false, "DCU-0": false}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("written by Volcano too, by device id = %v; want %v", got, want)
	}
}

// A MIG annotation that cannot be trusted is reported and ignored: every
// slice stays its parent GPU, shown once, and the container keeps it.
func TestHAMiMalformedMIGAnnotationKeepsTheParentGPU(t *testing.T) {
	value := uuidA + ",NVIDIA,9856,14:" + uuidA + ",NVIDIA,9856,14:;"
	for _, tt := range []struct{ name, mig, wantErr string }{
		{"not JSON", `[{`, "want a JSON list of MIG allocations"},
		{"no containerIndex", `[{"deviceIndex":0,"gpuUUID":"` + uuidA + `","migUUID":"MIG-a"}]`, "entry 0: no valid containerIndex"},
		{"negative deviceIndex", `[{"containerIndex":0,"deviceIndex":-1,"gpuUUID":"` + uuidA + `","migUUID":"MIG-a"}]`, "entry 0: no valid deviceIndex"},
		{"not a MIG UUID", `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","migUUID":"GPU-x"}]`, `migUUID "GPU-x" is not MIG-<uuid>`},
		{"one instance for two slices", `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","migUUID":"MIG-a"},` +
			`{"containerIndex":0,"deviceIndex":1,"gpuUUID":"` + uuidA + `","migUUID":"MIG-a"}]`, "MIG-a given to two slices"},
		{"one slot twice", `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","migUUID":"MIG-a"},` +
			`{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","migUUID":"MIG-b"}]`, "container 0 device 0 listed twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(Options{}).Decode(map[string]string{NVIDIAAnnotation: value, MIGAnnotation: tt.mig})
			if err == nil || !strings.HasPrefix(err.Error(), "decode "+MIGAnnotation+": ") || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v; want one naming the MIG annotation and containing %q", err, tt.wantErr)
			}
			if want := []model.Device{hv(uuidA, 0, 1, true)}; !reflect.DeepEqual(got, want) {
				t.Errorf("devices = %+v; want the parent GPU once, %+v", got, want)
			}
		})
	}
}

// FuzzHAMiMIGDecode feeds arbitrary MIG annotations beside a fixed
// allocation: never a panic, and whatever it says, each device is either
// the GPU written in the allocation or a MIG-<uuid>, each shown once per
// container, and a malformed MIG annotation changes nothing but the error.
func FuzzHAMiMIGDecode(f *testing.F) {
	f.Add(`[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"` + uuidA + `","migUUID":"MIG-a"}]`)
	f.Add(`[{"containerIndex":0,"deviceIndex":1,"gpuUUID":"` + uuidA + `","migUUID":"MIG-b"},{"containerIndex":1,"deviceIndex":0,"gpuUUID":"` + uuidB + `"}]`)
	f.Add(`[]`)
	f.Add(`null`)
	allocfixture.AddSeeds(f, func(key string) bool { return key == MIGAnnotation })
	value := uuidA + ",NVIDIA,9856,14:" + uuidA + ",NVIDIA,9856,14:;" + uuidB + ",NVIDIA,9856,14:;"
	h := New(Options{})
	plain, err := h.Decode(map[string]string{NVIDIAAnnotation: value})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, mig string) {
		got, err := h.Decode(map[string]string{NVIDIAAnnotation: value, MIGAnnotation: mig})
		if err != nil {
			if !reflect.DeepEqual(got, plain) {
				t.Errorf("a malformed MIG annotation changed the devices: %+v", got)
			}
			return
		}
		seen := map[string]bool{}
		for _, d := range got {
			id := d.IDs[0]
			if id != uuidA && id != uuidB && !strings.HasPrefix(id, "MIG-") {
				t.Errorf("device %q is neither the allocation's GPU nor a MIG instance", id)
			}
			key := fmt.Sprint(*d.ContainerIndex, id)
			if seen[key] {
				t.Errorf("%q twice in container %d", id, *d.ContainerIndex)
			}
			seen[key] = true
		}
	})
}
func ptr[T any](v T) *T { return &v }

// withParent is d, a MIG instance, with the GPU it is carved from, which
// the decoder records so that the instance is reported on its GPU's NUMA
// node.
func withParent(d model.Device, gpu string) model.Device {
	d.Parent = gpu
	return d
}
