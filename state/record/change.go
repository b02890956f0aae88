package record

import (
	"maps"
	"slices"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

// What one reported fact does to one Record. The store (package state)
// applies these to a copy of a record under its lock and installs the copy
// when they report a change; they need nothing but the record and the fact.
// Each modifies Containers in place (the store copies it) and replaces, never
// modifies, the other slices and maps. The allocation annotations, which
// need the store's decoder, are package state's.

// ObserveSandbox records a sandbox the runtime reported at now, by src. It
// reports whether the record changed, and current false for an old, stopped
// sandbox of a pod whose new sandbox is already running: that says nothing
// about the pod now, and nothing else it carries (its annotations) may be
// taken.
func (r *Record) ObserveSandbox(src Origin, sb model.Sandbox, now time.Time) (changed, current bool) {
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
			return false, false
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
		r.Provenance.Sandbox = &Seen{Origin: src, At: now}
		changed = true
	}
	return changed, true
}

// SetPhase records that the pod's sandbox entered phase at now, as src
// reported. A removed record stays removed; removal removes its containers
// too. It reports whether the record changed.
func (r *Record) SetPhase(src Origin, phase Phase, now time.Time) bool {
	if r.State == phase || r.State == PhaseRemoved {
		return false
	}
	r.State = phase
	r.Provenance.Sandbox = &Seen{Origin: src, At: now}
	if phase == PhaseRemoved {
		r.RemovedAt = &now
		for i := range r.Containers {
			r.Containers[i].State = model.ContainerRemoved
		}
	}
	return true
}

// ObserveContainer records a container of the record's sandbox that src
// reported at now, with c.Annotations, which the caller has cut down to
// those some allocator reads; a container of another sandbox changes
// nothing. It reports whether the record changed.
func (r *Record) ObserveContainer(src Origin, c model.RuntimeContainer, now time.Time) bool {
	if r.SandboxID != c.SandboxID {
		return false
	}
	i := slices.IndexFunc(r.Containers, func(x Container) bool { return x.ID == c.ID })
	if i < 0 && c.State == model.ContainerRemoved {
		return false // removal of a container we never knew: nothing to record
	}
	if i < 0 {
		r.Containers = append(r.Containers, Container{Name: c.Name, ID: c.ID, State: c.State, Annotations: c.Annotations})
	} else {
		old := r.Containers[i]
		// A container's annotations never change, so the first seen stay;
		// a record written before they were kept learns them later.
		annotated := old.Annotations == nil && len(c.Annotations) > 0 && old.State != model.ContainerRemoved
		moved := old.State != c.State && old.State != model.ContainerRemoved &&
			(c.State != model.ContainerUnknown || old.State != model.ContainerStopped)
		if !annotated && !moved {
			return false
		}
		if annotated {
			r.Containers[i].Annotations = c.Annotations
		}
		if moved {
			r.Containers[i].State = c.State
		}
		if c.Name != "" {
			r.Containers[i].Name = c.Name
		}
	}
	r.Provenance.Containers = &Seen{Origin: src, At: now}
	return true
}

// MarkUnlisted sets to gone every container a runtime snapshot taken by src
// did not list (listed holds the ids it did), unless it is already removed
// or gone. It reports whether the record changed.
func (r *Record) MarkUnlisted(src Origin, listed map[string]bool, gone model.ContainerState, now time.Time) bool {
	changed := false
	for i, c := range r.Containers {
		if listed[c.ID] || c.State == model.ContainerRemoved || c.State == gone {
			continue
		}
		r.Containers[i].State = gone
		changed = true
	}
	if changed {
		r.Provenance.Containers = &Seen{Origin: src, At: now}
	}
	return changed
}

// ObserveKubeletPod records what /pods reported of the pod at now, all but
// its annotations: its name, that it exists (a new or wrongly removed
// pending record becomes pending), its phase and, while it runs, its spec.
// It reports whether the record changed.
func (r *Record) ObserveKubeletPod(p *model.KubeletPod, now time.Time) bool {
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
		// The /pods decoder keeps no spec of a finished pod (see
		// kubeletpods): keep what was seen while it ran.
		return changed
	}
	if r.Spec == nil || !sameSpec(r.Spec, &p.Spec) {
		spec := p.Spec
		r.Spec = &spec
		r.Provenance.Spec = &Seen{Origin: OriginKubelet, At: now}
		changed = true
	}
	return changed
}

// sameSpec compares pod specs the way they mean, not the way they were
// built: a nil and an empty list or map are the same (a spec read back from
// its file has no empty maps).
func sameSpec(a, b *model.PodSpec) bool {
	return a.SchedulerName == b.SchedulerName && slices.EqualFunc(a.Containers, b.Containers, func(x, y model.ContainerSpec) bool {
		return x.Name == y.Name && x.Kind == y.Kind && maps.Equal(x.Requests, y.Requests)
	})
}
