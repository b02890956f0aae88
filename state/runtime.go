package state

import (
	"slices"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/decode"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// What the runtime reports (NRI events, CRI lists) becomes records here:
// sandboxes, their phase and their containers.

// ObserveSandbox records a sandbox the runtime reported beginning (NRI
// RunPodSandbox): its pod is the one its name is now. It creates the record
// if the UID is new. Of the sandbox's annotations it keeps the allocators',
// bounded (decode.Bounded).
func (s *Store) ObserveSandbox(src record.Origin, sb model.Sandbox) {
	sb.Annotations = decode.Bounded(s.opts.Decoder, sb.Annotations)
	pre := decode.NewBatch(s.opts.Decoder)
	s.predecode(pre, model.PodRef{UID: sb.UID, Namespace: sb.Namespace, Name: sb.Name}, sb.Annotations)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observeSandbox(pre, src, sb)
	// A sandbox beginning is the kubelet's word that the name is this pod
	// now (package state/names): it asks for one only for the pod it has
	// under that name, after its predecessor is gone from its pods.
	if r, ok := s.byUID[sb.UID]; ok && sb.UID != "" && sb.Ready && r.SandboxID == sb.ID && r.Live() {
		s.noteName(r.Key(), sb.UID, s.now())
	}
}

func (s *Store) observeSandbox(pre *decode.Batch, src record.Origin, sb model.Sandbox) {
	uid := sb.UID
	if uid == "" {
		uid = s.bySandbox[sb.ID]
	}
	if uid == "" {
		return // nothing to key it by; the reconciler will bring it
	}
	now := s.now()
	s.update(uid, func(r *record.Record) bool {
		before := decode.ContainerAnnotations(r)
		changed, current := r.ObserveSandbox(src, sb, now)
		if !current {
			return false
		}
		took := pre.FromSandbox(r, sb.Annotations, src, now)
		if pre.Containers(r, before) { // a new sandbox: the old one's containers are gone
			return true
		}
		return took || changed
	})
}

// SandboxStopped records that a sandbox stopped (NRI StopPodSandbox). The
// sandbox is found by id, or by uid when the event carried no id.
func (s *Store) SandboxStopped(src record.Origin, sandboxID, uid string) {
	s.setSandboxPhase(src, sandboxID, uid, record.PhaseStopped)
}

// SandboxRemoved records that a sandbox is gone (NRI RemovePodSandbox).
func (s *Store) SandboxRemoved(src record.Origin, sandboxID, uid string) {
	s.setSandboxPhase(src, sandboxID, uid, record.PhaseRemoved)
}

func (s *Store) setSandboxPhase(src record.Origin, sandboxID, uid string, phase record.Phase) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.bySandbox[sandboxID]; ok && sandboxID != "" {
		uid = id
	} else if r, ok := s.byUID[uid]; !ok || (sandboxID != "" && r.SandboxID != sandboxID) {
		return // an event for a sandbox we never knew, or an older sandbox
	}
	s.setPhase(src, uid, phase)
}

func (s *Store) setPhase(src record.Origin, uid string, phase record.Phase) {
	now := s.now()
	s.update(uid, func(r *record.Record) bool { return r.SetPhase(src, phase, now) })
}

// ObserveContainer records a container the runtime reported, with the
// container annotations some allocator reads. A container whose annotations
// say something about the allocation (TensorFusion's MIG partitions) has
// its pod's devices decoded again, the pod's annotations before the lock.
func (s *Store) ObserveContainer(src record.Origin, c model.RuntimeContainer) {
	c.Annotations = decode.RelevantToContainer(s.opts.Decoder, c.Annotations)
	pre := decode.NewBatch(s.opts.Decoder)
	if len(c.Annotations) > 0 {
		s.mu.RLock()
		r := s.byUID[s.bySandbox[c.SandboxID]]
		s.mu.RUnlock()
		// A container's annotations never change: only its first event
		// with them needs the pod's devices decoded again.
		known := r != nil && slices.ContainsFunc(r.Containers, func(x record.Container) bool { return x.ID == c.ID && x.Annotations != nil })
		if r != nil && !known && len(r.Annotations) > 0 {
			pre.Add(model.PodRef{UID: r.UID, Namespace: r.Namespace, Name: r.Name}, r.Annotations)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observeContainer(pre, src, c)
}

func (s *Store) observeContainer(pre *decode.Batch, src record.Origin, c model.RuntimeContainer) {
	uid, ok := s.bySandbox[c.SandboxID]
	if !ok || c.ID == "" {
		return
	}
	c.Annotations = decode.RelevantToContainer(s.opts.Decoder, c.Annotations)
	now := s.now()
	s.update(uid, func(r *record.Record) bool {
		before := decode.ContainerAnnotations(r)
		if !r.ObserveContainer(src, c, now) {
			return false
		}
		pre.Containers(r, before)
		return true
	})
}

// Reconcile applies a full snapshot of the runtime (NRI Synchronize, CRI
// list) taken at asOf: listed sandboxes and containers are recorded,
// sandboxes recorded earlier and not listed are removed. Containers of listed
// sandboxes that are not listed are marked stopped when exitedListed is false
// (NRI leaves exited containers out) and removed when it is true (CRI lists
// exited ones). A record whose sandbox or containers changed after asOf is
// newer than the snapshot and keeps what it knows. Sandbox annotations are
// kept as ObserveSandbox keeps them.
func (s *Store) Reconcile(src record.Origin, asOf time.Time, sandboxes []model.Sandbox, containers []model.RuntimeContainer, exitedListed bool) {
	sandboxes = slices.Clone(sandboxes) // the caller's stay as they were
	pre := decode.NewBatch(s.opts.Decoder)
	for i := range sandboxes {
		sb := &sandboxes[i]
		sb.Annotations = decode.Bounded(s.opts.Decoder, sb.Annotations)
		s.predecode(pre, model.PodRef{UID: sb.UID, Namespace: sb.Namespace, Name: sb.Name}, sb.Annotations)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Decide which records are newer than the snapshot before applying any
	// of it: what the snapshot itself changes below is stamped now, which is
	// after asOf too, and must not make the rest of the snapshot skip them.
	newer := func(seen *record.Seen) bool { return seen != nil && seen.At.After(asOf) }
	sandboxNewer := map[string]bool{}
	containersNewer := map[string]bool{}
	for uid, r := range s.byUID {
		if newer(r.Provenance.Sandbox) {
			sandboxNewer[uid] = true
		}
		if newer(r.Provenance.Containers) {
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
		s.observeSandbox(pre, src, sb)
	}
	ctrs := make(map[string]bool, len(containers))
	for _, c := range containers {
		ctrs[c.ID] = true
		if uid, ok := s.bySandbox[c.SandboxID]; ok && containersNewer[uid] {
			continue
		}
		s.observeContainer(pre, src, c)
	}
	now := s.now()
	gone := model.ContainerStopped
	if exitedListed {
		gone = model.ContainerRemoved
	}
	for uid, r := range s.byUID {
		if r.SandboxID == "" || r.State == record.PhaseRemoved || sandboxNewer[uid] {
			continue
		}
		if !listed[r.SandboxID] {
			s.setPhase(src, uid, record.PhaseRemoved)
			continue
		}
		if containersNewer[uid] {
			continue
		}
		s.update(uid, func(r *record.Record) bool { return r.MarkUnlisted(src, ctrs, gone, now) })
	}
}
