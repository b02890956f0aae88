// Package state is podres-proxy's record of the pods on this node: one
// Record per pod UID, fed by the NRI plugin, the CRI reconciler and the
// proxy's /pods reads, and answered from memory. Records are persisted one
// JSON file per pod so that operators can read them and a restarted daemon
// keeps answering running pods while the kubelet's /pods is unreachable.
//
// Open persists a store in a state directory (docs/state-format.md describes
// its layout and file format for operators); New keeps it in memory only.
//
// Records handed out are immutable snapshots: every change builds a new
// Record, so readers (the proxy's hot path) take a read lock for a map lookup
// and never copy.
package state

import (
	"maps"
	"reflect"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
)

// Decoder turns a pod's annotations into devices. The proxy's allocator set
// implements it; the store calls it whenever a pod's allocator annotations
// change, whichever source they came from, so NRI, CRI and /pods agree.
type Decoder interface {
	// Relevant reports whether some allocator decodes the annotation key.
	// Only relevant annotations are kept in records.
	Relevant(key string) bool
	// Decode returns the devices the annotations allocate. Errors describe
	// annotations that could not be understood; the devices of the others
	// are still returned.
	Decode(pod PodRef, annotations map[string]string) ([]Device, []error)
}

// Options configure a Store.
type Options struct {
	// Decoder decodes allocator annotations; nil keeps no annotations.
	Decoder Decoder
	// Now is the clock of the records' timestamps; nil means time.Now in
	// UTC.
	Now func() time.Time
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
}

// DefaultPruneAfter is how long removed pods stay visible to `inspect`.
const DefaultPruneAfter = 5 * time.Minute

// Store holds the records. Its methods are safe for concurrent use and never
// block on disk: persistence, when the store was opened on a directory,
// happens in the background.
type Store struct {
	opts Options

	mu        sync.RWMutex
	byUID     map[string]*Record
	byKey     map[PodKey][]string // uids, usually one
	bySandbox map[string]string   // sandbox id -> uid

	// version counts changes to the records: it moves whenever a record is
	// installed or deleted, so that readers can tell, without comparing
	// records, that nothing they derived an answer from has changed.
	version atomic.Uint64

	// dirty is told about every changed or deleted uid; the persister
	// installs it. Called with mu held, so it must not block.
	dirty func(uid string)

	// p persists the records; nil for an in-memory store.
	p *persister

	// pre holds the annotations decoded for the call that holds mu; nil
	// otherwise. Set and read with mu held.
	pre predecoded

	// decodedUnderLock counts decodings done with mu held (see
	// predecode), for tests.
	decodedUnderLock int
}

// New returns an in-memory store.
func New(opts Options) *Store {
	if opts.Now == nil {
		// UTC, so that record files read the same whatever the node's zone.
		opts.Now = func() time.Time { return time.Now().UTC() }
	}
	if opts.PruneAfter == 0 {
		opts.PruneAfter = DefaultPruneAfter
	}
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	return &Store{
		opts:      opts,
		byUID:     map[string]*Record{},
		byKey:     map[PodKey][]string{},
		bySandbox: map[string]string{},
		dirty:     func(string) {},
	}
}

// Get returns the record of a pod UID.
func (s *Store) Get(uid string) (*Record, bool) {
	s.mu.RLock()
	r, ok := s.byUID[uid]
	s.mu.RUnlock()
	return r, ok
}

// Live returns the one live record (a running sandbox reported by NRI or
// CRI) of a pod name. It returns false when there is none, or when two live
// sandboxes share the name (a pod being recreated): the caller must then ask
// the kubelet which one is current.
func (s *Store) Live(key PodKey) (*Record, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var live *Record
	for _, uid := range s.byKey[key] {
		r := s.byUID[uid]
		if !r.Live() {
			continue
		}
		if live != nil {
			return nil, false
		}
		live = r
	}
	return live, live != nil
}

// ByName returns every record of a pod name, newest update first.
func (s *Store) ByName(key PodKey) []*Record {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Record, 0, len(s.byKey[key]))
	for _, uid := range s.byKey[key] {
		out = append(out, s.byUID[uid])
	}
	sort.Slice(out, func(i, j int) bool { return out[i].UpdatedAt.After(out[j].UpdatedAt) })
	return out
}

// Version returns a number that changes whenever any record is added,
// replaced or deleted. Two equal versions mean every lookup (Get, Live,
// ByName, Records) answers the same in between.
func (s *Store) Version() uint64 { return s.version.Load() }

// Len returns how many records the store holds.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.byUID)
}

