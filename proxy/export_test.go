package proxy

import (
	"context"
	"time"
)

// BuildList builds the default view's v1 List answer from the bytes of a
// kubelet answer, as a List does once the kubelet has answered: benchmarks
// time it alone.
func BuildList(s *Server, kubelet []byte) ([]byte, error) {
	return s.buildV1(context.Background(), s.views[0], kubelet, time.Now(), s.snapshot())
}
