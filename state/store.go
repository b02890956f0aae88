// Package state is podres-proxy's record of the pods on this node: one
// record.Record per pod UID, fed by the NRI plugin, the CRI reconciler and the
// proxy's /pods reads, and answered from memory. Records are persisted one
// JSON file per pod so that operators can read them and a restarted daemon
// keeps answering running pods while the kubelet's /pods is unreachable.
//
// Open persists a store in a state directory (docs/state-format.md);
// New keeps it in memory only. A record and its file format are package
// state/record's, the directory and its background writer state/persist's,
// what allocation annotations do to a record state/decode's, and which pod
// a name is state/names': this package is the records in memory, indexed,
// and each source's reports applied to them under one lock.
//
// Records handed out are immutable snapshots: every change builds a new
// Record, so readers (the proxy's hot path) take a read lock for a map lookup
// and never copy.
package state

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/utils/clock"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/decode"
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Options configure a Store.
type Options struct {
	// Decoder decodes allocator annotations; nil keeps no annotations.
	Decoder decode.Decoder
	// Clock stamps the records (in UTC, so that record files read the
	// same whatever the node's zone); nil means the real clock.
	Clock clock.PassiveClock
	// PruneAfter is how long a removed record is kept; 0 means
	// DefaultPruneAfter.
	PruneAfter time.Duration
	// Log receives what the persistence layer has to say about files it set
	// aside and writes that failed; nil means logrus.StandardLogger().
	Log logrus.FieldLogger
	// OnDurable, when set on a store opened on a directory, is called from
	// the background writer for every record file written or removed, with
	// the time from the record's first change that was not yet on disk to
	// the moment it became durable. It must return quickly.
	OnDurable func(latency time.Duration)
	// Wait makes Open wait for a directory that another process writes
	// (the old instance of a rolling update) instead of refusing it: the
	// store answers from the records that process wrote, learns in memory,
	// and writes nothing until that process lets go; it then merges what
	// is on disk with what it learned and becomes the writer (Writing).
	Wait bool
}

// DefaultPruneAfter is how long removed pods stay visible to `inspect`.
const DefaultPruneAfter = 5 * time.Minute

// Store holds the records. Its methods are safe for concurrent use and never
// block on disk: persistence, when the store was opened on a directory,
// happens in the background.
type Store struct {
	opts Options

	mu sync.RWMutex
	index
	bySandbox map[string]string // sandbox id -> uid

	// version counts changes to the records: it moves whenever a record is
	// installed or deleted, so that readers can tell, without comparing
	// records, that nothing they derived an answer from has changed.
	version atomic.Uint64
	// changed is closed, and replaced, whenever version moves (Changed).
	// Read and replaced with mu held.
	changed chan struct{}

	// dirty is told about every changed or deleted uid; the persister
	// installs it. Called with mu held, so it must not block.
	dirty func(uid string)

	// p persists the records; nil for an in-memory store.
	p *persist.Writer
	// pruneStop stops the pruner of a store opened on a directory, which
	// closes pruneDone when it has stopped.
	pruneStop, pruneDone chan struct{}
	closeOnce            sync.Once
}

// New returns an in-memory store.
func New(opts Options) *Store {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.PruneAfter == 0 {
		opts.PruneAfter = DefaultPruneAfter
	}
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	return &Store{
		opts: opts,
		index: index{
			byUID: map[string]*record.Record{},
			byKey: map[model.PodKey][]string{},
		},
		bySandbox: map[string]string{},
		dirty:     func(string) {},
		changed:   make(chan struct{}),
	}
}

// Get returns the record of a pod UID.
func (s *Store) Get(uid string) (*record.Record, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.get(uid)
}

// KubeletNamed returns the record of the UID the kubelet's freshest list or
// watch gives a name now (Snapshot.KubeletNamed), without a snapshot's copy.
func (s *Store) KubeletNamed(key model.PodKey) (*record.Record, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.kubeletNamed(key)
}