// Records returns every record, sorted by namespace, name and UID.
func (s *Store) Records() []*Record {
	s.mu.RLock()
	out := make([]*Record, 0, len(s.byUID))
	for _, r := range s.byUID {
		out = append(out, r)
	}
	s.mu.RUnlock()
	SortRecords(out)
	return out
}

// SortRecords sorts records by namespace, name and UID.
func SortRecords(rs []*Record) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UID < b.UID
	})
}

// ObserveSandbox records a sandbox the runtime reported (NRI RunPodSandbox,
// Synchronize, CRI ListPodSandbox). It creates the record if the UID is new.
func (s *Store) ObserveSandbox(src Source, sb Sandbox) {
	pre := predecoded{}
	s.predecode(pre, PodRef{UID: sb.UID, Namespace: sb.Namespace, Name: sb.Name}, sb.Annotations)
	s.lock(pre)
	defer s.unlock()
	s.observeSandbox(src, sb)
}

// lock takes the write lock with pre, the annotations decoded for this call.
func (s *Store) lock(pre predecoded) {
	s.mu.Lock()
	s.pre = pre
}

func (s *Store) unlock() {
	s.pre = nil
	s.mu.Unlock()
}

func (s *Store) observeSandbox(src Source, sb Sandbox) {
	uid := sb.UID
	if uid == "" {
		uid = s.bySandbox[sb.ID]
	}
	if uid == "" {
		return // nothing to key it by; the reconciler will bring it
	}
	now := s.opts.Now()
	s.update(uid, func(r *Record) bool {
		changed := false
		if r.Namespace == "" && sb.Namespace != "" {
			r.Namespace, r.Name = sb.Namespace, sb.Name
			changed = true
		}
		phase := PhaseStopped
		if sb.Ready {
			phase = PhaseReady
		}
		if r.SandboxID != sb.ID && sb.ID != "" {
			if r.SandboxID != "" && phase == PhaseStopped && r.State == PhaseReady {
				// An old, stopped sandbox of a pod whose new sandbox is
				// already running: it says nothing about the pod now.
				return false
			}
			if r.SandboxID != "" {
				r.Containers = nil // the containers of the old sandbox are gone
			}
			r.SandboxID = sb.ID
			changed = true
		}
		if r.State != phase {
			r.State, r.RemovedAt = phase, nil
			changed = true
		}
		// Provenance says who told us a fact and when it last changed, not
		// who confirmed it last: a CRI reconcile agreeing with what NRI
		// reported changes nothing, and rewrites no file.
		if r.Sources.Sandbox == nil || changed {
			r.Sources.Sandbox = &Seen{Source: src, At: now}
			changed = true
		}
		if s.setAnnotations(r, sb.Annotations, src, now, false) {
			changed = true
		}
		return changed
	})
}

// SandboxStopped records that a sandbox stopped (NRI StopPodSandbox). The
// sandbox is found by id, or by uid when the event carried no id.
func (s *Store) SandboxStopped(src Source, sandboxID, uid string) {
	s.setSandboxPhase(src, sandboxID, uid, PhaseStopped)
}

// SandboxRemoved records that a sandbox is gone (NRI RemovePodSandbox).
func (s *Store) SandboxRemoved(src Source, sandboxID, uid string) {
	s.setSandboxPhase(src, sandboxID, uid, PhaseRemoved)
}

func (s *Store) setSandboxPhase(src Source, sandboxID, uid string, phase Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.bySandbox[sandboxID]; ok && sandboxID != "" {
		uid = id
	} else if r, ok := s.byUID[uid]; !ok || (sandboxID != "" && r.SandboxID != sandboxID) {
		return // an event for a sandbox we never knew, or an older sandbox
	}
	s.setPhase(src, uid, phase)
}

func (s *Store) setPhase(src Source, uid string, phase Phase) {
	now := s.opts.Now()
	s.update(uid, func(r *Record) bool {
		if r.State == phase || r.State == PhaseRemoved {
			return false
		}
		r.State = phase
		r.Sources.Sandbox = &Seen{Source: src, At: now}
		if phase == PhaseRemoved {
			r.RemovedAt = &now
			for i := range r.Containers {
				r.Containers[i].State = ContainerRemoved
			}
		}
		return true
	})
}

// ObserveContainer records a container the runtime reported.
func (s *Store) ObserveContainer(src Source, c RuntimeContainer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observeContainer(src, c)
}

