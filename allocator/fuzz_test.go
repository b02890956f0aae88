package allocator

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

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
	kinds := []model.ContainerKind{model.KindInit, model.KindSidecar, model.KindApp}
	s := NewSet(nil, nil, koordinator.New(koordinator.Options{}))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytesReader(data)
		sp := &model.PodSpec{}
		for i := range 1 + r.next()%5 {
			sp.Containers = append(sp.Containers, model.ContainerSpec{
				Name:     fmt.Sprintf("c%d", i),
				Kind:     kinds[r.next()%len(kinds)],
				Requests: requestSets[r.next()%len(requestSets)],
			})
		}
		var devices []model.Device
		for i := range r.next() % 8 {
			d := model.Device{Allocator: koordinator.Name, Type: "gpu", Resource: parse.DefaultGPUResource, IDs: []string{fmt.Sprintf("d%d", i)}}
			switch r.next() % 3 {
			case 1:
				d.Type, d.Resource = "rdma", koordinator.DefaultRDMAResource
			case 2:
				d.Allocator = "unknown"
			}
			d.Shared = r.next()%2 == 1
			if ci := r.next() % 8; ci > 0 {
				d.ContainerIndex = ptr(ci - 2) // -1 .. 5: some out of range
				d.ContainerScope = model.ScopeRequestingAll
			}
			devices = append(devices, d)
		}

		a, ok := s.Assign(sp, devices)
		again, okAgain := s.Assign(sp, devices)
		if ok != okAgain || !reflect.DeepEqual(a, again) {
			t.Fatalf("Assign is not deterministic")
		}
		hasApp := false
		kindOf := map[string]model.ContainerKind{}
		for _, c := range sp.Containers {
			hasApp = hasApp || c.Kind == model.KindApp
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
			if kindOf[name] == model.KindInit {
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
			var requesting []model.ContainerSpec // the containers ContainerIndex counts
			for _, c := range sp.Containers {
				if s.Requests(d, c.Requests) {
					requesting = append(requesting, c)
				}
			}
			ci := d.ContainerIndex
			toInit := ci != nil && *ci >= 0 && *ci < len(requesting) && requesting[*ci].Kind == model.KindInit
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
