// Package decode is what a pod's allocation annotations do to its record:
// which are kept, the devices they decode to, and the rule for a pod whose
// sandbox started (Fixed): the runtime's copy of the annotations is the
// allocation, and edits in the API are recorded, not taken.
//
// Decoding can take a while (a hostile pod may list thousands of devices),
// and the state store's write lock is what every query's reads wait on. So
// the store keeps only the annotations some allocator reads (Relevant),
// decodes them before it takes the lock (a Batch, one per call) and, under
// the lock, only looks the results up and swaps records. A Batch is keyed
// by the relevant annotations' content, so a sandbox that names its pod
// only by sandbox id finds its result too.
package decode

import (
	"hash/maphash"
	"maps"
	"slices"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Decoder turns a pod's annotations into devices. The allocator set
// implements it; the store calls it whenever a pod's allocator annotations
// change, whichever source they came from, so NRI, CRI and /pods agree.
type Decoder interface {
	// Relevant reports whether some allocator decodes the annotation key.
	// Only relevant annotations are kept in records.
	Relevant(key string) bool
	// MaxAnnotationBytes returns how large the value of the annotation key
	// may be for a record to keep it (as every pod source keeps it: see
	// package annotationbound), 0 when no allocator reads the key.
	MaxAnnotationBytes(key string) int
	// Decode returns the devices the annotations allocate. Errors describe
	// annotations that could not be understood; the devices of the others
	// are still returned.
	Decode(pod model.PodRef, annotations map[string]string) ([]model.Device, []error)
}

// ContainerDecoder is a Decoder whose allocators also write per container,
// in the annotations the runtime creates a container with (a device
// plugin's AllocateResponse annotations), which never reach the pod's. The
// allocator set implements it.
type ContainerDecoder interface {
	Decoder
	// RelevantToContainer reports whether some allocator reads the
	// container annotation key; only those are kept in records.
	RelevantToContainer(key string) bool
	// DecodeContainers returns devices, decoded from the pod's annotations,
	// with what the containers' annotations (by container name) say
	// applied, and errors for the annotations it could not understand.
	DecodeContainers(pod model.PodRef, devices []model.Device, containers map[string]map[string]string) ([]model.Device, []error)
}

// MaxContainerAnnotation bounds the value of a container annotation a
// record keeps: TensorFusion's partitions for a whole node's MIG instances
// take a few KiB. Container annotations come from the runtime, which got
// them from the kubelet and its device plugins, not from the pod's author;
// the bound keeps a broken plugin from growing records.
const MaxContainerAnnotation = 16 << 10

// RelevantToContainer keeps the container annotations d reads, each at most
// MaxContainerAnnotation bytes long (a longer one is left out, and so not
// believed); nil when there are none or d reads none.
func RelevantToContainer(d Decoder, all map[string]string) map[string]string {
	cd, ok := d.(ContainerDecoder)
	if !ok {
		return nil
	}
	var rel map[string]string
	for k, v := range all {
		if cd.RelevantToContainer(k) && len(v) <= MaxContainerAnnotation {
			if rel == nil {
				rel = map[string]string{}
			}
			rel[k] = v
		}
	}
	return rel
}

// Bounded keeps the annotations d reads, each within its bound and the
// pod's, as the kubelet's pod sources keep them (annotationbound): a value
// over them is kept as model.OversizedAnnotation. It is for what the
// runtime reports (NRI, CRI), which carries a pod's annotations whole: a
// tenant's padded hint must not grow a record, its file and every copy of
// it, and a pod the runtime reports with the annotations /pods reported
// must read the same from both. nil when there are none.
func Bounded(d Decoder, all map[string]string) map[string]string {
	if d == nil {
		return nil
	}
	b := annotationbound.Allocators(d.MaxAnnotationBytes)
	if rel := b.Apply(all); len(rel) > 0 {
		return rel
	}
	return nil
}

// Relevant keeps the annotations d reads; nil when there are none.
func Relevant(d Decoder, all map[string]string) map[string]string {
	var rel map[string]string
	for k, v := range all {
		if d.Relevant(k) {
			if rel == nil {
				rel = map[string]string{}
			}
			rel[k] = v
		}
	}
	return rel
}

// Decode decodes relevant annotations rel of the pod ref, with the errors
// as messages, as records keep them.
func Decode(d Decoder, ref model.PodRef, rel map[string]string) ([]model.Device, []string) {
	if len(rel) == 0 {
		return nil, nil
	}
	devs, errs := d.Decode(ref, rel)
	var msgs []string
	for _, err := range errs {
		msgs = append(msgs, err.Error())
	}
	return devs, msgs
}

// result is one decoding's result.
type result struct {
	rel     map[string]string
	devices []model.Device
	errors  []string
}

// Batch is one store call's decoder and what it decoded before the store's
// lock was taken (Add). Under the lock, its rules (rules.go) look the
// results up, and decode only what was not foreseen.
type Batch struct {
	d       Decoder
	results map[uint64][]*result
}

// NewBatch returns an empty batch that decodes with d; nil keeps no
// annotations.
func NewBatch(d Decoder) *Batch {
	return &Batch{d: d, results: map[uint64][]*result{}}
}

var annSeed = maphash.MakeSeed()

// annKey hashes relevant annotations independently of map order.
func annKey(rel map[string]string) uint64 {
	keys := make([]string, 0, len(rel))
	for k := range rel {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var h maphash.Hash
	h.SetSeed(annSeed)
	for _, k := range keys {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(rel[k])
		h.WriteByte(0)
	}
	return h.Sum64()
}

// Add decodes rel, the relevant annotations of the pod ref, unless the
// batch has them already.
func (b *Batch) Add(ref model.PodRef, rel map[string]string) {
	if _, ok := b.lookup(rel); ok {
		return
	}
	devs, errs := Decode(b.d, ref, rel)
	k := annKey(rel)
	b.results[k] = append(b.results[k], &result{rel: rel, devices: devs, errors: errs})
}

// Foresee decodes the relevant annotations of all, of the pod ref whose
// record is had (nil: none), before the store's lock is taken; ref names
// the pod in the decoder's errors. Annotations the record already has are
// not decoded again (CRI reconciles list every sandbox every 30 s); only a
// record whose annotations changed between this look and the lock (a race
// of two sources) or one loaded at Open is decoded under the lock.
func (b *Batch) Foresee(ref model.PodRef, all map[string]string, had *record.Record) {
	if b.d == nil {
		return
	}
	rel := Relevant(b.d, all)
	if len(rel) == 0 || had != nil && had.Provenance.Annotations != nil && maps.Equal(rel, had.Annotations) {
		return
	}
	b.Add(ref, rel)
}

// lookup returns the result for rel, if the batch decoded it.
func (b *Batch) lookup(rel map[string]string) (*result, bool) {
	for _, d := range b.results[annKey(rel)] {
		if maps.Equal(d.rel, rel) {
			return d, true
		}
	}
	return nil, false
}

// Fixed returns the allocation annotations of a pod whose sandbox started
// with runtime, given what the API says now: runtime's values, plus the
// keys only the API has when runtime had any; and, sorted, the keys whose
// API value differs from runtime's, that the API dropped, or that it added
// to a pod that started with none. An API value the pod source left unread
// for its size (model.OversizedAnnotation) is neither taken nor an edit:
// nothing is known of it but that it is large, as the runtime's copy of a
// tenant's padded annotation is too.
func Fixed(runtime, api map[string]string) (fixed map[string]string, edited []string) {
	fixed = maps.Clone(runtime)
	if fixed == nil {
		fixed = map[string]string{}
	}
	for k, v := range api {
		old, ok := runtime[k]
		if _, unread := model.Oversized(v); unread {
			continue
		}
		switch {
		case !ok && len(runtime) > 0:
			fixed[k] = v
		case !ok || old != v:
			edited = append(edited, k)
		}
	}
	for k := range runtime {
		if _, ok := api[k]; !ok {
			edited = append(edited, k)
		}
	}
	slices.Sort(edited)
	return fixed, edited
}