func (s *Store) observeContainer(src Source, c RuntimeContainer) {
	uid, ok := s.bySandbox[c.SandboxID]
	if !ok || c.ID == "" {
		return
	}
	now := s.opts.Now()
	s.update(uid, func(r *Record) bool {
		if r.SandboxID != c.SandboxID {
			return false
		}
		i := slices.IndexFunc(r.Containers, func(x Container) bool { return x.ID == c.ID })
		if i < 0 && c.State == ContainerRemoved {
			return false // removal of a container we never knew: nothing to record
		}
		if i < 0 {
			r.Containers = append(r.Containers, Container{Name: c.Name, ID: c.ID, State: c.State})
		} else {
			old := r.Containers[i]
			if old.State == c.State || old.State == ContainerRemoved ||
				(c.State == ContainerUnknown && old.State == ContainerStopped) {
				return false
			}
			r.Containers[i].State = c.State
			if c.Name != "" {
				r.Containers[i].Name = c.Name
			}
		}
		r.Sources.Containers = &Seen{Source: src, At: now}
		return true
	})
}

// ContainerRemoved records that a container is gone.
func (s *Store) ContainerRemoved(src Source, sandboxID, containerID string) {
	s.ObserveContainer(src, RuntimeContainer{ID: containerID, SandboxID: sandboxID, State: ContainerRemoved})
}

// Reconcile applies a full snapshot of the runtime (NRI Synchronize, CRI
// list) taken at asOf: listed sandboxes and containers are recorded,
// sandboxes recorded earlier and not listed are removed. Containers of listed
// sandboxes that are not listed are marked stopped when exitedListed is false
// (NRI leaves exited containers out) and removed when it is true (CRI lists
// exited ones). A record whose sandbox or containers changed after asOf is
// newer than the snapshot and keeps what it knows.
func (s *Store) Reconcile(src Source, asOf time.Time, sandboxes []Sandbox, containers []RuntimeContainer, exitedListed bool) {
	pre := predecoded{}
	for _, sb := range sandboxes {
		s.predecode(pre, PodRef{UID: sb.UID, Namespace: sb.Namespace, Name: sb.Name}, sb.Annotations)
	}
	s.lock(pre)
	defer s.unlock()
	// Decide which records are newer than the snapshot before applying any
	// of it: what the snapshot itself changes below is stamped now, which is
	// after asOf too, and must not make the rest of the snapshot skip them.
	newer := func(seen *Seen) bool { return seen != nil && seen.At.After(asOf) }
	sandboxNewer := map[string]bool{}
	containersNewer := map[string]bool{}
	for uid, r := range s.byUID {
		if newer(r.Sources.Sandbox) {
			sandboxNewer[uid] = true
		}
		if newer(r.Sources.Containers) {
			containersNewer[uid] = true
		}
	}
	listed := make(map[string]bool, len(sandboxes))
	for _, sb := range sandboxes {
		listed[sb.ID] = true
		uid := sb.UID
		if uid == "" {
			uid = s.bySandbox[sb.ID]
		}
		if sandboxNewer[uid] {
			continue
		}
		s.observeSandbox(src, sb)
	}
	ctrs := make(map[string]bool, len(containers))
	for _, c := range containers {
		ctrs[c.ID] = true
		if uid, ok := s.bySandbox[c.SandboxID]; ok && containersNewer[uid] {
			continue
		}
		s.observeContainer(src, c)
	}
	now := s.opts.Now()
	gone := ContainerStopped
	if exitedListed {
		gone = ContainerRemoved
	}
	for uid, r := range s.byUID {
		if r.SandboxID == "" || r.State == PhaseRemoved || sandboxNewer[uid] {
			continue
		}
		if !listed[r.SandboxID] {
			s.setPhase(src, uid, PhaseRemoved)
			continue
		}
		if containersNewer[uid] {
			continue
		}
		s.update(uid, func(r *Record) bool {
			changed := false
			for i, c := range r.Containers {
				if ctrs[c.ID] || c.State == ContainerRemoved || c.State == gone {
					continue
				}
				r.Containers[i].State = gone
				changed = true
			}
			if changed {
				r.Sources.Containers = &Seen{Source: src, At: now}
			}
			return changed
		})
	}
}

