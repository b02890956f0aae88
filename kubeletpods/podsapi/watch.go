package podsapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"
)

// initializingBound caps the backoff while the kubelet initializes, in
// Options.Backoff Durations (see Run): 2 s by default.
const initializingBound = 4

// Run watches the kubelet's pods until ctx ends, watching again whenever
// the watch fails or the kubelet ends it. It returns nil when ctx ends,
// and an error only if the Source is already running.
//
//   - A watch that had synced and ended (the kubelet dropped a watcher that
//     fell 100 events behind, or is shutting down) is followed at once by
//     the next, as client-go's reflector relists at once: until its relist
//     the view misses what happens, and every fresh read costs a ListPods.
//   - Attempts that fail to sync (no socket: a kubelet without the PodsAPI
//     gate, or one restarting) wait Options.Backoff, growing to its Cap.
//   - Attempts the kubelet refuses with FailedPrecondition ("Kubelet is
//     initializing": v1.37, after every start until its pod sources are
//     ready) wait the backoff growing to initializingBound times its
//     Duration, no more: the kubelet is up and seconds from serving, and a
//     grown backoff would leave reads on /pods long after it serves.
//
// The backoff starts again whenever attempts stop ending alike, and each
// run of like attempts is logged at info once, then at debug: a kubelet
// without the PodsAPI gate never serves the socket, and must cost one line,
// not one every 30 s forever.
func (s *Source) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("kubelet Pods API source for %s: already running", s.socket)
	}
	defer s.running.Store(false)
	var (
		bo       wait.Backoff
		attempts int  // in a row that failed to sync alike
		wasInit  bool // they were refused as initializing
	)
	for {
		synced, err := s.watch(ctx)
		s.mu.Lock()
		s.synced = false
		s.mu.Unlock()
		if synced {
			s.emit(Event{Type: Unsynced})
		}
		if ctx.Err() != nil {
			return nil
		}
		s.metrics.PodsAPIReconnect(err)
		if synced {
			attempts = 0
			s.log.WithError(err).Info("Kubelet Pods API watch ended; watching again at once")
			continue
		}
		init := status.Code(err) == codes.FailedPrecondition
		if attempts == 0 || init != wasInit {
			bo, attempts, wasInit = s.backoff, 0, init
			if init {
				bo.Cap = min(bo.Cap, initializingBound*bo.Duration)
			}
		}
		attempts++
		delay := bo.Step()
		log := s.log.WithError(err).WithField("retryIn", delay.Round(time.Millisecond))
		if init {
			s.metrics.PodsAPIInitializing()
		}
		switch {
		case init && attempts == 1:
			log.Info("Kubelet Pods API: the kubelet is initializing; pods are read from /pods until it serves them")
		case init:
			log.Debug("Kubelet Pods API: the kubelet is still initializing")
		case attempts == 1:
			log.Info("Kubelet Pods API watch failed; watching again")
		default:
			log.WithField("attempts", attempts).Debug("Kubelet Pods API watch failed again")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay): // collected when unreferenced (Go 1.23)
		}
	}
}

// watch runs one WatchPods stream until it ends, and reports whether it
// reached INITIAL_SYNC_COMPLETE.
//
// The kubelet registers the watcher, sends ADDED for every pod it has,
// then INITIAL_SYNC_COMPLETE, then the events since registration: those
// can repeat what the list already showed (ADDED for a listed pod, DELETED
// for a pod the list no longer had), which put and remove take in their
// stride, and can briefly bring back an older version of a pod than the
// list showed; the last of them is the newest, so the view ends right.
func (s *Source) watch(ctx context.Context) (synced bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream
	start := time.Now()
	stream, err := s.client.WatchPods(ctx, &podsv1alpha1.WatchPodsRequest{})
	if err != nil {
		return false, fmt.Errorf("call WatchPods: %w", err)
	}
	listed := make(map[string]struct{}) // the relist's UIDs, until it is complete
	for {
		ev, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// The kubelet ends a watch it drops (its queue of 100
				// events for the watcher is full) or closes at shutdown
				// with ResourceExhausted; a stream ended without a
				// status is the same to the source.
				err = errors.New("the kubelet ended the stream")
			}
			return synced, fmt.Errorf("receive from WatchPods: %w", err)
		}
		s.metrics.PodsAPIEvent(ev.GetType().String())
		switch ev.GetType() {
		case podsv1alpha1.EventType_ADDED, podsv1alpha1.EventType_MODIFIED:
			uid := s.apply(ev.GetPod())
			if !synced && uid != "" {
				listed[uid] = struct{}{}
			}
		case podsv1alpha1.EventType_DELETED:
			// Only the identity is guaranteed in a DELETED pod.
			id := scanIdentity(ev.GetPod())
			if id.UID == "" {
				s.log.WithField("pod", podRef(&id)).Warn("Kubelet Pods API: DELETED event without a pod UID, ignored")
				continue
			}
			delete(listed, id.UID)
			s.mu.Lock()
			e := s.view.remove(id.UID)
			s.mu.Unlock()
			if e != nil {
				s.emit(Event{Type: PodDeleted, Pod: e.d.pod})
			}
		case podsv1alpha1.EventType_INITIAL_SYNC_COMPLETE:
			if synced {
				continue // one per stream; a second one is not a relist
			}
			s.completeRelist(listed, start)
			synced, listed = true, nil
		default:
			s.log.WithField("type", ev.GetType().String()).Debug("Kubelet Pods API: event of an unknown type, ignored")
		}
	}
}

// apply reads one ADDED or MODIFIED pod into the view and tells the
// handler. It returns the pod's UID, or "" when none could be read.
func (s *Source) apply(data []byte) string {
	d, err := s.dec.decode(data)
	if err != nil {
		err = fmt.Errorf("kubelet Pods API: pod %s refused: %w", podRef(&d.pod), err)
		s.mu.Lock()
		news := s.view.refuse(d.pod, err)
		s.mu.Unlock()
		if news {
			s.log.WithError(err).Warn("Kubelet Pods API: pod refused; its name is unknown until it is read again")
			s.emit(Event{Type: PodRefused, Pod: d.pod, Err: err})
		}
		return d.pod.UID
	}
	s.mu.Lock()
	t := s.view.put(d)
	s.mu.Unlock()
	if t != "" {
		s.emit(Event{Type: t, Pod: d.pod})
	}
	return d.pod.UID
}

// completeRelist removes the pods the relist did not list, marks the view
// synced, and tells Metrics and then the handler.
func (s *Source) completeRelist(listed map[string]struct{}, start time.Time) {
	s.mu.Lock()
	var gone []*entry
	for uid := range s.view.byUID {
		if _, ok := listed[uid]; !ok {
			gone = append(gone, s.view.remove(uid))
		}
	}
	s.synced = true
	s.mu.Unlock()
	s.metrics.PodsAPIRelisted(len(listed), len(gone), time.Since(start))
	slices.SortFunc(gone, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	for _, e := range gone {
		s.emit(Event{Type: PodDeleted, Pod: e.d.pod, ByRelist: true})
	}
	s.emit(Event{Type: Synced})
}

func (s *Source) emit(ev Event) {
	if s.handler != nil {
		s.handler(ev)
	}
}
