package allocator

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/internal/allocfixture"
	"github.com/podres-proxy/podres-proxy/model"
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
	addFixtureSeeds(f, func(key string) bool { return key == KoordinatorAnnotation })
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
	kinds := []model.ContainerKind{model.KindInit, model.KindSidecar, model.KindApp}
	s := NewSet(nil, nil, NewKoordinator(KoordinatorOptions{}))
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
			d := model.Device{Allocator: KoordinatorName, Type: "gpu", Resource: DefaultGPUResource, IDs: []string{fmt.Sprintf("d%d", i)}}
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
			ci := d.ContainerIndex
			toInit := ci != nil && *ci >= 0 && *ci < len(sp.Containers) && sp.Containers[*ci].Kind == model.KindInit
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

// hamiSeeds are real-shaped HAMi-format values, well-formed and not.
var hamiSeeds = []string{
	hamiExample,
	";" + uuidA + ",NVIDIA,1000,30:;;" + uuidB + ",NVIDIA,2000,0:;",
	uuidB + ",NVIDIA,81920,100:" + uuidA + ",NVIDIA,81920,100:;",
	uuidA + ",NVIDIA,1000,20:;" + uuidA + ",NVIDIA,1000,20:;",
	uuidA + "[1-0],NVIDIA,10240,0:" + uuidA + "[1-1],NVIDIA,10240,0:;",
	uuidA + "[group-1g.10gb-3],NVIDIA,10240,0:",
	"  " + uuidA + " , NVIDIA , 500 , 5 : ;\n",
	uuidA + ",NVIDIA,500,5,future:;",
	",NVIDIA,500,5:;" + uuidB + ",NVIDIA,2000,20:;",
	uuidA + ",NVIDIA,-500,5:;", uuidA + ",NVIDIA,lots,5:;", uuidA + "[1-x],NVIDIA,5,5:;",
	uuidA + ",NVIDIA,5,5:" + uuidA + ",NVIDIA,5,5:;",
	"", ";", ":;", ";;", "::", "garbage", "a,b,c", "a,b,1,2:;c,d,3,4",
}

// checkHAMiFormat checks what a decoder of HAMi's format returns for any
// value: deterministic, errors naming the annotation and container, devices
// safe for consumers (one clean id, Replace, an index inside the list), no
// id twice in a container, and each container read on its own: a container
// keeps exactly the devices its entry gives alone, whatever the others hold.
func checkHAMiFormat(t *testing.T, dec Decoder, key, allocator string, scope model.ContainerScope, value string) {
	ann := map[string]string{key: value}
	devices, err := dec.Decode(ann)
	again, errAgain := dec.Decode(ann)
	if !reflect.DeepEqual(devices, again) || fmt.Sprint(err) != fmt.Sprint(errAgain) {
		t.Fatalf("Decode is not deterministic: %+v %v / %+v %v", devices, err, again, errAgain)
	}
	if err != nil && !strings.HasPrefix(err.Error(), "decode "+key+": container ") {
		t.Errorf("error without context: %v", err)
	}
	entries := strings.Split(value, ";")
	if last := entries[len(entries)-1]; len(entries) > 1 && strings.TrimSpace(last) == "" {
		entries = entries[:len(entries)-1]
	}
	if strings.TrimSpace(value) == "" {
		entries = nil
	}
	// An entry's index: its position, or with ScopeRequestingAll its rank
	// among the non-empty entries.
	index := make([]int, len(entries))
	count := len(entries)
	if scope == model.ScopeRequestingAll {
		count = 0
		for i, entry := range entries {
			index[i] = -1
			if !emptyEntry(entry) {
				index[i] = count
				count++
			}
		}
	} else {
		for i := range entries {
			index[i] = i
		}
	}
	byContainer := map[int][]string{}
	lastIndex := 0
	for _, d := range devices {
		if d.Allocator != allocator || d.Resource != DefaultGPUResource || !d.Replace || d.ContainerScope != scope {
			t.Errorf("device with a wrong allocator, resource, scope or Replace: %+v", d)
		}
		if len(d.IDs) != 1 || d.IDs[0] == "" || strings.ContainsAny(d.IDs[0], "[]:;, \t\n\r") {
			t.Errorf("device without one clean id: %+v", d)
			continue
		}
		if d.ContainerIndex == nil || d.ContainerCount != count || *d.ContainerIndex < 0 || *d.ContainerIndex >= d.ContainerCount {
			t.Errorf("device outside the list of %d: %+v", count, d)
			continue
		}
		if *d.ContainerIndex < lastIndex {
			t.Errorf("devices out of container order: %+v", devices)
		}
		lastIndex = *d.ContainerIndex
		if slices.Contains(byContainer[*d.ContainerIndex], d.IDs[0]) {
			t.Errorf("id %q twice in container %d", d.IDs[0], *d.ContainerIndex)
		}
		byContainer[*d.ContainerIndex] = append(byContainer[*d.ContainerIndex], d.IDs[0])
	}
	for i, entry := range entries {
		alone, aloneErr := dec.Decode(map[string]string{key: entry})
		var want []string
		for _, d := range alone {
			want = append(want, d.IDs[0])
		}
		var got []string
		if index[i] >= 0 {
			got = byContainer[index[i]]
		}
		if !slices.Equal(got, want) {
			t.Errorf("container %d has %q; its entry %q alone gives %q", i, got, entry, want)
		}
		if aloneErr != nil && err == nil {
			t.Errorf("container %d's entry %q alone fails (%v) but the whole value does not", i, entry, aloneErr)
		}
	}
}

