package kubeletpods

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"k8s.io/utils/clock"
)

// Fetch reads the kubelet's pods once; Client.Pods is one.
type Fetch func(ctx context.Context) ([]model.KubeletPod, error)

// DefaultReadTimeout bounds a shared read when ReaderOptions.Timeout is 0.
const DefaultReadTimeout = 10 * time.Second

// ReaderOptions configure a Reader.
type ReaderOptions struct {
	// Timeout bounds each shared read; 0 means DefaultReadTimeout. A read
	// is not cancelled by its callers (others may be waiting for it), so
	// this is what ends a read that hangs.
	Timeout time.Duration
	// OnRead, when set, is told the duration and outcome of every read,
	// before its waiters are: for metrics and logs. It must not block.
	OnRead func(d time.Duration, err error)
	// Clock is the clock; nil means the real one.
	Clock clock.PassiveClock
}

// Reader coalesces /pods reads. Each query needs a read that started after
// the query arrived (so that a pod being created is seen with its
// annotations), and reading /pods is the expensive part of answering, so
// concurrent queries share reads: at most one read is in flight, and the
// queries that arrive during it share the next one. However many queries
// arrive, they cost at most two reads.
type Reader struct {
	fetch   Fetch
	timeout time.Duration
	onRead  func(time.Duration, error)
	clock   clock.PassiveClock

	mu   sync.Mutex
	last *PodList // the newest successful read
	cur  *read    // the read in flight, if any
	next *read    // the read that starts when cur ends, if anyone waits for one
}

// read is one call of fetch and the callers waiting for it.
type read struct {
	started time.Time // zero until it starts
	// deadline is when the first caller to wait for this read has waited
	// a whole timeout: a read that starts late (after a read that hung)
	// gets only what is left of that, so no caller waits for two.
	deadline time.Time
	waiters  int // callers waiting; a next read nobody waits for is dropped
	done     chan struct{}
	snap     *PodList // set before done is closed, on success
	err      error    // set before done is closed, on failure
}

// NewReader returns a Reader that reads with fetch.
func NewReader(fetch Fetch, opts ReaderOptions) *Reader {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultReadTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Reader{fetch: fetch, timeout: opts.Timeout, onRead: opts.OnRead, clock: opts.Clock}
}

// ReadAfter returns the result of a read that started at or after t
// (normally the time the query arrived; a t in the future counts as now).
// If the newest successful read started at or after t it is returned at
// once; if the read in flight did, the caller joins it; otherwise the caller
// joins the next read, which starts when the one in flight ends. A failed
// read gives its error to all who joined it and is not remembered: the next
// caller starts a new read.
//
// ctx bounds only the caller's wait: a shared read is not cancelled when a
// caller leaves (it has its own timeout), so the others still get it.
func (r *Reader) ReadAfter(ctx context.Context, t time.Time) (*PodList, error) {
	r.mu.Lock()
	if now := r.clock.Now(); t.After(now) {
		t = now
	}
	if r.last != nil && !r.last.Started.Before(t) {
		s := r.last
		r.mu.Unlock()
		return s, nil
	}
	if err := ctx.Err(); err != nil {
		r.mu.Unlock()
		return nil, fmt.Errorf("wait for a kubelet pods read: %w", context.Cause(ctx))
	}
	var rd *read
	switch {
	case r.cur == nil:
		rd = &read{done: make(chan struct{})}
		r.startLocked(rd)
	case !r.cur.started.Before(t):
		rd = r.cur
	default:
		if r.next == nil {
			r.next = &read{done: make(chan struct{}), deadline: r.clock.Now().Add(r.timeout)}
		}
		rd = r.next
	}
	rd.waiters++
	r.mu.Unlock()

	select {
	case <-rd.done:
		return rd.snap, rd.err
	case <-ctx.Done():
	}
	r.mu.Lock()
	rd.waiters--
	r.mu.Unlock()
	select {
	case <-rd.done: // it ended as we gave up: the answer is there
		return rd.snap, rd.err
	default:
		return nil, fmt.Errorf("wait for a kubelet pods read: %w", context.Cause(ctx))
	}
}

// startLocked makes rd the read in flight and runs it. r.mu is held.
func (r *Reader) startLocked(rd *read) {
	rd.started = r.clock.Now()
	r.cur = rd
	go r.run(rd)
}

// run does one read and hands its result to its waiters, then starts the
// next read if anyone waits for one.
func (r *Reader) run(rd *read) {
	timeout, cause := r.timeout, fmt.Errorf("kubelet pods read took longer than %v: %w", r.timeout, context.DeadlineExceeded)
	if !rd.deadline.IsZero() {
		if left := rd.deadline.Sub(rd.started); left < timeout {
			timeout = left
			cause = fmt.Errorf("kubelet pods read: no answer within %v, after waiting for an earlier read: %w", r.timeout, context.DeadlineExceeded)
		}
	}
	var pods []model.KubeletPod
	var err error
	if timeout <= 0 {
		err = cause
	} else {
		ctx, cancel := context.WithTimeoutCause(context.Background(), timeout, cause)
		pods, err = r.fetch(ctx)
		cancel()
	}
	if r.onRead != nil {
		r.onRead(r.clock.Now().Sub(rd.started), err)
	}

	r.mu.Lock()
	if err != nil {
		rd.err = err
	} else {
		rd.snap = NewPodList(rd.started, pods)
		if r.last == nil || !rd.started.Before(r.last.Started) {
			r.last = rd.snap
		}
	}
	r.cur = nil
	if next := r.next; next != nil {
		r.next = nil
		if next.waiters > 0 {
			r.startLocked(next)
		}
	}
	r.mu.Unlock()
	close(rd.done)
}

// PodList is the result of one /pods read. It is shared by every caller of
// the read and must not be modified.
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
	if s.byKey != nil {
		i, ok := s.byKey[key]
		if !ok {
			return nil, false
		}
		return &s.Pods[i], true
	}
	// A PodList built as a literal (in tests) has no index.
	var found *model.KubeletPod
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.Namespace == key.Namespace && p.Name == key.Name && (found == nil || prefer(p, found)) {
			found = p
		}
	}
	return found, found != nil
}

// prefer reports whether Lookup should answer p rather than q, an earlier
// pod of the same name: unless p is finished and q is not.
func prefer(p, q *model.KubeletPod) bool {
	return !p.Terminal() || q.Terminal()
}
