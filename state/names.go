package state

import (
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

// Which pod a name is: PodResources names pods without UIDs, and every
// source that says which UID a name is counts, the newest winning: a
// complete kubelet list (/pods, ListPods) as of when it was taken, a watch
// event, and the runtime reporting a pod's new sandbox (NRI
// RunPodSandbox), which the kubelet asks for only for the pod it has under
// that name now. A list taken before a later event says less than the
// event, so it does not undo it (setNames); a name that the newest
// evidence gives no pod is answered from no record, however many
// sandboxes of it still run (a force-deleted pod's, torn down later).

// maxNamedAge bounds how long the time of a name's evidence is kept: far
// longer than a kubelet list can take (its reads time out in seconds), so
// no list still in flight began before an evidence it forgot.
const maxNamedAge = time.Minute

// noteName records that a source said at now that key is uid ("": no
// pod), newer than any list begun before now. The time changes only with
// the UID: a later word that the name is still the same pod (a watch
// event of its status) says nothing new, and must not hide what happened
// to the name in between (a successor's log directory, merge.contradict).
// Called with mu held.
func (s *Store) noteName(key model.PodKey, uid string, now time.Time) {
	if s.namedAt == nil {
		s.namedAt = map[model.PodKey]time.Time{}
	}
	if cur, ok := s.names[key]; !ok || cur != uid {
		s.names[key] = uid
		s.namedAt[key] = now
		s.bump()
	}
	s.pruneNames(now)
}

// forgetName drops what the sources said of key once it no longer matters:
// the name is no pod (""), no live record of it remains to be kept from
// answering, and no list still in flight can have begun before the word
// (maxNamedAge). Without it a watch that is never followed by a complete
// list keeps every deleted pod's name for good (a Job's, a generated
// name's). Dropping it answers the same: a name of no pod and no live
// record answers nothing either way. Called with mu held.
func (s *Store) forgetName(key model.PodKey, now time.Time) bool {
	at, noted := s.namedAt[key]
	if uid, ok := s.names[key]; !ok || uid != "" || !noted || now.Sub(at) <= maxNamedAge {
		return false
	}
	for _, uid := range s.byKey[key] {
		if r := s.byUID[uid]; r != nil && r.Live() {
			return false
		}
	}
	delete(s.names, key)
	delete(s.namedAt, key)
	return true
}

// pruneNames forgets the names forgetName may, at most once per
// maxNamedAge (a walk of namedAt under the lock). Called with mu held.
func (s *Store) pruneNames(now time.Time) {
	if now.Sub(s.namesPruned) < maxNamedAge {
		return
	}
	s.namesPruned = now
	for k := range s.namedAt {
		s.forgetName(k, now)
	}
}

// newerNames keeps in names, a complete list's taken at asOf, what the
// sources said of a name after asOf, and forgets what the list covers.
// Called with mu held.
func (s *Store) newerNames(asOf time.Time, names map[model.PodKey]string) {
	for k, at := range s.namedAt {
		if !at.After(asOf) {
			delete(s.namedAt, k)
			continue
		}
		if uid, ok := s.names[k]; ok {
			names[k] = uid
		}
	}
}
