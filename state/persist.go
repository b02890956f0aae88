package state

import (
	"context"
	"reflect"
	"time"

	"github.com/sirupsen/logrus"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Open returns a store persisted in dir, one file per pod, and loads what an
// earlier run left there. It creates dir if needed and takes its writer
// lock: a second writer process is refused with an error matching
// persist.ErrInUse, unless opts.Wait is set (see Options.Wait). Files that cannot be loaded are set aside into
// <dir>/corrupt and counted, never fatal. Changes are written in the background (package
// state/persist); Close stops the writer and releases the lock.
func Open(dir string, opts Options) (*Store, error) {
	s := New(opts)
	w, loaded, err := persist.Open(dir, persist.Options{Log: s.opts.Log, OnDurable: s.opts.OnDurable, Wait: s.opts.Wait})
	if err != nil {
		return nil, err
	}
	// Records read back are decoded again with the current decoder; those
	// whose devices changed are written back.
	var redecoded []string
	s.mu.Lock()
	for _, r := range loaded {
		if s.adopt(r) {
			redecoded = append(redecoded, r.UID)
		}
	}
	s.mu.Unlock()
	s.p = w
	s.dirty = w.MarkDirty
	for _, uid := range redecoded {
		w.MarkDirty(uid)
	}
	w.Start(s.Get, s.takeOver)
	s.pruneStop, s.pruneDone = make(chan struct{}), make(chan struct{})
	// A removed record outlives its grace period by a tenth of it at most.
	interval := min(max(s.opts.PruneAfter/10, time.Second), time.Minute)
	go func() {
		defer close(s.pruneDone)
		wait.Until(func() {
			if n := s.pruneRemoved(); n > 0 {
				s.opts.Log.WithField("records", n).Debug("pruned removed pods")
			}
		}, interval, s.pruneStop)
	}()
	return s, nil
}

// Writing returns a channel closed once the store writes its directory: at
// once unless Open waited for another writer (Options.Wait), then when that
// writer let go and the store took the directory over. An in-memory store's
// is closed.
func (s *Store) Writing() <-chan struct{} {
	if s.p == nil {
		return closed
	}
	return s.p.Writing()
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// takeOver merges what the previous writer left in the directory, disk,
// into the records of a store that waited for it to let go: ours reports
// whether this store changed a uid since Open. A record this store did not
// change is the previous writer's; a record both changed is merged fact by
// fact (record.Merge), and a record this store deleted (pruned) stays
// deleted; a record the previous writer deleted, which this store did not
// change, goes.
func (s *Store) takeOver(disk []*record.Record, ours func(uid string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	onDisk := make(map[string]bool, len(disk))
	var theirs, merged, gone int
	for _, r := range disk {
		onDisk[r.UID] = true
		cur, have := s.byUID[r.UID]
		write := false // the record differs from its file
		switch {
		case !ours(r.UID):
			if have && reflect.DeepEqual(cur, r) {
				continue // as loaded at Open
			}
			theirs++
		case !have:
			continue // deleted here
		default:
			r = record.Merge(cur, r)
			if reflect.DeepEqual(cur, r) {
				continue
			}
			merged++
			write = true
		}
		if s.adopt(r) || write {
			s.dirty(r.UID)
		}
	}
	for uid := range s.byUID {
		if !onDisk[uid] && !ours(uid) {
			s.delete(uid)
			gone++
		}
	}
	s.opts.Log.WithFields(logrus.Fields{"theirs": theirs, "merged": merged, "deletedByThem": gone}).
		Info("merged the previous writer's records with what this instance learned meanwhile")
}

// Flush returns once every change made before the call is on disk. When a
// write attempted after the call fails, it returns that error (the writer
// keeps retrying); it also returns when ctx is done. On an in-memory store it
// returns nil at once.
func (s *Store) Flush(ctx context.Context) error {
	if s.p == nil {
		return nil
	}
	return s.p.Flush(ctx)
}

// Close writes what is still pending, stops the background writer and
// pruner and releases the directory's lock. Changes made after Close began
// stay in memory only. It returns the error that kept pending changes from
// disk, if any. On an in-memory store it does nothing.
func (s *Store) Close() error {
	if s.p == nil {
		return nil
	}
	s.closeOnce.Do(func() {
		close(s.pruneStop)
		<-s.pruneDone
	})
	return s.p.Close()
}

// Stats are the store's counters, for metrics and `inspect`: the records in
// memory and the writer's counters, which are zero for an in-memory store.
type Stats struct {
	// Records is the number of records in memory.
	Records int
	persist.Stats
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	st := Stats{Records: len(s.byUID)}
	s.mu.RUnlock()
	if s.p != nil {
		st.Stats = s.p.Stats()
	}
	return st
}
