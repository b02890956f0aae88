package reuse

import (
	"bytes"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
)

// The per-pod cache must not grow with the node's history: pods the latest
// answer no longer lists are dropped, and what it holds stays under
// MaxCacheBytes however large the kubelet's answers get.

func cachedPart(name string, size int) Part {
	return Part{
		Pod:  bytes.Repeat([]byte(name[:1]), size),
		Out:  []byte("out-" + name),
		Need: true,
		Plan: &plans.Plan{},
		Key:  model.PodKey{Namespace: "default", Name: name},
	}
}

func TestTheSegmentCacheDropsPodsNoLongerListed(t *testing.T) {
	var c Cache
	c.m = map[string]*segment{}
	c.Store([]Part{cachedPart("a", 100), cachedPart("b", 100), cachedPart("c", 100)}, 1)
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
	c.Store(parts, 1)
	if c.bytes > MaxCacheBytes || len(c.m) >= len(parts) {
		t.Errorf("cache holds %d pods in %d bytes, want fewer than %d pods within %d bytes", len(c.m), c.bytes, len(parts), MaxCacheBytes)
	}
}
