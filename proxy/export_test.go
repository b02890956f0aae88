package proxy

import (
	"context"
	"time"
)

// OnSharedCallJoin calls f each time a caller of List (v1 and v1alpha1) or
// GetAllocatableResources starts waiting for a shared kubelet call, so that
// tests can await callers instead of sleeping.
func OnSharedCallJoin(s *Server, f func(method string)) {
	for _, c := range []interface{ SetJoined(func(string)) }{s.listV1, s.listV1alpha1, s.allocatable} {
		c.SetJoined(f)
	}
}

// BuildList builds the v1 List answer from the bytes of a kubelet answer,
// as a List does once the kubelet has answered: benchmarks time it alone.
func BuildList(s *Server, kubelet []byte) ([]byte, error) {
	return s.buildV1(context.Background(), kubelet, time.Now())
}
