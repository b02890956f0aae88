package proxy

import (
	"context"
	"time"
)

// BuildList builds the v1 List answer from the bytes of a kubelet answer,
// as a List does once the kubelet has answered: benchmarks time it alone.
func BuildList(s *Server, kubelet []byte) ([]byte, error) {
	return s.build(context.Background(), &s.listV1, kubelet, time.Now())
}
