// Package annotationbound says which of a pod's annotations a pod source
// keeps and how large they may be: the one rule that the kubelet's /pods
// (kubeletpods/podsjson), its Pods API (kubeletpods/podsapi) and the
// runtime's copy in the store (NRI, CRI) all apply, so that the three give
// the same value for the same pod and none of them lets one tenant's
// annotations take the daemon's memory or fail a read for everyone.
//
// A pod's annotations are the one part of a pod a tenant writes freely
// (256 KiB a pod, the API server's limit). An annotation over its bound is
// kept as model.OversizedAnnotation, which its allocator refuses as
// malformed, on that pod only. Sizes are counted as the kubelet's /pods
// encodes the value (EncodedSize), and a pod's keys in key order (the
// order /pods writes them), whichever source read them: a value read from
// protobuf or from the runtime then gets exactly the marker /pods would
// have given it, and a pod the runtime reports with what /pods reported
// is seen unchanged.
package annotationbound

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/podres-proxy/podres-proxy/model"
)

// MaxPodBytes is the most bytes one pod's allocator annotations keep,
// together, keys included; a key that would take a pod past it is refused
// as if over its own bound (Bounds.Pod). A tenant may write 256 KiB of annotations on every pod, and
// some allocator keys are the pod's own to write (Koordinator's
// device-allocate-hint) or come in any number (HAMi's, one per vendor word):
// unbounded, a few pods fail every /pods read (docs/limits.md). 64 KiB is
// more than any scheduler writes for one pod: 256 device ids, the most a
// pod's annotations may name, are about 52 KiB in the wordiest format
// (Koordinator's GPU entries), a hint 4 KiB at most.
const MaxPodBytes = 64 << 10

// Bounds say which annotations a source keeps of each live pod and how
// large they may be.
type Bounds struct {
	// Annotation returns the most bytes the value of an annotation key
	// may take, as /pods encodes it (EncodedSize), for the key to be
	// kept; 0 skips the key unread. nil keeps every annotation,
	// unbounded (tools, benchmarks).
	Annotation func(key string) int
	// Pod bounds the bytes of the annotations one pod keeps together,
	// keys included; 0 means no bound. The key whose value would take a
	// pod past it is replaced as if over its own bound, so that a pod
	// with many allocator keys costs no more than a pod with one.
	Pod int
}

// Allocators returns the bounds every pod source applies: perKey, the
// allocators' bound of each key (allocator.Set.MaxAnnotationBytes), and
// MaxPodBytes for each pod. A nil perKey keeps every annotation, unbounded.
func Allocators(perKey func(key string) int) Bounds {
	if perKey == nil {
		return Bounds{}
	}
	return Bounds{Annotation: perKey, Pod: MaxPodBytes}
}

// Pod applies Bounds to one pod's annotations, offered in key order. Make
// one per pod with Bounds.NewPod.
type Pod struct {
	b    Bounds
	used int
}

// NewPod starts applying b to a pod's annotations.
func (b Bounds) NewPod() Pod { return Pod{b: b} }

// Keep says what to keep of the annotation key whose value takes size
// bytes as /pods encodes it: nothing (keep false: the value need not be
// read), the value (marker ""), or marker in its place
// (model.OversizedAnnotation, saying why). A value kept counts against the
// pod's bound whatever it says: one that looks like a replacement is the
// tenant's, and costs the same; a replaced one counts nothing.
func (p *Pod) Keep(key string, size int) (keep bool, marker string) {
	bound := -1 // keep, unbounded
	if p.b.Annotation != nil {
		bound = p.b.Annotation(key)
	}
	switch {
	case bound == 0:
		return false, ""
	case bound > 0 && size > bound:
		return true, model.OversizedAnnotation(fmt.Sprintf("%d bytes, over the bound of %d for this annotation", size, bound))
	case p.b.Pod > 0 && p.used+len(key)+size > p.b.Pod:
		return true, model.OversizedAnnotation(fmt.Sprintf("%d bytes, which would take the pod's allocator annotations to %d bytes, over their bound of %d",
			size, p.used+len(key)+size, p.b.Pod))
	}
	p.used += len(key) + size
	return true, ""
}

// Apply returns what b keeps of all, a pod's annotations as a source that
// decodes them whole reads them (the Pods API's protobuf, the runtime's
// sandbox): an empty map when it keeps none, nil when all is nil (a pod
// without annotations, as /pods decodes one).
func (b Bounds) Apply(all map[string]string) map[string]string {
	if all == nil {
		return nil
	}
	kept := make(map[string]string)
	keys := make([]string, 0, len(all))
	for k := range all {
		if b.Annotation == nil || b.Annotation(k) != 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	p := b.NewPod()
	for _, k := range keys {
		v := all[k]
		keep, marker := p.Keep(k, EncodedSize(v))
		switch {
		case !keep:
		case marker != "":
			kept[k] = marker
		default:
			kept[k] = v
		}
	}
	return kept
}

// EncodedSize returns how many bytes v takes inside a JSON string as the
// kubelet writes /pods (Go's encoding/json, which escapes HTML characters,
// writes invalid UTF-8 as \ufffd, and U+2028 and U+2029 as \u escapes),
// the quotes not counted: what package podsjson measures of the same value.
func EncodedSize(v string) int {
	n := 0
	for i := 0; i < len(v); {
		c := v[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"', c == '\\', c == '\b', c == '\f', c == '\n', c == '\r', c == '\t':
				n += 2
			case c < 0x20, c == '<', c == '>', c == '&':
				n += 6 // \u00XX
			default:
				n++
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(v[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			n += 6 // \ufffd
		case r == '\u2028', r == '\u2029':
			n += 6
		default:
			n += size
		}
		i += size
	}
	return n
}
