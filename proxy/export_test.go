package proxy

import (
	"context"
	"time"
)

// BuildList builds the default view's v1 List answer from the bytes of a kubelet answer,
// as a List does once the kubelet has answered: benchmarks time it alone.
func BuildList(s *Server, kubelet []byte) ([]byte, error) {
	return s.build(context.Background(), &s.listV1, s.views[0], kubelet, time.Now())
}
