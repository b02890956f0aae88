package reuse

import (
	"bytes"
	"fmt"
	"runtime"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

// The per-pod cache must not grow with the node's history: pods the latest
// answer no longer lists are dropped, and what it holds stays under
// MaxCacheBytes however large the kubelet's answers get.

func cachedPart(name string, size int) Part {
	return Part{
		Pod:  bytes.Repeat([]byte(name[:1]), size),
		Out:  []byte("out-" + name),
		Need: true,
		Rec:  &state.Record{Name: name},
		Key:  model.PodKey{Namespace: "default", Name: name},
	}
}

func TestTheSegmentCacheDropsPodsNoLongerListed(t *testing.T) {
	var c Cache
	c.m = map[string]*segment{}
	c.Store([]Part{cachedPart("a", 100), cachedPart("b", 100), cachedPart("c", 100)}, nil, 1, 1, noOthers)
	if len(c.m) != 3 {
		t.Fatalf("cache holds %d pods, want 3", len(c.m))
	}
	// The next answer lists only b.
	c.m[string(bytes.Repeat([]byte("b"), 100))].seen = 2
	c.Drop(2, 1)
	if len(c.m) != 1 {
		t.Fatalf("after an answer listing one pod the cache holds %d, want 1", len(c.m))
	}
	for _, e := range c.m {
		if e.key.Name != "b" || c.bytes != e.size() {
			t.Errorf("cache holds %s in %d bytes, want b in %d", e.key.Name, c.bytes, e.size())
		}
	}
}

func TestTheSegmentCacheStaysWithinItsBound(t *testing.T) {
	var c Cache
	c.m = map[string]*segment{}
	var parts []Part
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		parts = append(parts, cachedPart(name, MaxCacheBytes/4))
	}
	c.Store(parts, nil, 1, 1, noOthers)
	if c.bytes > MaxCacheBytes || len(c.m) >= len(parts) {
		t.Errorf("cache holds %d pods in %d bytes, want fewer than %d pods within %d bytes", len(c.m), c.bytes, len(parts), MaxCacheBytes)
	}
}

// noOthers says no pod's answer depends on another pod's record.
func noOthers(*state.Record) bool { return false }

// kubeletAnswer is an encoded List answer of n pods of about size bytes
// each, and its parts: every third pod given an output of its own, as
// rebuilt pods are, the others left as the kubelet sent them.
func kubeletAnswer(t *testing.T, n, size int) ([]byte, []Part) {
	t.Helper()
	var answer []byte
	for i := range n {
		pod := protowire.AppendTag(nil, nameField, protowire.BytesType)
		pod = protowire.AppendString(pod, fmt.Sprintf("pod-%d", i))
		pod = protowire.AppendTag(pod, 99, protowire.BytesType) // a field this build does not know
		pod = protowire.AppendBytes(pod, bytes.Repeat([]byte{'x'}, size))
		answer = protowire.AppendTag(answer, podsField, protowire.BytesType)
		answer = protowire.AppendBytes(answer, pod)
	}
	answer = protowire.AppendTag(answer, 7, protowire.VarintType) // not a pod: copied through
	answer = protowire.AppendVarint(answer, 1)
	parts, err := Split(nil, answer)
	if err != nil {
		t.Fatal(err)
	}
	for i := range parts {
		p := &parts[i]
		if p.Pod == nil {
			continue
		}
		if i%3 != 2 {
			p.Out, p.Same = p.Field, true
			continue
		}
		out := protowire.AppendTag(nil, podsField, protowire.BytesType)
		p.Out = protowire.AppendBytes(out, append(slices.Clone(p.Pod), "+device"...))
	}
	return answer, parts
}

func TestASplicedAnswerIsEveryPartsOutputInOrder(t *testing.T) {
	kubelet, parts := kubeletAnswer(t, 50, 40)
	var want []byte
	for _, p := range parts {
		if p.Pod == nil {
			want = append(want, p.Field...)
		} else {
			want = append(want, p.Out...)
		}
	}
	a := Splice(kubelet, parts)
	if got := a.Bytes(); !bytes.Equal(got, want) || a.Len() != len(want) {
		t.Fatalf("spliced answer (%d bytes) differs from the parts' outputs in order (%d bytes)", len(got), len(want))
	}
	// Runs of the kubelet's own fields go out as one piece: here two pods
	// out of three.
	if pieces := len(a.data); pieces > len(parts)*2/3+1 {
		t.Errorf("%d pieces for %d parts: neighbouring kubelet fields were not joined", pieces, len(parts))
	}
}

// A steady List's answer must reach gRPC's transport without being copied:
// neither joined into one buffer nor encoded again by gRPC's protobuf codec.
// What the splice and the codec allocate is a little per piece, far less
// than the answer.
func TestAnAnswerReachesTheTransportWithoutBeingCopied(t *testing.T) {
	kubelet, parts := kubeletAnswer(t, 500, 256)
	var before, after runtime.MemStats
	const runs = 20
	var size int
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		data, err := Codec{}.Marshal(Splice(kubelet, parts))
		if err != nil {
			t.Fatal(err)
		}
		size = data.Len()
	}
	runtime.ReadMemStats(&after)
	if per := int(after.TotalAlloc-before.TotalAlloc) / runs; per > size/4 {
		t.Errorf("sending an answer of %d bytes allocated %d bytes: it was copied", size, per)
	}
}
