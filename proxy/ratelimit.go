package proxy

import (
	"context"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The kubelet's PodResources rate limit: one token bucket for the whole
// endpoint, shared by every client, method and API version.
const (
	DefaultRateLimitQPS   = 100
	DefaultRateLimitBurst = 10
)

// errRateLimited is the kubelet's exact error, so clients that test for it
// with errors.Is (same code and message) behave the same behind the proxy.
var errRateLimited = status.Error(codes.ResourceExhausted, "rejected by rate limit")

// rateLimit returns an interceptor that rejects calls beyond qps (with burst)
// before they reach a handler or the kubelet. qps <= 0 disables it.
func rateLimit(qps float64, burst int, m *Metrics) grpc.UnaryServerInterceptor {
	if qps <= 0 {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(ctx, req)
		}
	}
	if burst < 1 {
		burst = 1
	}
	l := rate.NewLimiter(rate.Limit(qps), burst)
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if !l.Allow() {
			if m != nil {
				m.rateLimited.Inc()
			}
			return nil, errRateLimited
		}
		return h(ctx, req)
	}
}
