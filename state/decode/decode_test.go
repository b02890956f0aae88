package decode

import (
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
)

// countingDecoder reads annotations under alloc/ and counts its decodings.
type countingDecoder struct{ n int }

func (d *countingDecoder) Relevant(key string) bool { return strings.HasPrefix(key, "alloc/") }

func (d *countingDecoder) MaxAnnotationBytes(key string) int {
	if d.Relevant(key) {
		return 64 << 10
	}
	return 0
}

func (d *countingDecoder) Decode(_ model.PodRef, ann map[string]string) ([]model.Device, []error) {
	d.n++
	var devs []model.Device
	var errs []error
	for k, v := range ann {
		if v == "bad" {
			errs = append(errs, errors.New(k+": bad"))
			continue
		}
		devs = append(devs, model.Device{Resource: k, IDs: []string{v}})
	}
	return devs, errs
}

func TestABatchDecodesEachSetOfAnnotationsOnceAndFindsItByContent(t *testing.T) {
	d := &countingDecoder{}
	rel := Relevant(d, map[string]string{"alloc/gpu": "G1", "alloc/rdma": "bad", "other": "x"})
	if want := map[string]string{"alloc/gpu": "G1", "alloc/rdma": "bad"}; !maps.Equal(rel, want) {
		t.Fatalf("Relevant = %v; want %v", rel, want)
	}
	b := NewBatch(d)
	b.Add(model.PodRef{UID: "u1"}, rel)
	b.Add(model.PodRef{UID: "u2"}, maps.Clone(rel)) // the same content: not decoded again
	if d.n != 1 {
		t.Errorf("%d decodings of one set of annotations; want 1", d.n)
	}
	got, ok := b.lookup(map[string]string{"alloc/rdma": "bad", "alloc/gpu": "G1"})
	if !ok || len(got.devices) != 1 || !reflect.DeepEqual(got.errors, []string{"alloc/rdma: bad"}) {
		t.Errorf("lookup = %+v, %v; want one device and the error's message", got, ok)
	}
	if _, ok := b.lookup(map[string]string{"alloc/gpu": "G2"}); ok {
		t.Error("lookup found annotations the batch never decoded")
	}
}

func TestFixedKeepsTheRuntimesCopyAndRecordsTheAPIsEdits(t *testing.T) {
	for _, tt := range []struct {
		name         string
		runtime, api map[string]string
		fixed        map[string]string
		edited       []string
	}{
		{"unchanged", map[string]string{"a": "1"}, map[string]string{"a": "1"}, map[string]string{"a": "1"}, nil},
		{"edited and dropped", map[string]string{"a": "1", "b": "2"}, map[string]string{"a": "9"}, map[string]string{"a": "1", "b": "2"}, []string{"a", "b"}},
		{"a key added later is taken", map[string]string{"a": "1"}, map[string]string{"a": "1", "mig": "m"}, map[string]string{"a": "1", "mig": "m"}, nil},
		{"none at start: none later", nil, map[string]string{"a": "1"}, map[string]string{}, []string{"a"}},
		{"an API value too large to read is no edit", map[string]string{"a": "1", "hint": strings.Repeat("x", 300<<10)},
			map[string]string{"a": "1", "hint": model.OversizedAnnotation("307200 bytes, over the bound of 4096")},
			map[string]string{"a": "1", "hint": strings.Repeat("x", 300<<10)}, nil},
	} {
		fixed, edited := Fixed(tt.runtime, tt.api)
		if !maps.Equal(fixed, tt.fixed) || !reflect.DeepEqual(edited, tt.edited) {
			t.Errorf("%s: Fixed = %v, %v; want %v, %v", tt.name, fixed, edited, tt.fixed, tt.edited)
		}
	}
}
