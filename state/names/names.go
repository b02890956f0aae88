// Package names is which pod each name is. PodResources names pods without
// UIDs, and every source that says which UID a name is counts, the newest
// winning: a complete kubelet list (/pods, ListPods) as of when it was
// taken, a watch event, and the runtime reporting a pod's new sandbox (NRI
// RunPodSandbox), which the kubelet asks for only for the pod it has under
// that name now. A list taken before a later event says less than the
// event, so it does not undo it (Table.List); a name that the newest
// evidence gives no pod is answered from no record, however many sandboxes
// of it still run (a force-deleted pod's, torn down later).
package names

import (
	"maps"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

// Evidence is what the caller of a complete kubelet list knew, just before
// the list was taken, of whether a pod name can have become another pod
// since (the proxy's is the kubelet's pod logs directory, package podlogs).
// The table does not read it: it keeps it with the list's names, hands it
// back with them, and counts one that says otherwise than the last (Same)
// as a change, so that nothing derived from the old one is reused. nil says
// nothing.
type Evidence interface {
	Same(other Evidence) bool
}

// sameEvidence is Evidence.Same, with nil the same only as nil.
func sameEvidence(a, b Evidence) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Same(b)
}

// maxNamedAge bounds how long the time of a name's evidence is kept: far
// longer than a kubelet list can take (its reads time out in seconds), so
// no list still in flight began before an evidence it forgot.
const maxNamedAge = time.Minute

// Table is which UID each name is, and since when. The zero Table knows no
// name. It is not safe for concurrent use: the store keeps it under its
// lock, and a snapshot keeps a Clone.
type Table struct {
	// uids is which UID each pod name had in the freshest complete kubelet
	// pod list or watch, and at when that list was taken.
	uids map[model.PodKey]string
	at   time.Time
	// complete says that uids came from a complete kubelet list, so a name
	// it lacks is no pod (a "" UID says so of one name, as a watch's
	// deletion does).
	complete bool
	// namedAt is when a source other than a complete list last said which
	// UID a name is.
	namedAt map[model.PodKey]time.Time
	// evidence is what the caller of the complete list that gave uids knew
	// of whether a name can have moved since.
	evidence Evidence
	// pruned is when Prune last walked namedAt.
	pruned time.Time
}

// Clone returns a copy that the table's later changes leave as it is.
func (t *Table) Clone() Table {
	c := *t
	c.uids, c.namedAt = maps.Clone(t.uids), maps.Clone(t.namedAt)
	return c
}

// UID returns the UID the newest evidence gives key ("": no pod), and
// whether any evidence named it.
func (t *Table) UID(key model.PodKey) (string, bool) {
	uid, ok := t.uids[key]
	return uid, ok
}

// Complete reports whether the names come from a complete kubelet list, so
// that a name the table lacks is no pod.
func (t *Table) Complete() bool { return t.complete }

// ListedAt is when the complete list the names come from was taken.
func (t *Table) ListedAt() time.Time { return t.at }

// Evidence is the Evidence given with the complete list the names come
// from; nil when none was.
func (t *Table) Evidence() Evidence { return t.evidence }

// NamedAt is when the word on which UID key is was said: when the complete
// list it comes from was taken, or the watch event or sandbox since.
func (t *Table) NamedAt(key model.PodKey) time.Time {
	if at, ok := t.namedAt[key]; ok && at.After(t.at) {
		return at
	}
	return t.at
}

// List records the names of a complete kubelet list taken at asOf, with the
// caller's evidence. Of two pods of one name (the old one terminating), the
// one still running is the name's. What the sources said of a name after
// asOf is kept. It reports false, and changes nothing, for a list older than
// the one recorded; changed says whether a name's UID, the evidence or the
// completeness changed.
func (t *Table) List(asOf time.Time, evidence Evidence, pods []model.KubeletPod) (taken, changed bool) {
	if asOf.Before(t.at) {
		return false, false
	}
	uids := make(map[model.PodKey]string, len(pods))
	for i := range pods {
		p := &pods[i]
		key := model.PodKey{Namespace: p.Namespace, Name: p.Name}
		if _, dup := uids[key]; p.UID == "" || (dup && p.Terminal()) {
			continue
		}
		uids[key] = p.UID
	}
	for k, at := range t.namedAt {
		if !at.After(asOf) {
			delete(t.namedAt, k)
			continue
		}
		if uid, ok := t.uids[k]; ok {
			uids[k] = uid
		}
	}
	changed = !maps.Equal(uids, t.uids) || !sameEvidence(evidence, t.evidence) || !t.complete
	t.uids, t.at, t.evidence, t.complete = uids, asOf, evidence, true
	return true, changed
}

// Note records that a source said at now that key is uid ("": no pod),
// newer than any list begun before now, and reports whether the UID
// changed. The time changes only with the UID: a later word that the name
// is still the same pod (a watch event of its status) says nothing new, and
// must not hide what happened to the name in between (a successor's log
// directory, resolve.logs.contradict). live reports whether a live record of a
// name remains (see Prune).
func (t *Table) Note(key model.PodKey, uid string, now time.Time, live func(model.PodKey) bool) bool {
	if t.uids == nil {
		t.uids = map[model.PodKey]string{}
	}
	if t.namedAt == nil {
		t.namedAt = map[model.PodKey]time.Time{}
	}
	changed := false
	if cur, ok := t.uids[key]; !ok || cur != uid {
		t.uids[key] = uid
		t.namedAt[key] = now
		changed = true
	}
	t.prune(now, live)
	return changed
}

// prune drops, at most once per maxNamedAge, what the sources said of a
// name once it no longer matters: the name is no pod (""), no live record
// of it remains to be kept from answering, and no list still in flight can
// have begun before the word. Without it a watch that is never followed by
// a complete list keeps every deleted pod's name for good (a Job's, a
// generated name's). Dropping it answers the same: a name of no pod and no
// live record answers nothing either way.
func (t *Table) prune(now time.Time, live func(model.PodKey) bool) {
	if now.Sub(t.pruned) < maxNamedAge {
		return
	}
	t.pruned = now
	for key, at := range t.namedAt {
		if uid, ok := t.uids[key]; !ok || uid != "" || now.Sub(at) <= maxNamedAge || live(key) {
			continue
		}
		delete(t.uids, key)
		delete(t.namedAt, key)
	}
}