// ObserveKubeletPods records a complete /pods answer: each pod's spec and
// allocator annotations. Pods new to the store are recorded as pending;
// pending pods that /pods no longer lists are removed. Sandbox state is left
// to the runtime sources.
func (s *Store) ObserveKubeletPods(pods []KubeletPod) {
	pre := predecoded{}
	for i := range pods {
		if p := &pods[i]; p.UID != "" && !p.Terminal() {
			s.predecode(pre, PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}, p.Annotations)
		}
	}
	s.lock(pre)
	defer s.unlock()
	now := s.opts.Now()
	seen := make(map[string]bool, len(pods))
	for i := range pods {
		p := &pods[i]
		if p.UID == "" {
			continue
		}
		seen[p.UID] = true
		s.update(p.UID, func(r *Record) bool {
			changed := false
			if r.Namespace == "" {
				r.Namespace, r.Name = p.Namespace, p.Name
				changed = true
			}
			if r.State == "" || (r.State == PhaseRemoved && r.SandboxID == "" && !p.Terminal()) {
				// New, or a pending pod that an earlier read (one that
				// started before the pod appeared) left out: it exists.
				r.State, r.RemovedAt = PhasePending, nil
				changed = true
			}
			if r.KubeletPhase != p.Phase {
				r.KubeletPhase = p.Phase
				changed = true
			}
			if p.Terminal() {
				// The /pods decoder keeps no spec or annotations of a
				// finished pod (see kubeletpods): keep what was seen while
				// it ran.
				return changed
			}
			if r.Spec == nil || !sameSpec(r.Spec, &p.Spec) {
				spec := p.Spec
				r.Spec = &spec
				r.Sources.Spec = &Seen{Source: SourceKubelet, At: now}
				changed = true
			}
			if seen := r.Sources.Annotations; seen != nil && seen.Source != SourceKubelet && s.opts.Decoder != nil {
				// The runtime's copy (NRI, CRI) is the allocation the sandbox
				// started with, and it stays: an edit in the API changes
				// nothing, and is recorded. A key the runtime's copy did not
				// have is taken only when the sandbox started with an
				// allocation (HAMi's device plugin writes its MIG instances
				// after the sandbox started), keeping the copy's source and
				// time, which say since when the pod holds its devices; a pod
				// that started with none gets none later.
				fixed, edited := fixAnnotations(r.Annotations, s.relevant(p.Annotations))
				if s.setAnnotations(r, fixed, seen.Source, seen.At, false) {
					changed = true
				}
				if !slices.Equal(r.Edited, edited) {
					r.Edited = edited
					changed = true
				}
				return changed
			}
			if s.setAnnotations(r, p.Annotations, SourceKubelet, now, false) {
				changed = true
			}
			return changed
		})
	}
	for uid, r := range s.byUID {
		if r.State == PhasePending && !seen[uid] {
			s.setPhase(SourceKubelet, uid, PhaseRemoved)
		}
	}
}

// fixAnnotations returns the allocation annotations of a pod whose sandbox
// started with runtime, given what the API says now: runtime's values, plus
// the keys only the API has when runtime had any; and, sorted, the keys
// whose API value differs from runtime's, that the API dropped, or that it
// added to a pod that started with none.
func fixAnnotations(runtime, api map[string]string) (fixed map[string]string, edited []string) {
	fixed = maps.Clone(runtime)
	if fixed == nil {
		fixed = map[string]string{}
	}
	for k, v := range api {
		old, ok := runtime[k]
		switch {
		case !ok && len(runtime) > 0:
			fixed[k] = v
		case !ok || old != v:
			edited = append(edited, k)
		}
	}
	for k := range runtime {
		if _, ok := api[k]; !ok {
			edited = append(edited, k)
		}
	}
	slices.Sort(edited)
	return fixed, edited
}

// sameSpec compares pod specs the way they mean, not the way they were
// built: a nil and an empty list or map are the same (a spec read back from
// its file has no empty maps).
func sameSpec(a, b *PodSpec) bool {
	return a.SchedulerName == b.SchedulerName && slices.EqualFunc(a.Containers, b.Containers, func(x, y ContainerSpec) bool {
		return x.Name == y.Name && x.Kind == y.Kind && maps.Equal(x.Requests, y.Requests)
	})
}

// setAnnotations keeps the relevant annotations and re-decodes devices when
// they changed, or always when force is set (a record read back from disk is
// decoded again because the allocator configuration may have changed). It
// reports whether it decoded.
func (s *Store) setAnnotations(r *Record, all map[string]string, src Source, now time.Time, force bool) bool {
	if s.opts.Decoder == nil {
		return false
	}
	rel := s.relevant(all)
	if !force && r.Sources.Annotations != nil && maps.Equal(rel, r.Annotations) {
		if seen := r.Sources.Annotations; seen.Source == SourceKubelet && src != SourceKubelet {
			// The runtime started the sandbox with what /pods said: from
			// now on the runtime's copy is the allocation, fixed (see
			// ObserveKubeletPods), held since it was first seen.
			r.Sources.Annotations = &Seen{Source: src, At: seen.At}
			return true
		}
		return false
	}
	r.Annotations = rel
	if d, ok := s.pre.lookup(rel); ok {
		r.Devices, r.DecodeErrors = d.devs, d.errs
	} else if len(rel) == 0 {
		r.Devices, r.DecodeErrors = nil, nil
	} else {
		// Not decoded beforehand: adopt at Open, or annotations that
		// changed between predecode's look and the lock.
		s.decodedUnderLock++
		r.Devices, r.DecodeErrors = s.decode(r, rel)
	}
	r.Sources.Annotations = &Seen{Source: src, At: now}
	return true
}

