package allocator

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/state"
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
	k := NewKoordinator(KoordinatorOptions{})
	resources := map[string]string{"gpu": DefaultGPUResource, "rdma": DefaultRDMAResource, "fpga": DefaultFPGAResource}
	f.Fuzz(func(t *testing.T, value string) {
		ann := map[string]string{KoordinatorAnnotation: value}
		devices, err := k.Decode(ann)
		again, errAgain := k.Decode(ann)
		if !reflect.DeepEqual(devices, again) || fmt.Sprint(err) != fmt.Sprint(errAgain) {
			t.Fatalf("Decode is not deterministic: %+v %v / %+v %v", devices, err, again, errAgain)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "decode "+KoordinatorAnnotation+": ") {
			t.Errorf("error without context: %v", err)
		}
		seen := map[string]bool{}
		for _, d := range devices {
			if d.Resource == "" || d.Resource != resources[d.Type] || d.Allocator != KoordinatorName {
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

// bytesReader hands out fuzz bytes, then zeros.
type bytesReader []byte

func (r *bytesReader) next() int {
	if len(*r) == 0 {
		return 0
	}
	b := (*r)[0]
	*r = (*r)[1:]
	return int(b)
}

// FuzzAssign builds pod specs and devices from arbitrary bytes and checks the
// policy's invariants: deterministic, every device reported somewhere (unless
// its container is a plain init container), never on an init container,
// never twice on one container, input order kept, and a device on several
// containers only when they all ask a share of it.
func FuzzAssign(f *testing.F) {
	f.Add([]byte{3, 1, 0, 2, 1, 2, 2, 3, 0, 0, 0, 1, 0, 0, 0})
	f.Add([]byte{2, 2, 4, 2, 4, 3, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0})
	f.Add([]byte{4, 0, 1, 1, 0, 2, 5, 2, 6, 5, 0, 1, 0, 3, 1, 1, 1, 2, 7, 2, 0, 0})
	requestSets := []map[string]string{
		nil,
		{"nvidia.com/gpu": "1"},
		{"nvidia.com/gpu": "2"},
		{"koordinator.sh/gpu-core": "100"},
		{"koordinator.sh/gpu-core": "50"},
		{"koordinator.sh/gpu-memory": "4Gi", "koordinator.sh/rdma": "100"},
		{"koordinator.sh/rdma": "100"},
		{"koordinator.sh/gpu-core": "300", "koordinator.sh/rdma": "1"},
	}
	kinds := []state.ContainerKind{state.KindInit, state.KindSidecar, state.KindApp}
	s := NewSet(nil, nil, NewKoordinator(KoordinatorOptions{}))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytesReader(data)
		sp := &state.PodSpec{}
		for i := range 1 + r.next()%5 {
			sp.Containers = append(sp.Containers, state.ContainerSpec{
				Name:     fmt.Sprintf("c%d", i),
				Kind:     kinds[r.next()%len(kinds)],
				Requests: requestSets[r.next()%len(requestSets)],
			})
		}
		var devices []state.Device
		for i := range r.next() % 8 {
			d := state.Device{Allocator: KoordinatorName, Type: "gpu", Resource: DefaultGPUResource, IDs: []string{fmt.Sprintf("d%d", i)}}
			switch r.next() % 3 {
			case 1:
				d.Type, d.Resource = "rdma", DefaultRDMAResource
			case 2:
				d.Allocator = "unknown"
			}
			d.Shared = r.next()%2 == 1
			if ci := r.next() % 8; ci > 0 {
				d.ContainerIndex = ptr(ci - 2) // -1 .. 5: some out of range
			}
			devices = append(devices, d)
		}

		a, ok := s.Assign(sp, devices)
		again, okAgain := s.Assign(sp, devices)
		if ok != okAgain || !reflect.DeepEqual(a, again) {
			t.Fatalf("Assign is not deterministic")
		}
		hasApp := false
		kindOf := map[string]state.ContainerKind{}
		for _, c := range sp.Containers {
			hasApp = hasApp || c.Kind == state.KindApp
			kindOf[c.Name] = c.Kind
		}
		if ok != hasApp {
			t.Fatalf("ok = %v with an app container: %v", ok, hasApp)
		}
		if !ok {
			return
		}
		holders := map[string][]string{} // device id -> containers
		for name, devs := range a {
			if kindOf[name] == state.KindInit {
				t.Errorf("init container %s got devices", name)
			}
			last := -1
			for _, d := range devs {
				var i int
				fmt.Sscanf(d.IDs[0], "d%d", &i)
				if i <= last {
					t.Errorf("container %s: devices out of input order or repeated: %v", name, ids(a))
				}
				last = i
				holders[d.IDs[0]] = append(holders[d.IDs[0]], name)
			}
		}
		for i, d := range devices {
			id := d.IDs[0]
			ci := d.ContainerIndex
			toInit := ci != nil && *ci >= 0 && *ci < len(sp.Containers) && sp.Containers[*ci].Kind == state.KindInit
			if toInit != (len(holders[id]) == 0) {
				t.Errorf("device %d (%+v) held by %v", i, d, holders[id])
			}
			if len(holders[id]) > 1 {
				dec := s.byName[d.Allocator]
				for _, name := range holders[id] {
					for _, c := range sp.Containers {
						if c.Name != name {
							continue
						}
						if _, share := dec.Wants(d, c.Requests); !share {
							t.Errorf("device %s on %v, but %s asks no share", id, holders[id], name)
						}
					}
				}
			}
		}
	})
}
