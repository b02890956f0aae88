package kubeletpods

import (
	"context"
	"sync"
	"time"

	"github.com/podres-proxy/podres-proxy/internal/coalesce"
	"github.com/podres-proxy/podres-proxy/model"
	"k8s.io/utils/clock"
)

// Fetch reads the kubelet's pods once; Client.Pods is one.
type Fetch func(ctx context.Context) ([]model.KubeletPod, error)

// Counted returns fetch, calling count after each read that succeeds: each
// user of the one /pods client counts its reads in a metric of its own.
func Counted(fetch Fetch, count func()) Fetch {
	return func(ctx context.Context) ([]model.KubeletPod, error) {
		pods, err := fetch(ctx)
		if err == nil {
			count()
		}
		return pods, err
	}
}

// DefaultReadTimeout bounds a shared read when ReaderOptions.Timeout is 0.
const DefaultReadTimeout = 10 * time.Second

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// Timeout bounds each caller's wait for a read, and so each read; 0
	// means DefaultReadTimeout. A read is not cancelled by a caller who
	// leaves while others wait for it, so this is what ends a read that
	// hangs.
	Timeout time.Duration
	// Metrics is told the duration and outcome of every read, before its
	// waiters are; nil: nothing.
	Metrics Metrics
	// Clock is the clock; nil means the real one.
	Clock clock.PassiveClock
}

// Metrics receives what a Reader measures; the daemon passes its one
// metrics.Metrics, so this package imports no Prometheus. It must be safe
// for concurrent use and must not block.
type Metrics interface {
	// PodsRead records one read of the kubelet's pods: how long it took
	// and its error, nil on success.
	PodsRead(took time.Duration, err error)
}

// Reader coalesces /pods reads. Each query needs a read that started after
// the query arrived (so that a pod being created is seen with its
// annotations), and reading /pods is the expensive part of answering, so
// concurrent queries share reads (package coalesce): at most one read is in
// flight, a query joins it when it started after the query arrived, and
// the others share the next one. However many queries arrive, they cost at
// most two reads. The newest successful read is kept for queries that
// arrived before it started.
type Reader struct {
	fetch   Fetch
	metrics Metrics
	clock   clock.PassiveClock
	reads   *coalesce.Group[*PodList]

	mu   sync.Mutex
	last *PodList // the newest successful read
}

// NewReader returns a Reader that reads with fetch.
func NewReader(fetch Fetch, opts ReaderOptions) *Reader {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultReadTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	r := &Reader{fetch: fetch, metrics: opts.Metrics, clock: opts.Clock}
	r.reads = coalesce.New(r.read, coalesce.Options{Name: "kubelet pods read", Timeout: opts.Timeout, Clock: opts.Clock})
	return r
}

// ReadAfter returns the result of a read that started at or after t
// (normally the time the query arrived; a t in the future counts as now):
// the newest successful read if it did, else a shared read (see Reader). A
// failed read gives its error to all who waited for it and is not kept: the
// next caller starts a new read.
//
// ctx bounds only the caller's wait: a shared read is not cancelled when a
// caller leaves and others still wait for it.
func (r *Reader) ReadAfter(ctx context.Context, t time.Time) (*PodList, error) {
	if now := r.clock.Now(); t.After(now) {
		t = now
	}
	r.mu.Lock()
	last := r.last
	r.mu.Unlock()
	if last != nil && !last.Started.Before(t) {
		return last, nil
	}
	// At or after t is after t less the clock's least step.
	return r.reads.Do(ctx, t.Add(-time.Nanosecond))
}

// read does one read, which started at started.
func (r *Reader) read(ctx context.Context, started time.Time) (*PodList, error) {
	pods, err := r.fetch(ctx)
	if r.metrics != nil {
		r.metrics.PodsRead(r.clock.Since(started), err)
	}
	if err != nil {
		return nil, err
	}
	snap := NewPodList(started, pods)
	r.mu.Lock()
	if r.last == nil || !started.Before(r.last.Started) {
		r.last = snap
	}
	r.mu.Unlock()
	return snap, nil
}

// PodList is the result of one /pods read, made by NewPodList. It is
// shared by every caller of the read and must not be modified.
type PodList struct {
	// Started is when the read started: the list shows every pod the
	// kubelet had been given by then.
	Started time.Time
	// Pods are the kubelet's pods, oldest first (see Client.Pods).
	Pods []model.KubeletPod

	byKey map[model.PodKey]int // index in Pods of the pod Lookup answers
}

// NewPodList indexes pods, which must be oldest first, for Lookup.
func NewPodList(started time.Time, pods []model.KubeletPod) *PodList {
	s := &PodList{Started: started, Pods: pods, byKey: make(map[model.PodKey]int, len(pods))}
	for i := range pods {
		key := model.PodKey{Namespace: pods[i].Namespace, Name: pods[i].Name}
		if j, ok := s.byKey[key]; !ok || prefer(&pods[i], &pods[j]) {
			s.byKey[key] = i
		}
	}
	return s
}

// Lookup returns the pod PodResources means by namespace and name.
//
// PodResources names pods without a UID, and /pods can hold more than one
// pod of a name: the kubelet keeps finished (Succeeded or Failed) pods until
// they are deleted, and a pod recreated under its predecessor's name can
// briefly be listed beside it. The kubelet's own Get answers the pod it was
// given last under that name, and the pods PodResources lists are the
// active ones; so Lookup prefers a pod that is not finished, and among
// equals the later one in Pods, which is the newer (Pods is oldest first).
// This way a query about a pod being created never gets its predecessor.
func (s *PodList) Lookup(key model.PodKey) (*model.KubeletPod, bool) {
	i, ok := s.byKey[key]
	if !ok {
		return nil, false
	}
	return &s.Pods[i], true
}

// prefer reports whether Lookup should answer p rather than q, an earlier
// pod of the same name: unless p is finished and q is not.
func prefer(p, q *model.KubeletPod) bool {
	return !p.Terminal() || q.Terminal()
}
