package decode

import (
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// The rules below change a copy of a record under the store's lock, as
// package record's do, with the batch's decoder.

// Set keeps the relevant annotations of all in r and decodes its devices
// again when they changed, or always when force is set (a record read back
// from disk is decoded again because the allocator configuration may have
// changed), as src reported them at now. It reports whether r changed.
func (b *Batch) Set(r *record.Record, all map[string]string, src record.Origin, now time.Time, force bool) bool {
	if b.d == nil {
		return false
	}
	rel := Relevant(b.d, all)
	if !force && r.Provenance.Annotations != nil && maps.Equal(rel, r.Annotations) {
		if seen := r.Provenance.Annotations; seen.Origin == record.OriginKubelet && src != record.OriginKubelet {
			// The runtime started the sandbox with what /pods said: from
			// now on the runtime's copy is the allocation, fixed (see
			// FromKubelet), held since it was first seen.
			r.Provenance.Annotations = &record.Seen{Origin: src, At: seen.At}
			return true
		}
		return false
	}
	r.Annotations = rel
	b.Devices(r)
	r.Provenance.Annotations = &record.Seen{Origin: src, At: now}
	return true
}

// FromKubelet records the annotations /pods reported of a running pod at
// now. The runtime's copy (NRI, CRI) is the allocation the sandbox started
// with, and it stays: an edit in the API changes nothing, and is recorded
// in Edited. A key the runtime's copy did not have is taken only when the
// sandbox started with an allocation (HAMi's device plugin writes its MIG
// instances after the sandbox started), keeping the copy's source and time,
// which say since when the pod holds its devices; a pod that started with
// none gets none later. It reports whether r changed.
func (b *Batch) FromKubelet(r *record.Record, api map[string]string, now time.Time) bool {
	seen := r.Provenance.Annotations
	if seen == nil || seen.Origin == record.OriginKubelet || b.d == nil {
		return b.Set(r, api, record.OriginKubelet, now, false)
	}
	fixed, edited := Fixed(r.Annotations, Relevant(b.d, api))
	changed := b.Set(r, fixed, seen.Origin, seen.At, false)
	if !slices.Equal(r.Edited, edited) {
		r.Edited = edited
		changed = true
	}
	return changed
}

// FromSandbox records the allocator annotations a sandbox of the pod was
// started with. The first sandbox's are the pod's allocation for the life
// of its UID: a later sandbox (the pause process killed, a node reboot) is
// started from the pod as the API has it then, edits included, and an edit
// must not become the allocation that way. A value that differs from the
// fixed one is recorded in Edited (and refused), never taken; the next
// /pods read says again which keys the API still has edited. It reports
// whether r changed.
func (b *Batch) FromSandbox(r *record.Record, all map[string]string, src record.Origin, now time.Time) bool {
	seen := r.Provenance.Annotations
	if seen == nil || seen.Origin == record.OriginKubelet || b.d == nil {
		return b.Set(r, all, src, now, false)
	}
	fixed, edited := Fixed(r.Annotations, Relevant(b.d, all))
	changed := b.Set(r, fixed, seen.Origin, seen.At, false)
	if merged := union(r.Edited, edited); !slices.Equal(merged, r.Edited) {
		r.Edited = merged
		changed = true
	}
	return changed
}

// union returns the sorted union of two sorted sets of keys.
func union(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// Redecode decodes again the annotations of r, a record read back from
// disk, with the current decoder. It reports whether that changed what the
// record says, so that its file must be written again.
func (b *Batch) Redecode(r *record.Record) bool {
	seen := r.Provenance.Annotations
	if seen == nil {
		return false
	}
	ann, devs, errs := r.Annotations, r.Devices, r.DecodeErrors
	return b.Set(r, r.Annotations, seen.Origin, seen.At, true) &&
		(!maps.Equal(ann, r.Annotations) || !sameOrEmpty(devs, r.Devices) || !sameOrEmpty(errs, r.DecodeErrors))
}

// sameOrEmpty is reflect.DeepEqual that does not tell nil from empty.
func sameOrEmpty[T any](a, b []T) bool {
	return len(a) == 0 && len(b) == 0 || reflect.DeepEqual(a, b)
}

// Containers decodes r's devices again when its containers' annotations
// are no longer before (ContainerAnnotations of r before it changed), and
// reports whether it did.
func (b *Batch) Containers(r *record.Record, before map[string]map[string]string) bool {
	same := maps.EqualFunc(before, ContainerAnnotations(r), func(x, y map[string]string) bool { return maps.Equal(x, y) })
	if !same && b.d != nil {
		b.Devices(r)
	}
	return !same
}

// Devices sets r's Devices and DecodeErrors from its Annotations, and then
// its containers' annotations.
func (b *Batch) Devices(r *record.Record) {
	ref := model.PodRef{UID: r.UID, Namespace: r.Namespace, Name: r.Name}
	if d, ok := b.lookup(r.Annotations); ok {
		r.Devices, r.DecodeErrors = d.devices, d.errors
	} else {
		// Not decoded beforehand: a record read back from disk,
		// annotations that changed between the batch's look and the
		// lock, or a CRI or NRI snapshot that brought a container's
		// annotations.
		r.Devices, r.DecodeErrors = Decode(b.d, ref, r.Annotations)
	}
	cd, ok := b.d.(ContainerDecoder)
	if !ok {
		return
	}
	if ctrs := ContainerAnnotations(r); len(ctrs) > 0 {
		// Bounded and cheap under the lock: only the runtime writes
		// container annotations, and only an allocator's keys are kept.
		devs, errs := cd.DecodeContainers(ref, r.Devices, ctrs)
		r.Devices = devs
		for _, err := range errs {
			r.DecodeErrors = append(slices.Clip(r.DecodeErrors), err.Error())
		}
	}
}

// ContainerAnnotations returns the annotations of r's containers that have
// some, by container name; a later container of one name (a restart) wins.
func ContainerAnnotations(r *record.Record) map[string]map[string]string {
	var out map[string]map[string]string
	for _, c := range r.Containers {
		if len(c.Annotations) == 0 {
			continue
		}
		if out == nil {
			out = map[string]map[string]string{}
		}
		out[c.Name] = c.Annotations
	}
	return out
}
