package podsapi

import (
	"reflect"

	"github.com/podres-proxy/podres-proxy/model"
)

// view is Source's picture of the kubelet's pods, by UID. It is changed
// only by the watch goroutine, under Source.mu. It has no index by name:
// the store learns pods from the handler's events, and Lookup serves only
// the legacy view's occasional questions, so a scan of the node's pods is
// cheap enough.
type view struct {
	byUID map[string]*entry
	seq   uint64 // counts entries made, to order pods created in the same second
}

// entry is one pod of the view.
type entry struct {
	d   decoded
	seq uint64
	// refused is why the pod's last event could not be read; d then holds
	// only its identity and the entry exists to keep Lookup from answering
	// the pod's name with another pod of that name (see lookup).
	refused error
}

func newView() view { return view{byUID: make(map[string]*entry)} }

func key(p *model.KubeletPod) model.PodKey {
	return model.PodKey{Namespace: p.Namespace, Name: p.Name}
}

// put records d and returns the event it makes: PodAdded for a UID the view
// did not have (or had refused), PodModified for a change of what is kept,
// and "" when nothing kept changed (the kubelet sends MODIFIED for every
// status change, and resends every pod at each relist).
func (v *view) put(d decoded) EventType {
	e := v.byUID[d.pod.UID]
	if e == nil {
		v.seq++
		v.byUID[d.pod.UID] = &entry{d: d, seq: v.seq}
		return PodAdded
	}
	wasRefused := e.refused != nil
	if !wasRefused && reflect.DeepEqual(e.d.pod, d.pod) {
		return ""
	}
	e.d, e.refused = d, nil
	if wasRefused {
		return PodAdded
	}
	return PodModified
}

// refuse records that the pod named by id could not be read. It reports
// whether this is news: a pod refused again for the same reason is not.
// A pod whose UID or name could not be read cannot be placed in the view.
func (v *view) refuse(id model.KubeletPod, err error) bool {
	if id.UID == "" {
		return true
	}
	e := v.byUID[id.UID]
	if e == nil {
		if id.Namespace == "" || id.Name == "" {
			return true
		}
		v.seq++
		v.byUID[id.UID] = &entry{d: decoded{pod: id}, seq: v.seq, refused: err}
		return true
	}
	news := e.refused == nil || e.refused.Error() != err.Error()
	e.refused = err
	return news
}

// remove drops the pod with uid and returns its last entry, or nil.
func (v *view) remove(uid string) *entry {
	e := v.byUID[uid]
	delete(v.byUID, uid)
	return e
}

// lookup returns the pod PodResources means by k, as kubeletpods.PodList
// does for /pods: the kubelet can hold more than one pod of a name (a
// finished pod until it is deleted, a pod recreated under its
// predecessor's name while the predecessor is torn down), and the one that
// counts is a live one rather than a finished one, and among equals the
// newer (created later; among pods created in the same second, the one
// this view learned last). When any pod of the name was refused there is
// no answer: the refused pod may well be the newer one, and answering its
// predecessor instead is the one mistake the daemon must never make.
func (v *view) lookup(k model.PodKey) (model.KubeletPod, bool) {
	var best *entry
	for _, e := range v.byUID {
		switch {
		case key(&e.d.pod) != k:
		case e.refused != nil:
			return model.KubeletPod{}, false
		case best == nil || prefer(e, best):
			best = e
		}
	}
	if best == nil {
		return model.KubeletPod{}, false
	}
	return best.d.pod, true
}

// prefer reports whether lookup should answer a rather than b.
func prefer(a, b *entry) bool {
	if at, bt := a.d.pod.Terminal(), b.d.pod.Terminal(); at != bt {
		return bt
	}
	if c := a.d.created.Compare(b.d.created); c != 0 {
		return c > 0
	}
	return a.seq > b.seq
}
