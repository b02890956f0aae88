package tensorfusion

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

const (
	tfGPU0 = "gpu-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11" // TensorFusion's Kubernetes-name spelling
	tfGPU1 = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"
	tfMIG  = "MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55"
)

func tfShare(id, container string) model.Device {
	return model.Device{Allocator: Name, Type: "gpu", Resource: parse.DefaultGPUResource, IDs: []string{id}, Shared: true, Container: container}
}

func tfMIGOf(id, parent string) model.Device {
	return model.Device{Allocator: Name, Type: "gpu", Resource: parse.DefaultGPUResource, IDs: []string{id}, Parent: parent}
}

func TestTensorFusionDecode(t *testing.T) {
	for _, tt := range []struct {
		name    string
		ann     map[string]string
		want    []model.Device
		wantErr string
	}{
		{name: "no annotation", ann: map[string]string{"other": "x"}},
		{
			name: "pod-level gpu-ids: shared by every container that asks",
			ann:  map[string]string{GPUIDsKey: tfGPU0 + ", " + tfGPU1 + ","},
			want: []model.Device{tfShare(tfGPU0, ""), tfShare(tfGPU1, "")},
		},
		{
			name: "container-gpus wins over gpu-ids, containers in name order",
			ann: map[string]string{
				ContainerGPUsKey: `{"worker":["` + tfGPU1 + `"],"main":["` + tfGPU0 + `"]}`,
				GPUIDsKey:        tfGPU0 + "," + tfGPU1,
			},
			want: []model.Device{tfShare(tfGPU0, "main"), tfShare(tfGPU1, "worker")},
		},
		{
			name: "partitions: MIG instances on their parents, the parent GPU not the pod's",
			ann: map[string]string{
				GPUIDsKey:         tfGPU0 + "," + tfGPU1,
				PartitionUUIDsKey: tfMIG + "/7/0:" + strings.ToUpper(tfGPU0),
			},
			want: []model.Device{tfShare(tfGPU1, ""), tfMIGOf(tfMIG, strings.ToUpper(tfGPU0))},
		},
		{
			name: "a pre-R470 MIG id keeps its gi/ci",
			ann:  map[string]string{PartitionUUIDsKey: "MIG-GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76/1/0:" + tfGPU1},
			want: []model.Device{tfMIGOf("MIG-GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76/1/0", tfGPU1)},
		},
		{
			name:    "malformed container-gpus is refused whole, partitions still count",
			ann:     map[string]string{ContainerGPUsKey: `{"main":"` + tfGPU0 + `"}`, PartitionUUIDsKey: tfMIG + ":" + tfGPU1},
			want:    []model.Device{tfMIGOf(tfMIG, tfGPU1)},
			wantErr: "decode " + ContainerGPUsKey + ": want a JSON object",
		},
		{
			name:    "an id twice in a container",
			ann:     map[string]string{ContainerGPUsKey: `{"main":["` + tfGPU0 + `","` + strings.ToUpper(tfGPU0) + `"]}`},
			wantErr: "listed twice",
		},
		{
			name:    "an id with a control character",
			ann:     map[string]string{GPUIDsKey: tfGPU0 + "\x1b[2J"},
			wantErr: "decode " + GPUIDsKey + ":",
		},
		{
			name:    "a container name with a space",
			ann:     map[string]string{ContainerGPUsKey: `{"ma in":["` + tfGPU0 + `"]}`},
			wantErr: "is not a container name",
		},
		{
			name:    "a partition without parent",
			ann:     map[string]string{PartitionUUIDsKey: tfMIG},
			wantErr: "want <MIG instance>:<parent GPU>",
		},
		{
			name:    "a partition that is no MIG instance",
			ann:     map[string]string{PartitionUUIDsKey: tfGPU1 + ":" + tfGPU0},
			wantErr: "is not a MIG-<uuid>",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := New(Options{}).Decode(tt.ann)
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// FuzzTensorFusionDecode feeds arbitrary values to every TensorFusion
// annotation: the decoder must never panic, must be deterministic, and what
// it returns must be safe to hand to consumers: one id per device, none
// empty or with spaces or control characters, none twice in a container,
// MIG instances with a parent, errors naming their annotation.
func FuzzTensorFusionDecode(f *testing.F) {
	for _, seed := range [][3]string{
		{`{"main":["` + tfGPU0 + `"]}`, "", ""},
		{"", tfGPU0 + "," + tfGPU1, tfMIG + "/7/0:" + tfGPU0},
		{`{"a":["x","X"],"b":[]}`, ",,,", "MIG-x:,:GPU-y"},
		{`{"":[""]}`, " , ", "MIG-GPU-a/1/0:GPU-a"},
		{`null`, "\x00", "MIG-a:GPU-b,MIG-a:GPU-c"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	tf := New(Options{})
	f.Fuzz(func(t *testing.T, containerGPUs, gpuIDs, partitions string) {
		ann := map[string]string{GPUIDsKey: gpuIDs, PartitionUUIDsKey: partitions}
		if containerGPUs != "" {
			ann[ContainerGPUsKey] = containerGPUs
		}
		devices, err := tf.Decode(ann)
		again, errAgain := tf.Decode(ann)
		if !reflect.DeepEqual(devices, again) || fmt.Sprint(err) != fmt.Sprint(errAgain) {
			t.Fatalf("Decode is not deterministic: %+v %v / %+v %v", devices, err, again, errAgain)
		}
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "decode tensor-fusion.ai/") {
					t.Errorf("error without context: %q", line)
				}
			}
		}
		seen := map[string]bool{}
		for _, d := range devices {
			if d.Allocator != Name || d.Resource != parse.DefaultGPUResource || len(d.IDs) != 1 || !safeName(d.IDs[0]) {
				t.Errorf("unsafe device: %+v", d)
				continue
			}
			if d.Parent != "" && !parse.IsMIG(d.IDs[0]) || d.Shared == parse.IsMIG(d.IDs[0]) {
				t.Errorf("only a MIG instance has a parent, and it is whole; a GPU is shared: %+v", d)
			}
			key := d.Container + "/" + claimKey(d.IDs[0])
			if seen[key] {
				t.Errorf("id twice for one container: %+v", d)
			}
			seen[key] = true
		}
	})
}

const tfMIG2 = "MIG-81f0a7c3-5d2e-5b8a-9c4d-3e2f1a0b9c8d"

func tfMIGIn(id, parent, container string) model.Device {
	d := tfMIGOf(id, parent)
	d.Container = container
	return d
}

// In partitioned mode the pod's GPUs are the parents of its slices, which
// are known once the device plugin has created them: no whole GPU is ever
// the pod's.
func TestTensorFusionPartitionedPodShowsNoWholeGPU(t *testing.T) {
	tf := New(Options{})
	for _, tt := range []struct {
		name string
		ann  map[string]string
		want []model.Device
	}{
		{"partitioned, slices not known yet", map[string]string{IsolationKey: "partitioned", GPUIDsKey: tfGPU0 + "," + tfGPU1}, nil},
		{"partitioned, slices in the pod's annotations", map[string]string{IsolationKey: "partitioned", GPUIDsKey: tfGPU0, PartitionUUIDsKey: tfMIG + ":" + tfGPU0},
			[]model.Device{tfMIGOf(tfMIG, tfGPU0)}},
		{"soft isolation keeps the shared GPUs", map[string]string{IsolationKey: "soft", GPUIDsKey: tfGPU0}, []model.Device{tfShare(tfGPU0, "")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tf.Decode(tt.ann)
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Decode = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
	if !tf.Relevant(IsolationKey) || tf.RelevantToContainer(GPUIDsKey) || !tf.RelevantToContainer(PartitionUUIDsKey) {
		t.Error("isolation is a pod annotation read; only partition-uuids is a container annotation read")
	}
}

// TensorFusion's device plugin returns partition-uuids in a container's
// AllocateResponse: the instances go to that container and their parent
// GPUs leave the pod's allocation; an instance several containers list
// (TensorFusion allocates per pod) is the pod's.
func TestTensorFusionDecodeContainer(t *testing.T) {
	pod := []model.Device{tfShare(tfGPU0, ""), tfShare(tfGPU1, "")}
	for _, tt := range []struct {
		name       string
		devices    []model.Device
		containers []string // applied in this order, each with its partitions
		partitions []string
		want       []model.Device
		wantErr    string
	}{
		{
			name: "one container's slice replaces its parent", devices: pod,
			containers: []string{"main"}, partitions: []string{tfMIG + "/7/0:GPU-7D6CE1B0-52A1-4D0E-9B1E-0A5F3C2D9E11"},
			want: []model.Device{tfShare(tfGPU1, ""), tfMIGIn(tfMIG, "GPU-7D6CE1B0-52A1-4D0E-9B1E-0A5F3C2D9E11", "main")},
		},
		{
			name: "two containers with the same slices share them", devices: nil,
			containers: []string{"a", "b"}, partitions: []string{tfMIG + ":" + tfGPU0 + "," + tfMIG2 + ":" + tfGPU1, tfMIG + ":" + tfGPU0 + "," + tfMIG2 + ":" + tfGPU1},
			want: []model.Device{tfMIGIn(tfMIG, tfGPU0, ""), tfMIGIn(tfMIG2, tfGPU1, "")},
		},
		{
			name: "two containers with slices of their own keep them", devices: pod,
			containers: []string{"a", "b"}, partitions: []string{tfMIG + ":" + tfGPU0, tfMIG2 + ":" + tfGPU1},
			want: []model.Device{tfMIGIn(tfMIG, tfGPU0, "a"), tfMIGIn(tfMIG2, tfGPU1, "b")},
		},
		{
			name: "a slice the pod's annotation listed already stays the pod's", devices: []model.Device{tfMIGOf(tfMIG, tfGPU0)},
			containers: []string{"main"}, partitions: []string{tfMIG + ":" + tfGPU0},
			want: []model.Device{tfMIGOf(tfMIG, tfGPU0)},
		},
		{
			name: "another allocator's device is left alone", devices: []model.Device{{Allocator: "hami", Resource: "nvidia.com/gpu", IDs: []string{tfGPU0}}},
			containers: []string{"main"}, partitions: []string{tfMIG + ":" + tfGPU0},
			want: []model.Device{{Allocator: "hami", Resource: "nvidia.com/gpu", IDs: []string{tfGPU0}}, tfMIGIn(tfMIG, tfGPU0, "main")},
		},
		{
			name: "malformed: nothing added, nothing removed", devices: pod,
			containers: []string{"main"}, partitions: []string{tfMIG},
			want: pod, wantErr: "decode " + PartitionUUIDsKey + " of container main: partition",
		},
		{
			name: "a slice twice in one container", devices: pod,
			containers: []string{"main"}, partitions: []string{tfMIG + ":" + tfGPU0 + "," + tfMIG + "/1/0:" + tfGPU0},
			want: pod, wantErr: "listed twice",
		},
		{
			name: "a container name with a space", devices: pod,
			containers: []string{"ma in"}, partitions: []string{tfMIG + ":" + tfGPU0},
			want: pod, wantErr: "not a container name",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tf := New(Options{})
			before := fmt.Sprintf("%+v", tt.devices)
			got := tt.devices
			var err error
			for i, name := range tt.containers {
				var e error
				got, e = tf.DecodeContainer(got, name, map[string]string{PartitionUUIDsKey: tt.partitions[i]})
				if e != nil {
					err = e
				}
			}
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeContainer:\n got %+v\nwant %+v", got, tt.want)
			}
			if after := fmt.Sprintf("%+v", tt.devices); after != before {
				t.Errorf("DecodeContainer modified its input: %s, was %s", after, before)
			}
		})
	}
	if got, err := New(Options{}).DecodeContainer(pod, "main", map[string]string{"other": "x"}); err != nil || !reflect.DeepEqual(got, pod) {
		t.Errorf("a container without partitions changes the pod's devices: %+v, %v", got, err)
	}
}

// FuzzTensorFusionDecodeContainer feeds arbitrary partitions, pod-level and
// in two containers: never a panic, the input never modified, no whole GPU
// left whose slice a container holds, each MIG instance once (a
// container's with its parent), errors naming the annotation and the
// container.
func FuzzTensorFusionDecodeContainer(f *testing.F) {
	for _, seed := range [][4]string{
		{tfGPU0 + "," + tfGPU1, "", tfMIG + "/7/0:" + tfGPU0, tfMIG + "/7/0:" + tfGPU0},
		{tfGPU0, tfMIG + ":" + tfGPU0, tfMIG + ":" + tfGPU0, tfMIG2 + ":" + tfGPU1},
		{"", "", "MIG-x:,:GPU-y", "MIG-a:GPU-b,MIG-a:GPU-c"},
		{tfMIG, "", tfMIG + ":" + tfGPU0, "\x00"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	tf := New(Options{})
	f.Fuzz(func(t *testing.T, gpuIDs, podPartitions, first, second string) {
		pod, _ := tf.Decode(map[string]string{GPUIDsKey: gpuIDs, PartitionUUIDsKey: podPartitions})
		before := fmt.Sprintf("%+v", pod)
		devices := pod
		sliced := map[string]bool{}
		for _, c := range []struct{ name, value string }{{"a", first}, {"b", second}} {
			got, err := tf.DecodeContainer(devices, c.name, map[string]string{PartitionUUIDsKey: c.value})
			if err != nil {
				if !strings.HasPrefix(err.Error(), "decode "+PartitionUUIDsKey+" of container "+c.name) {
					t.Errorf("error without context: %v", err)
				}
				if !reflect.DeepEqual(got, devices) {
					t.Errorf("a malformed value changed the devices: %+v -> %+v", devices, got)
				}
				continue
			}
			for _, d := range got {
				if parse.IsMIG(d.IDs[0]) && d.Container == c.name {
					sliced[claimKey(d.Parent)] = true
				}
			}
			devices = got
		}
		if after := fmt.Sprintf("%+v", pod); after != before {
			t.Fatalf("DecodeContainer modified its input: %s, was %s", after, before)
		}
		seen := map[string]bool{}
		for _, d := range devices {
			if len(d.IDs) != 1 || !safeName(d.IDs[0]) {
				t.Fatalf("unsafe device: %+v", d)
			}
			if !parse.IsMIG(d.IDs[0]) && sliced[claimKey(d.IDs[0])] {
				t.Errorf("GPU %s shown whole though a container holds a slice of it", d.IDs[0])
			}
			if parse.IsMIG(d.IDs[0]) {
				if seen[claimKey(d.IDs[0])] || (d.Container != "" && d.Parent == "") {
					t.Errorf("MIG instance twice, or a container's without parent: %+v", d)
				}
				seen[claimKey(d.IDs[0])] = true
			}
		}
	})
}

// A partition's MIG instance must be carved from a GPU the scheduler gave
// the pod: container-gpus' when it is there, else gpu-ids'. A whole GPU, or
// an instance the scheduler named itself, is not confined; a malformed list
// gives no GPU.
func TestTensorFusionCarvedFrom(t *testing.T) {
	tf := New(Options{})
	partition := tfMIGIn(tfMIG, tfGPU1, "main")
	for _, tt := range []struct {
		name     string
		dev      model.Device
		ann      map[string]string
		want     []string
		confined bool
	}{
		{"gpu-ids", partition, map[string]string{GPUIDsKey: tfGPU0 + "," + tfGPU1}, []string{tfGPU0, tfGPU1}, true},
		{"container-gpus wins", partition, map[string]string{GPUIDsKey: tfGPU1, ContainerGPUsKey: `{"a":["` + tfGPU0 + `"]}`}, []string{tfGPU0}, true},
		{"no GPU given", partition, nil, nil, true},
		{"malformed gpu-ids", partition, map[string]string{GPUIDsKey: tfGPU0 + "," + tfGPU0}, nil, true},
		{"a whole GPU", tfShare(tfGPU0, ""), map[string]string{GPUIDsKey: tfGPU0}, nil, false},
		{"an instance named in gpu-ids", tfShare(tfMIG, ""), map[string]string{GPUIDsKey: tfMIG}, nil, false},
		{"another allocator's instance", model.Device{Allocator: "hami", IDs: []string{tfMIG}, Parent: tfGPU1}, nil, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, confined := tf.CarvedFrom(tt.dev, tt.ann)
			if !reflect.DeepEqual(got, tt.want) || confined != tt.confined {
				t.Errorf("CarvedFrom = %v, %v; want %v, %v", got, confined, tt.want, tt.confined)
			}
		})
	}
}