// Snapshot returns the records and the kubelet's names as they are now, at
// Version: an immutable copy that answers every lookup as the store did at
// that moment, however it changes afterwards. Whatever is derived from one
// snapshot (the plans of package proxy/plans) is consistent with it.
func (s *Store) Snapshot() *Snapshot {
	s.mu.RLock()
	defer s.mu.RUnlock()
	x := index{
		byUID: maps.Clone(s.byUID),
		byKey: make(map[model.PodKey][]string, len(s.byKey)),
		names: s.names.Clone(),
	}
	for k, uids := range s.byKey {
		x.byKey[k] = slices.Clone(uids) // unindexKey edits them in place
	}
	return &Snapshot{index: x, version: s.version.Load()}
}

// Version returns a number that changes whenever any record is added,
// replaced or deleted. Two equal versions mean every lookup (Get, Records,
// a Snapshot's) answers the same in between.
func (s *Store) Version() uint64 { return s.version.Load() }

// Changed returns a channel that is closed at the next change of any
// record, so that a background loop (the spec reader) can wait for the
// store to change instead of polling it.
func (s *Store) Changed() <-chan struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.changed
}

// bump marks a change: the version moves and Changed's waiters wake. Called
// with mu held.
func (s *Store) bump() {
	s.version.Add(1)
	close(s.changed)
	s.changed = make(chan struct{})
}

// Records returns every record, sorted by namespace, name and UID.
func (s *Store) Records() []*record.Record {
	s.mu.RLock()
	out := slices.Collect(maps.Values(s.byUID))
	s.mu.RUnlock()
	record.Sort(out)
	return out
}

// pruneRemoved deletes removed records whose grace period is over and returns how
// many it deleted.
func (s *Store) pruneRemoved() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	cutoff := s.now().Add(-s.opts.PruneAfter)
	n := 0
	for uid, r := range s.byUID {
		if r.State != record.PhaseRemoved {
			continue
		}
		at := r.UpdatedAt // a hand-edited file may lack removedAt
		if r.RemovedAt != nil {
			at = *r.RemovedAt
		}
		if !at.After(cutoff) {
			s.delete(uid)
			n++
		}
	}
	return n
}

// update applies fn to a copy of the record of uid (a new, empty record if
// there is none) and installs the copy if fn reports a change. fn may modify
// Containers in place (it is copied) but must replace, not modify, the other
// slices and maps. It reports whether fn changed the record. Called with mu
// held.
func (s *Store) update(uid string, fn func(r *record.Record) bool) bool {
	old := s.byUID[uid]
	var r record.Record
	if old != nil {
		r = *old
		r.Containers = slices.Clone(old.Containers)
	} else {
		r = record.Record{SchemaVersion: record.SchemaVersion, UID: uid}
	}
	if !fn(&r) {
		return false
	}
	r.UpdatedAt = s.now()
	s.install(old, &r)
	s.dirty(uid)
	return true
}

// install replaces old (may be nil) with r in the indexes. Called with mu held.
func (s *Store) install(old, r *record.Record) {
	if old != nil {
		if old.Key() != r.Key() {
			s.unindexKey(old.Key(), old.UID)
		}
		if old.SandboxID != r.SandboxID && s.bySandbox[old.SandboxID] == old.UID {
			delete(s.bySandbox, old.SandboxID)
		}
	}
	if old == nil || old.Key() != r.Key() {
		s.byKey[r.Key()] = append(s.byKey[r.Key()], r.UID)
	}
	if r.SandboxID != "" {
		s.bySandbox[r.SandboxID] = r.UID
	}
	s.byUID[r.UID] = r
	s.bump()
}

func (s *Store) delete(uid string) {
	r, ok := s.byUID[uid]
	if !ok {
		return
	}
	delete(s.byUID, uid)
	s.bump()
	s.unindexKey(r.Key(), uid)
	if s.bySandbox[r.SandboxID] == uid {
		delete(s.bySandbox, r.SandboxID)
	}
	s.dirty(uid)
}

func (s *Store) unindexKey(k model.PodKey, uid string) {
	uids := slices.DeleteFunc(s.byKey[k], func(u string) bool { return u == uid })
	if len(uids) == 0 {
		delete(s.byKey, k)
	} else {
		s.byKey[k] = uids
	}
}

// now is the time the records are stamped with.
func (s *Store) now() time.Time { return s.opts.Clock.Now().UTC() }