// adopt installs a record read back from disk, decoding its annotations
// again with the current decoder. It reports whether that changed what the
// record says, so the file must be written again. Called with mu held.
func (s *Store) adopt(r *Record) bool {
	changed := false
	if seen := r.Sources.Annotations; seen != nil {
		ann, devs, errs := r.Annotations, r.Devices, r.DecodeErrors
		if s.setAnnotations(r, r.Annotations, seen.Source, seen.At, true) {
			changed = !maps.Equal(ann, r.Annotations) || !sameOrEmpty(devs, r.Devices) || !sameOrEmpty(errs, r.DecodeErrors)
		}
		if changed {
			r.UpdatedAt = s.opts.Now()
		}
	}
	s.install(s.byUID[r.UID], r)
	return changed
}

// sameOrEmpty is reflect.DeepEqual that does not tell nil from empty.
func sameOrEmpty[T any](a, b []T) bool {
	return len(a) == 0 && len(b) == 0 || reflect.DeepEqual(a, b)
}

func (s *Store) decode(r *Record, ann map[string]string) ([]Device, []string) {
	return s.decodeRef(PodRef{UID: r.UID, Namespace: r.Namespace, Name: r.Name}, ann)
}

func (s *Store) decodeRef(ref PodRef, ann map[string]string) ([]Device, []string) {
	if len(ann) == 0 {
		return nil, nil
	}
	devs, errs := s.opts.Decoder.Decode(ref, ann)
	var msgs []string
	for _, err := range errs {
		msgs = append(msgs, err.Error())
	}
	return devs, msgs
}

// SetRefused records which of a pod's decoded devices the proxy refused to
// report (nil: none), for `inspect` and for the record file. It reports
// whether that changed the record, so that a caller logs and counts each
// refusal once, not once per query. An unknown uid changes nothing.
func (s *Store) SetRefused(uid string, refused []Refused) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byUID[uid]
	if !ok || sameOrEmpty(r.Refused, refused) {
		return false
	}
	changed := false
	s.update(uid, func(r *Record) bool {
		r.Refused = slices.Clone(refused)
		changed = true
		return true
	})
	return changed
}

// Prune deletes removed records whose grace period is over and returns how
// many it deleted.
func (s *Store) Prune() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	cutoff := s.opts.Now().Add(-s.opts.PruneAfter)
	n := 0
	for uid, r := range s.byUID {
		if r.State != PhaseRemoved {
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
// slices and maps. Called with mu held.
func (s *Store) update(uid string, fn func(r *Record) bool) {
	old := s.byUID[uid]
	var r Record
	if old != nil {
		r = *old
		r.Containers = slices.Clone(old.Containers)
	} else {
		r = Record{SchemaVersion: SchemaVersion, UID: uid}
	}
	if !fn(&r) {
		return
	}
	r.UpdatedAt = s.opts.Now()
	s.install(old, &r)
	s.dirty(uid)
}

// install replaces old (may be nil) with r in the indexes. Called with mu held.
func (s *Store) install(old, r *Record) {
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
	s.version.Add(1)
}

func (s *Store) delete(uid string) {
	r, ok := s.byUID[uid]
	if !ok {
		return
	}
	delete(s.byUID, uid)
	s.version.Add(1)
	s.unindexKey(r.Key(), uid)
	if s.bySandbox[r.SandboxID] == uid {
		delete(s.bySandbox, r.SandboxID)
	}
	s.dirty(uid)
}

func (s *Store) unindexKey(k PodKey, uid string) {
	uids := slices.DeleteFunc(s.byKey[k], func(u string) bool { return u == uid })
	if len(uids) == 0 {
		delete(s.byKey, k)
	} else {
		s.byKey[k] = uids
	}
}

// SetGPUSlots records the slots a pod is reported with on the GPUs it
// shares (Record.GPUSlots; nil: none), so that a restarted daemon gives it
// the same ones. It reports whether that changed the record. An unknown
// uid changes nothing.
func (s *Store) SetGPUSlots(uid string, slots map[string]int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byUID[uid]
	if !ok || maps.Equal(r.GPUSlots, slots) {
		return false
	}
	changed := false
	s.update(uid, func(r *Record) bool {
		r.GPUSlots = maps.Clone(slots)
		changed = true
		return true
	})
	return changed
}
