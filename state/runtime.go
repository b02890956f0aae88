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

// ObserveSandbox records a sandbox the runtime reported (NRI RunPodSandbox,
// Synchronize, CRI ListPodSandbox). It creates the record if the UID is new.
func (s *Store) ObserveSandbox(src record.Origin, sb model.Sandbox) {
	pre := decode.Batch{}
	s.predecode(pre, model.PodRef{UID: sb.UID, Namespace: sb.Namespace, Name: sb.Name}, sb.Annotations)
	s.lock(pre)
	defer s.unlock()
	s.observeSandbox(src, sb)
}

// lock takes the write lock with pre, the annotations decoded for this call.
func (s *Store) lock(pre decode.Batch) {
	s.mu.Lock()
	s.pre = pre
}

func (s *Store) unlock() {
	s.pre = nil
	s.mu.Unlock()
}

func (s *Store) observeSandbox(src record.Origin, sb model.Sandbox) {
	uid := sb.UID
	if uid == "" {
		uid = s.bySandbox[sb.ID]
	}
	if uid == "" {
		return // nothing to key it by; the reconciler will bring it
	}
	now := s.now()
	s.update(uid, func(r *record.Record) bool {
		changed := false
		if r.Namespace == "" && sb.Namespace != "" {
			r.Namespace, r.Name = sb.Namespace, sb.Name
			changed = true
		}
		phase := record.PhaseStopped
		if sb.Ready {
			phase = record.PhaseReady
		}
		if r.SandboxID != sb.ID && sb.ID != "" {
			if r.SandboxID != "" && phase == record.PhaseStopped && r.State == record.PhaseReady {
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
		if r.Provenance.Sandbox == nil || changed {
			r.Provenance.Sandbox = &record.Seen{Origin: src, At: now}
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
	s.update(uid, func(r *record.Record) bool {
		if r.State == phase || r.State == record.PhaseRemoved {
			return false
		}
		r.State = phase
		r.Provenance.Sandbox = &record.Seen{Origin: src, At: now}
		if phase == record.PhaseRemoved {
			r.RemovedAt = &now
			for i := range r.Containers {
				r.Containers[i].State = model.ContainerRemoved
			}
		}
		return true
	})
}

// ObserveContainer records a container the runtime reported.
func (s *Store) ObserveContainer(src record.Origin, c model.RuntimeContainer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observeContainer(src, c)
}

func (s *Store) observeContainer(src record.Origin, c model.RuntimeContainer) {
	uid, ok := s.bySandbox[c.SandboxID]
	if !ok || c.ID == "" {
		return
	}
	now := s.now()
	s.update(uid, func(r *record.Record) bool {
		if r.SandboxID != c.SandboxID {
			return false
		}
		i := slices.IndexFunc(r.Containers, func(x record.Container) bool { return x.ID == c.ID })
		if i < 0 && c.State == model.ContainerRemoved {
			return false // removal of a container we never knew: nothing to record
		}
		if i < 0 {
			r.Containers = append(r.Containers, record.Container{Name: c.Name, ID: c.ID, State: c.State})
		} else {
			old := r.Containers[i]
			if old.State == c.State || old.State == model.ContainerRemoved ||
				(c.State == model.ContainerUnknown && old.State == model.ContainerStopped) {
				return false
			}
			r.Containers[i].State = c.State
			if c.Name != "" {
				r.Containers[i].Name = c.Name
			}
		}
		r.Provenance.Containers = &record.Seen{Origin: src, At: now}
		return true
	})
}

// ContainerRemoved records that a container is gone.
func (s *Store) ContainerRemoved(src record.Origin, sandboxID, containerID string) {
	s.ObserveContainer(src, model.RuntimeContainer{ID: containerID, SandboxID: sandboxID, State: model.ContainerRemoved})
}

// Reconcile applies a full snapshot of the runtime (NRI Synchronize, CRI
// list) taken at asOf: listed sandboxes and containers are recorded,
// sandboxes recorded earlier and not listed are removed. Containers of listed
// sandboxes that are not listed are marked stopped when exitedListed is false
// (NRI leaves exited containers out) and removed when it is true (CRI lists
// exited ones). A record whose sandbox or containers changed after asOf is
// newer than the snapshot and keeps what it knows.
func (s *Store) Reconcile(src record.Origin, asOf time.Time, sandboxes []model.Sandbox, containers []model.RuntimeContainer, exitedListed bool) {
	pre := decode.Batch{}
	for _, sb := range sandboxes {
		s.predecode(pre, model.PodRef{UID: sb.UID, Namespace: sb.Namespace, Name: sb.Name}, sb.Annotations)
	}
	s.lock(pre)
	defer s.unlock()
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
		s.update(uid, func(r *record.Record) bool {
			changed := false
			for i, c := range r.Containers {
				if ctrs[c.ID] || c.State == model.ContainerRemoved || c.State == gone {
					continue
				}
				r.Containers[i].State = gone
				changed = true
			}
			if changed {
				r.Provenance.Containers = &record.Seen{Origin: src, At: now}
			}
			return changed
		})
	}
}
