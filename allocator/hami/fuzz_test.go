package hami

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
)

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
func checkHAMiFormat(t *testing.T, dec decoder, key, allocator string, scope model.ContainerScope, value string) {
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
		if d.Allocator != allocator || d.Resource != parse.DefaultGPUResource || !d.Replace || d.ContainerScope != scope {
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
	allocfixture.AddSeeds(f, func(key string) bool { _, ok := hamiVendor(key); return ok })
	h := New(Options{})
	f.Fuzz(func(t *testing.T, value string) {
		checkHAMiFormat(t, h, NVIDIAAnnotation, Name, model.ScopeRequestingAll, value)
	})
}

// FuzzDecodeListAsVolcanoVGPU feeds arbitrary values to DecodeList as
// Volcano's vGPU decoder calls it: Volcano's vGPU plugin writes HAMi's
// format under its own key, for the requesting app containers.
func FuzzDecodeListAsVolcanoVGPU(f *testing.F) {
	const key = "volcano.sh/vgpu-ids-new"
	for _, seed := range hamiSeeds {
		f.Add(seed)
	}
	allocfixture.AddSeeds(f, func(k string) bool { return k == key })
	l := List{Allocator: "volcano-vgpu", Resource: parse.DefaultGPUResource, Scope: model.ScopeRequesting}
	v := decodeFunc(func(ann map[string]string) ([]model.Device, error) {
		value, ok := ann[key]
		if !ok {
			return nil, nil
		}
		return DecodeList(key, value, l)
	})
	f.Fuzz(func(t *testing.T, value string) {
		checkHAMiFormat(t, v, key, "volcano-vgpu", model.ScopeRequesting, value)
	})
}

// decoder is what checkHAMiFormat decodes with.
type decoder interface {
	Decode(annotations map[string]string) ([]model.Device, error)
}

type decodeFunc func(map[string]string) ([]model.Device, error)

func (f decodeFunc) Decode(ann map[string]string) ([]model.Device, error) { return f(ann) }
