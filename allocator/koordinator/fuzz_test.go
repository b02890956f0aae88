package koordinator

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
)

// FuzzKoordinatorDecode feeds arbitrary annotation values to the decoder: it
// must never panic, must be deterministic, and whatever it returns (with or
// without an error) must be safe to hand to consumers: a known resource name,
// no empty id, no id twice.
func FuzzKoordinatorDecode(f *testing.F) {
	for _, seed := range []string{
		realisticGPUAndVF,
		`{"rdma":[{"minor":0,"id":"0000:09:00.0","resources":{"koordinator.sh/rdma":100}}]}`,
		`{"fpga":[{"minor":2,"id":"0000:5e:00.0","resources":{"koordinator.sh/fpga":"100"}}]}`,
		`{"gpu":[{"minor":0,"id":"GPU-a","resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory":"8Gi","koordinator.sh/gpu-memory-ratio":"50"}}]}`,
		`{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"}}]}`,
		`{"gpu":[{"minor":0,"id":"NPU-1","resources":{"koordinator.sh/gpu-core":"25"},"extension":{"gpuSharedResourceTemplate":"vir02"}}]}`,
		`{"gpu":[{"minor":3,"id":"GPU-3"},{"minor":1,"id":"GPU-1"}],"xpu":[{"id":"X"}]}`,
		`{"rdma":[{"minor":0,"id":"p","extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"},{"minor":-1,"busID":"0000:01:00.3"}]}}]}`,
		`{"gpu":[{"minor":0,"id":"GPU-a"},{"minor":1,"id":"GPU-a"}]}`,
		`{"gpu":[null]}`, `{"gpu":null}`, `null`, `{}`, ``, `{"gpu":[{"minor":-1}]}`,
		`{"gpu":[{"minor":0,"id":"a","resources":{"koordinator.sh/gpu-core":1e400}}]}`,
	} {
		f.Add(seed)
	}
	allocfixture.AddSeeds(f, func(key string) bool { return key == Annotation })
	k := New(Options{})
	resources := map[string]string{"gpu": parse.DefaultGPUResource, "rdma": DefaultRDMAResource, "fpga": DefaultFPGAResource}
	f.Fuzz(func(t *testing.T, value string) {
		ann := map[string]string{Annotation: value}
		devices, err := k.Decode(ann)
		again, errAgain := k.Decode(ann)
		if !reflect.DeepEqual(devices, again) || fmt.Sprint(err) != fmt.Sprint(errAgain) {
			t.Fatalf("Decode is not deterministic: %+v %v / %+v %v", devices, err, again, errAgain)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "decode "+Annotation+": ") {
			t.Errorf("error without context: %v", err)
		}
		seen := map[string]bool{}
		for _, d := range devices {
			if d.Resource == "" || d.Resource != resources[d.Type] || d.Allocator != Name {
				t.Errorf("device with a wrong resource, type or allocator: %+v", d)
			}
			if len(d.IDs) == 0 && d.Minor == nil {
				t.Errorf("device naming nothing: %+v", d)
			}
			if d.Minor != nil && *d.Minor < 0 {
				t.Errorf("negative minor: %+v", d)
			}
			for _, id := range d.IDs {
				if id == "" {
					t.Errorf("empty id: %+v", d)
				}
				if seen[id] {
					t.Errorf("id %q twice in %+v", id, devices)
				}
				seen[id] = true
			}
		}
	})
}
