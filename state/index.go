package state

import (
	"maps"
	"slices"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/names"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// index is what lookups read: the records by UID and by name, and which UID
// the kubelet gives each name. The Store keeps the live one under its lock;
// a Snapshot keeps a copy, so that both answer a lookup by the same rules.
type index struct {
	byUID map[string]*record.Record
	byKey map[model.PodKey][]string // uids, usually one

	// names is which UID each name is (package state/names).
	names names.Table
}

// get returns the record of a pod UID, whatever its phase.
func (x *index) get(uid string) (*record.Record, bool) {
	r, ok := x.byUID[uid]
	return r, ok
}

// live returns the live record (a running sandbox reported by NRI or CRI)
// of a pod name, unless the newest evidence (package state/names) gives that name
// another UID, or no pod: the pod was deleted and recreated under the same name
// (StatefulSets, a force deletion while the old sandbox is still torn
// down), and the new pod must never be answered with its predecessor's
// devices. Of two live sandboxes of one name, the kubelet's names the one;
// without it, it returns false and the caller must ask the kubelet.
func (x *index) live(key model.PodKey) (*record.Record, bool) {
	current, named := x.names.UID(key)
	if !named && x.names.Complete() {
		return nil, false // the kubelet has no pod of that name
	}
	var live *record.Record
	for _, uid := range x.byKey[key] {
		r := x.byUID[uid]
		if !r.Live() || (named && uid != current) {
			continue
		}
		if live != nil {
			return nil, false
		}
		live = r
	}
	return live, live != nil
}

// kubeletNamed returns the record of the UID the freshest kubelet pod list
// or watch gives a name, whatever its phase (pending, running, finished);
// false when the kubelet gave the name no UID, or the record was removed
// before it finished (then only a read says what the name is).
func (x *index) kubeletNamed(key model.PodKey) (*record.Record, bool) {
	uid, ok := x.names.UID(key)
	if !ok {
		return nil, false
	}
	r, ok := x.byUID[uid]
	if !ok || (r.State == record.PhaseRemoved && r.KubeletPhase != "Succeeded" && r.KubeletPhase != "Failed") {
		return nil, false // removed while not finished: a read must say what the name is
	}
	return r, true
}

// liveWithoutRead returns live's record when it needs no /pods read to
// confirm it, and false otherwise: one none of whose containers the runtime
// reported stopped, or whose name a kubelet list taken since confirmed. A
// stopped container is how a force-deleted pod's teardown begins, at the
// moment its replacement of the same name may be created (a container that
// restarts costs one read, not one per query).
func (x *index) liveWithoutRead(key model.PodKey) (*record.Record, bool) {
	r, ok := x.live(key)
	if !ok || !stopping(r) {
		return r, ok
	}
	if uid, _ := x.names.UID(key); uid == r.UID && !x.names.ListedAt().Before(r.Provenance.Containers.At) {
		return r, true
	}
	return nil, false
}

// stopping reports whether the runtime reported a container of r's sandbox
// stopped.
func stopping(r *record.Record) bool {
	if r.Provenance.Containers == nil {
		return false
	}
	for _, c := range r.Containers {
		if c.State == model.ContainerStopped {
			return true
		}
	}
	return false
}

// Snapshot is the store's records and the kubelet's names at one version
// (Store.Snapshot). It is immutable and safe for concurrent use; its
// lookups are the Store's.
type Snapshot struct {
	index
	version uint64
}

// Version is the store's Version the snapshot was taken at.
func (v *Snapshot) Version() uint64 { return v.version }

// Get returns the record of a pod UID.
func (v *Snapshot) Get(uid string) (*record.Record, bool) { return v.get(uid) }

// Live returns the record of the running sandbox of a name, unless the
// kubelet's names give the name another UID or none; false too when two
// run and the names cannot tell them apart (index.live).
func (v *Snapshot) Live(key model.PodKey) (*record.Record, bool) { return v.live(key) }

// KubeletNamed returns the record of the UID the kubelet's freshest list or
// watch gives a name, whatever its phase (index.kubeletNamed).
func (v *Snapshot) KubeletNamed(key model.PodKey) (*record.Record, bool) { return v.kubeletNamed(key) }

// NamesEvidence is the Evidence given with the complete kubelet list the
// snapshot's names come from; nil when none was.
func (v *Snapshot) NamesEvidence() names.Evidence { return v.names.Evidence() }

// NamedAt is when the snapshot's word on which UID a name is was said
// (names.Table.NamedAt).
func (v *Snapshot) NamedAt(key model.PodKey) time.Time { return v.names.NamedAt(key) }

// LiveWithoutRead returns Live's record when no container of it stopped
// since the kubelet last confirmed the name, so no read is needed to answer
// it (index.liveWithoutRead).
func (v *Snapshot) LiveWithoutRead(key model.PodKey) (*record.Record, bool) {
	return v.liveWithoutRead(key)
}

// Records returns every record, sorted by namespace, name and UID.
func (v *Snapshot) Records() []*record.Record {
	out := slices.Collect(maps.Values(v.byUID))
	record.Sort(out)
	return out
}

// Len returns how many records the snapshot holds.
func (v *Snapshot) Len() int { return len(v.byUID) }
