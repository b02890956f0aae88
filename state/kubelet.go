package state

import (
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/decode"
	"github.com/podres-proxy/podres-proxy/state/names"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// What the kubelet reports (/pods, the Pods API watch) becomes records here.

// ObserveKubeletPods records a complete kubelet pod list taken at asOf
// (when the read started), with the caller's evidence (nil: none): each
// pod's spec and allocator annotations, and which UID each name is now
// (Live, Current, Named). Pods new to the store are recorded as pending;
// pending pods that the list no longer has are removed. Sandbox state is
// left to the runtime sources.
func (s *Store) ObserveKubeletPods(asOf time.Time, evidence names.Evidence, pods []model.KubeletPod) {
	pre := decode.NewBatch(s.opts.Decoder)
	for i := range pods {
		if p := &pods[i]; p.UID != "" && !p.Terminal() {
			s.predecode(pre, model.PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}, p.Annotations)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	seen := make(map[string]bool, len(pods))
	for i := range pods {
		p := &pods[i]
		if p.UID == "" {
			continue
		}
		seen[p.UID] = true
		s.observeKubeletPod(pre, p, now)
	}
	for uid, r := range s.byUID {
		if r.State == record.PhasePending && !seen[uid] {
			s.setPhase(record.OriginKubelet, uid, record.PhaseRemoved)
		}
	}
	s.setNames(asOf, evidence, pods)
}

// observeKubeletPod records what a kubelet source reported of one pod at
// now, all but the name's UID: see ObserveKubeletPods. Called with mu held.
func (s *Store) observeKubeletPod(pre *decode.Batch, p *model.KubeletPod, now time.Time) {
	s.update(p.UID, func(r *record.Record) bool {
		changed := r.ObserveKubeletPod(p, now)
		if p.Terminal() {
			// The /pods decoder keeps no annotations of a finished pod
			// (see kubeletpods): keep what was seen while it ran.
			return changed
		}
		return pre.FromKubelet(r, p.Annotations, now) || changed
	})
}

// setNames records which UID each name of a complete kubelet list taken at
// asOf is (names.Table.List). It counts as a change (Version, Changed) when
// the table changed, or when the list confirms a live record whose
// containers were stopping (Snapshot.LiveWithoutRead). Called with mu held.
func (s *Store) setNames(asOf time.Time, evidence names.Evidence, pods []model.KubeletPod) {
	taken, changed := s.names.List(asOf, evidence, pods)
	if !taken {
		return
	}
	for _, r := range s.byUID {
		if changed {
			break
		}
		changed = r.Live() && stopping(r)
	}
	if changed {
		s.bump()
	}
}

// noteName records that a source said at now which UID key is
// (names.Table.Note). Called with mu held.
func (s *Store) noteName(key model.PodKey, uid string, now time.Time) {
	if s.names.Note(key, uid, now, s.hasLive) {
		s.bump()
	}
}

// hasLive reports whether a live record of key remains. Called with mu held.
func (s *Store) hasLive(key model.PodKey) bool {
	return slices.ContainsFunc(s.byKey[key], func(uid string) bool { return s.byUID[uid].Live() })
}

// ObserveWatchedPod records one pod the kubelet's Pods API watch reported
// added or modified: its spec and allocator annotations, as a /pods read
// would, and that its name is now this UID (a pod recreated under the same
// name is known by its new UID before its sandbox exists), unless the
// name is a newer pod's.
func (s *Store) ObserveWatchedPod(p model.KubeletPod) {
	if p.UID == "" {
		return
	}
	pre := decode.NewBatch(s.opts.Decoder)
	if !p.Terminal() {
		s.predecode(pre, model.PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}, p.Annotations)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	_, known := s.byUID[p.UID]
	s.observeKubeletPod(pre, &p, now)
	key := model.PodKey{Namespace: p.Namespace, Name: p.Name}
	// A pod takes a name another UID has only when it is new to the
	// store: one already known lost the name to that UID since (the
	// kubelet went on reporting a force-deleted pod's teardown after its
	// successor was created), and is the older.
	if cur, ok := s.names.UID(key); !ok || (cur != p.UID && !p.Terminal() && (cur == "" || !known)) {
		s.noteName(key, p.UID, now)
	}
}

// WatchChanged records that the kubelet's watch synced or dropped: whether
// names are kept current by it changed, and with it what a lookup by name
// may answer (resolve.Query.TablePlan). It counts as a change (Version), so
// that nothing checked against a table of the other state is reused: an
// answer checked while the watch said which pod a name is must be checked
// again once it no longer does.
func (s *Store) WatchChanged() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bump()
}

// WatchedPodDeleted records that the kubelet's Pods API watch no longer
// has a pod: its name is no longer that UID, and a pending record of it
// (no sandbox was ever reported) is removed.
func (s *Store) WatchedPodDeleted(p model.PodRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := model.PodKey{Namespace: p.Namespace, Name: p.Name}
	if uid, _ := s.names.UID(key); uid == p.UID {
		s.noteName(key, "", s.now()) // no pod, until a source says which
	}
	if r, ok := s.byUID[p.UID]; ok && r.State == record.PhasePending {
		s.setPhase(record.OriginKubelet, p.UID, record.PhaseRemoved)
	}
}

// adopt installs a record read back from disk, decoding its annotations
// again with the current decoder. It reports whether that changed what the
// record says, so the file must be written again. Called with mu held.
func (s *Store) adopt(r *record.Record) bool {
	changed := decode.NewBatch(s.opts.Decoder).Redecode(r)
	if changed {
		r.UpdatedAt = s.now()
	}
	s.install(s.byUID[r.UID], r)
	return changed
}

// SetRefused records which of a pod's decoded devices the proxy refused to
// report (nil: none), for `inspect` and for the record file. It reports
// whether that changed the record, so that a caller logs and counts each
// refusal once, not once per query. An unknown uid changes nothing.
func (s *Store) SetRefused(uid string, refused []model.Refused) bool {
	return s.set(uid, func(r *record.Record) bool {
		if len(r.Refused) == 0 && len(refused) == 0 || reflect.DeepEqual(r.Refused, refused) {
			return false
		}
		r.Refused = slices.Clone(refused)
		return true
	})
}

// SetGPUSlots records the slots a pod is reported with on the GPUs it
// shares (Record.GPUSlots; nil: none), so that a restarted daemon gives it
// the same ones. It reports whether that changed the record. An unknown
// uid changes nothing.
func (s *Store) SetGPUSlots(uid string, slots map[string]int) bool {
	return s.set(uid, func(r *record.Record) bool {
		if maps.Equal(r.GPUSlots, slots) {
			return false
		}
		r.GPUSlots = maps.Clone(slots)
		return true
	})
}

// set is update of a record that exists, with the store's lock taken.
func (s *Store) set(uid string, fn func(r *record.Record) bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byUID[uid]; !ok {
		return false
	}
	return s.update(uid, fn)
}

// predecode decodes the relevant annotations of a pod into pre before the
// store's lock is taken (decode.Batch.Foresee).
func (s *Store) predecode(pre *decode.Batch, ref model.PodRef, all map[string]string) {
	s.mu.RLock()
	r := s.byUID[ref.UID]
	s.mu.RUnlock()
	pre.Foresee(ref, all, r)
}
