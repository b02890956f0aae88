package podsapi

import (
	"context"
	"time"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/model"
)

// Source names, as Or tells Metrics.PodSourceRead.
const (
	SourcePodsAPI = "pods-api"
	SourcePods    = "pods"
)

// Or returns a kubeletpods.Fetch that reads the kubelet's pods with
// ListPods, and with fallback (the kubelet's /pods) only when ListPods
// fails: no socket (a kubelet without the PodsAPI gate, or restarting),
// FailedPrecondition (v1.37 initializing), Unavailable, ResourceExhausted
// (its rate limit). Whether the watch is synced does not matter: a fresh
// read is wanted precisely when the watch may have missed something, and
// the Pods API costs no token, TLS or JSON, and no tenant's annotations
// can fail it for everyone. Without a kubelet on the socket, gRPC fails
// the call at once (it redials at its own backoff's pace, not per call),
// and the failure is logged at debug only. Metrics is told which source
// gave each successful read.
func (s *Source) Or(fallback kubeletpods.Fetch) kubeletpods.Fetch {
	return func(ctx context.Context) ([]model.KubeletPod, error) {
		pods, err := s.Pods(ctx)
		if err == nil {
			s.metrics.PodSourceRead(SourcePodsAPI)
			return pods, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		s.log.WithError(err).Debug("Kubelet Pods API: ListPods failed; reading /pods instead")
		pods, err = fallback(ctx)
		if err == nil {
			s.metrics.PodSourceRead(SourcePods)
		}
		return pods, err
	}
}

// Metrics receives what the source measures; the daemon passes its one
// metrics.Metrics, so this package imports no Prometheus. Implementations
// must be safe for concurrent use and must not block.
type Metrics interface {
	// PodsAPIEvent counts one event received from the kubelet, by type
	// ("ADDED", "MODIFIED", "DELETED", "INITIAL_SYNC_COMPLETE", or another
	// the kubelet may add).
	PodsAPIEvent(kubeletType string)
	// PodsAPIRelisted counts a completed relist: how many pods it listed,
	// how many known pods it found gone, and how long it took from the
	// watch call.
	PodsAPIRelisted(pods, deleted int, took time.Duration)
	// PodsAPIReconnect counts a watch that ended, with why, before the
	// next attempt.
	PodsAPIReconnect(err error)
	// PodsAPIInitializing counts a watch the kubelet refused because it
	// is initializing (FailedPrecondition, v1.37 after every start); it is
	// counted as a reconnect too.
	PodsAPIInitializing()
	// PodSourceRead counts a successful read of Or, by the source that
	// gave it (SourcePodsAPI, SourcePods).
	PodSourceRead(source string)
}

type noMetrics struct{}

func (noMetrics) PodsAPIEvent(string)                     {}
func (noMetrics) PodsAPIRelisted(int, int, time.Duration) {}
func (noMetrics) PodsAPIReconnect(error)                  {}
func (noMetrics) PodsAPIInitializing()                    {}
func (noMetrics) PodSourceRead(string)                    {}
