package podsapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

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
func (s *Source) Or(fallback func(context.Context) ([]model.KubeletPod, error)) func(context.Context) ([]model.KubeletPod, error) {
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

// Pods reads the kubelet's pods once with ListPods, for a query about a
// pod the watch has not shown yet: a kubeletpods.Fetch, to share reads
// through a kubeletpods.Reader. The pods come oldest first (by creation;
// the kubelet's order, by UID, among pods created in the same second), as
// kubeletpods.NewPodList wants them. A refused pod is logged and left out,
// and so is every pod of its name, so that a lookup by that name finds
// nothing rather than the refused pod's predecessor. The read is bounded
// by ctx and Options.Timeout. The kubelet rate-limits ListPods (100 per
// second, burst 10, shared by every client) and answers ResourceExhausted
// beyond that, so callers should share reads.
func (s *Source) Pods(ctx context.Context) ([]model.KubeletPod, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout,
		fmt.Errorf("no answer within %v: %w", s.timeout, context.DeadlineExceeded))
	defer cancel()
	resp, err := s.client.ListPods(ctx, &podsv1alpha1.ListPodsRequest{})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
		}
		return nil, fmt.Errorf("list pods from the kubelet Pods API at %s: %w", s.socket, err)
	}
	leftOut := func(p *model.KubeletPod, err error) {
		s.log.WithError(err).WithField("pod", podRef(p)).Warn("Kubelet Pods API: pod left out of a ListPods read")
	}
	all := make([]decoded, 0, len(resp.GetPods()))
	refusedNames := make(map[model.PodKey]bool)
	for _, data := range resp.GetPods() {
		d, err := s.dec.decode(data)
		if err != nil {
			leftOut(&d.pod, err)
			refusedNames[key(&d.pod)] = true
			continue
		}
		all = append(all, d)
	}
	slices.SortStableFunc(all, func(a, b decoded) int { return a.created.Compare(b.created) })
	pods := make([]model.KubeletPod, 0, len(all))
	for i := range all {
		p := &all[i].pod
		if refusedNames[key(p)] {
			leftOut(p, errors.New("another pod of its name was refused"))
			continue
		}
		pods = append(pods, *p)
	}
	return pods, nil
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
