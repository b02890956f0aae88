package record

import "slices"

// Merge returns what two instances that recorded the same pod at once know
// of it together: ours, the record of the instance that takes the state
// directory over, and theirs, the one the previous writer left there (a
// rolling update runs both for a while, each told the pod's facts by its own
// NRI plugin, CRI reconciler and pod sources). Each fact is taken from the
// record that learned it last (Provenance), never the whole record from the
// newer one, so that neither loses what only it was told:
//
//   - the sandbox (SandboxID, State, RemovedAt), and with it the containers
//     while both records name the same sandbox;
//   - the allocation annotations (Annotations, Devices, DecodeErrors,
//     Edited), the runtime's before the kubelet's however old: an allocation
//     is fixed once its sandbox starts;
//   - the spec, with KubeletPhase (a finished pod's phase is final);
//   - Refused and GPUSlots, what answering computed, from the record changed
//     last (GPUSlots from the other while that one has none: a pod keeps
//     its slots for its life).
//
// Merge modifies neither record; the result shares their slices and maps,
// which records never modify.
func Merge(ours, theirs *Record) *Record {
	m := *ours
	if newer(theirs.Provenance.Sandbox, ours.Provenance.Sandbox) ||
		ours.Provenance.Sandbox == nil && theirs.Provenance.Sandbox == nil && ours.State == "" {
		m.SandboxID, m.State, m.RemovedAt = theirs.SandboxID, theirs.State, theirs.RemovedAt
		m.Provenance.Sandbox = theirs.Provenance.Sandbox
	}
	switch {
	case theirs.SandboxID != m.SandboxID:
		// Their containers are of another sandbox.
	case ours.SandboxID != m.SandboxID, newer(theirs.Provenance.Containers, ours.Provenance.Containers):
		m.Containers, m.Provenance.Containers = slices.Clone(theirs.Containers), theirs.Provenance.Containers
	}
	if annotationsFirst(theirs.Provenance.Annotations, ours.Provenance.Annotations) {
		m.Annotations, m.Devices, m.DecodeErrors, m.Edited = theirs.Annotations, theirs.Devices, theirs.DecodeErrors, theirs.Edited
		m.Provenance.Annotations = theirs.Provenance.Annotations
	}
	if newer(theirs.Provenance.Spec, ours.Provenance.Spec) {
		m.Spec, m.Provenance.Spec = theirs.Spec, theirs.Provenance.Spec
		if !finished(m.KubeletPhase) {
			m.KubeletPhase = theirs.KubeletPhase
		}
	}
	if finished(theirs.KubeletPhase) && !finished(m.KubeletPhase) || m.KubeletPhase == "" {
		m.KubeletPhase = theirs.KubeletPhase
	}
	if m.Namespace == "" {
		m.Namespace, m.Name = theirs.Namespace, theirs.Name
	}
	if theirs.UpdatedAt.After(ours.UpdatedAt) {
		m.Refused = theirs.Refused
		if len(theirs.GPUSlots) > 0 {
			m.GPUSlots = theirs.GPUSlots
		}
		m.UpdatedAt = theirs.UpdatedAt
	}
	return &m
}

// newer reports whether a fact learned at a was learned after one learned at
// b (nil: never).
func newer(a, b *Seen) bool {
	return a != nil && (b == nil || a.At.After(b.At))
}

// annotationsFirst reports whether annotations learned at a take precedence
// over those learned at b: the runtime's (the sandbox's own, fixed when it
// started) over the kubelet's, and the later of two of one kind.
func annotationsFirst(a, b *Seen) bool {
	if a == nil || b == nil {
		return b == nil && a != nil
	}
	if runtime(a.Origin) != runtime(b.Origin) {
		return runtime(a.Origin)
	}
	return a.At.After(b.At)
}

func runtime(o Origin) bool { return o == OriginNRI || o == OriginCRI }

func finished(kubeletPhase string) bool {
	return kubeletPhase == "Succeeded" || kubeletPhase == "Failed"
}