// FuzzHAMiDecode feeds arbitrary values to the HAMi decoder.
func FuzzHAMiDecode(f *testing.F) {
	for _, seed := range hamiSeeds {
		f.Add(seed)
	}
	addFixtureSeeds(f, func(key string) bool { _, ok := hamiVendor(key); return ok })
	h := NewHAMi(HAMiOptions{})
	f.Fuzz(func(t *testing.T, value string) {
		checkHAMiFormat(t, h, HAMiNVIDIAAnnotation, HAMiName, model.ScopeRequestingAll, value)
	})
}

// FuzzVolcanoVGPUDecode feeds arbitrary values to the Volcano vGPU decoder,
// which reads HAMi's format.
func FuzzVolcanoVGPUDecode(f *testing.F) {
	for _, seed := range hamiSeeds {
		f.Add(seed)
	}
	addFixtureSeeds(f, func(key string) bool { return key == VolcanoVGPUAnnotation })
	v := NewVolcanoVGPU(VolcanoVGPUOptions{})
	f.Fuzz(func(t *testing.T, value string) {
		checkHAMiFormat(t, v, VolcanoVGPUAnnotation, VolcanoVGPUName, model.ScopeRequesting, value)
	})
}

// FuzzVolcanoGPUShareDecode feeds arbitrary values to the gpushare decoder:
// never a panic, deterministic, all or nothing, and every device an index
// to translate, each GPU once.
func FuzzVolcanoGPUShareDecode(f *testing.F) {
	for _, seed := range []string{"0", "0,2", "3,0,2", " 0 , 2 ", "", " ", "0,", ",", "0,,2", "-1", "gpu0",
		"1,2,1", "2147483647", "2147483648", "99999999999999999999", "+1", "1.5", "0;1", uuidA} {
		f.Add(seed)
	}
	addFixtureSeeds(f, func(key string) bool { return key == VolcanoGPUShareAnnotation })
	g := NewVolcanoGPUShare(VolcanoGPUShareOptions{})
	f.Fuzz(func(t *testing.T, value string) {
		ann := map[string]string{VolcanoGPUShareAnnotation: value}
		devices, err := g.Decode(ann)
		again, errAgain := g.Decode(ann)
		if !reflect.DeepEqual(devices, again) || fmt.Sprint(err) != fmt.Sprint(errAgain) {
			t.Fatalf("Decode is not deterministic: %+v %v / %+v %v", devices, err, again, errAgain)
		}
		if err != nil {
			if devices != nil || !strings.HasPrefix(err.Error(), "decode "+VolcanoGPUShareAnnotation+": ") {
				t.Errorf("Decode = %+v, %v; want no devices and an error naming the annotation", devices, err)
			}
			return
		}
		if strings.TrimSpace(value) != "" && len(devices) != strings.Count(value, ",")+1 {
			t.Errorf("%d devices for %q", len(devices), value)
		}
		seen := map[int64]bool{}
		for _, d := range devices {
			if d.Allocator != VolcanoGPUShareName || d.Type != "gpu" || d.Resource != DefaultGPUResource || d.IDs != nil || d.Replace || d.ContainerIndex != nil {
				t.Errorf("unexpected device %+v", d)
			}
			if d.Index == nil || *d.Index < 0 || *d.Index > math.MaxInt32 || seen[*d.Index] {
				t.Errorf("bad or repeated index in %+v", devices)
				continue
			}
			seen[*d.Index] = true
		}
	})
}

// addFixtureSeeds seeds a fuzz target with the values of every annotation
// the schedulers' own code wrote in ../shared/fixtures/allocators whose key
// the target reads, so that mutations start from what is really written.
func addFixtureSeeds(f *testing.F, reads func(key string) bool) {
	cases, err := allocfixture.Load()
	if err != nil {
		f.Fatal(err)
	}
	n := 0
	for _, c := range cases {
		for key, value := range c.Annotations {
			if reads(key) {
				f.Add(value)
				n++
			}
		}
	}
	if n == 0 {
		f.Fatal("no fixture carries an annotation this target reads")
	}
}
