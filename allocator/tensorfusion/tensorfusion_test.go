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
