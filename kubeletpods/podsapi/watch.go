package podsapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/podres-proxy/podres-proxy/model"
)

// Run watches the kubelet's pods until ctx ends, watching again whenever
// the watch fails or the kubelet ends it, at the pace pace sets: at once
// after a watch that had synced, with backoff after attempts that fail to
// sync. It returns nil when ctx ends, and an error only if the Source is
// already running.
func (s *Source) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return fmt.Errorf("kubelet Pods API source for %s: already running", s.socket)
	}
	defer s.running.Store(false)
	p := newPace(s)
	for {
		synced, err := s.watch(ctx)
		s.unsync(synced)
		if ctx.Err() != nil {
			return nil
		}
		delay := p.next(synced, err)
		if delay == 0 {
			continue
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// unsync marks the view out of date after a watch ends, telling the
// handler if it had been in sync.
func (s *Source) unsync(wasSynced bool) {
	s.mu.Lock()
	s.synced = false
	s.mu.Unlock()
	if wasSynced {
		s.emit(Event{Type: Unsynced})
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
			s.delete(id.UID)
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
		s.refuse(d.pod, err)
		return d.pod.UID
	}
	s.mu.Lock()
	t := s.view.put(d)
	if t != 0 {
		s.notifyLocked()
	}
	s.mu.Unlock()
	if t != 0 {
		s.emit(Event{Type: t, Pod: d.pod})
	}
	return d.pod.UID
}

func (s *Source) refuse(id model.KubeletPod, err error) {
	err = fmt.Errorf("kubelet Pods API: pod %s refused: %w", podRef(&id), err)
	s.mu.Lock()
	news := s.view.refuse(id, err)
	if news {
		s.notifyLocked()
	}
	s.mu.Unlock()
	if news {
		s.log.WithError(err).Warn("Kubelet Pods API: pod refused; its name is unknown until it is read again")
		s.emit(Event{Type: PodRefused, Pod: id, Err: err})
	}
}

func (s *Source) delete(uid string) {
	s.mu.Lock()
	e := s.view.remove(uid)
	if e != nil {
		s.notifyLocked()
	}
	s.mu.Unlock()
	if e != nil {
		s.emit(Event{Type: PodDeleted, Pod: e.d.pod})
	}
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
	s.notifyLocked()
	s.mu.Unlock()
	s.metrics.PodsAPIRelisted(len(listed), len(gone), time.Since(start))
	slices.SortFunc(gone, func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
	for _, e := range gone {
		s.emit(Event{Type: PodDeleted, Pod: e.d.pod, ByRelist: true})
	}
	s.emit(Event{Type: Synced})
}

// notifyLocked wakes Await's waiters. s.mu is held.
func (s *Source) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Source) emit(ev Event) {
	if s.handler != nil {
		s.handler(ev)
	}
}
