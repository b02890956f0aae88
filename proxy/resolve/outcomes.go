package resolve

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
)

// This file holds every decision of which plan a pod is answered with, or
// that it gets Unavailable, each a function named after its outcome (the
// table in docs/how-it-works.md, "Why Unavailable, or no devices", lists
// them with the rules of the other packages they rest on):
//
//   - TablePlan: answered from the plans table alone, no read;
//   - PlanWithoutRead: else, without a watch, from the last /pods read
//     while no sandbox began on the node since;
//   - else the pod waits for a /pods read (Query.Plans), and then
//     planAfterRead: from the table that covers the read, or nothing
//     added for a pod the read shows deleted;
//   - or, when that read failed, planDespiteFailedRead: from the running
//     sandbox's record, or errDevicesUnknown, the Unavailable.
//
// The one other Unavailable is every pod's while the daemon stops
// (Resolver.Table).
//
// A plan says which devices the pod is answered with; a nil plan adds
// none. Why a pod's plan has fewer devices than its annotation names is
// decided in proxy/plans (Builder.decide) and the trust gate, and shown by
// `podres-proxy inspect`.

// TablePlan returns the plan a pod is answered with from q's table alone,
// and false when the table cannot say (it does not know which pod the name
// is now, or knows the pod without its spec) or the directory says the name
// is another pod than the table's running one. It never reads; until the
// table or the directory changes it gives the same answer, so the answers'
// caches may keep it (Checked).
func (q *Query) TablePlan(key model.PodKey) (*plans.Plan, bool) {
	pods := q.t.Pods()
	rec, ok := pods.LiveWithoutRead(key)
	if !ok && q.r.Watched() {
		// The watch says which pod the name is now, with its spec and
		// annotations: a pod being created, one stuck before its sandbox
		// or a finished one costs no read. Without a watch only a read
		// says whether a name not running is still that pod
		// (PlanWithoutRead), and the answers' caches keep what TablePlan
		// answers, so it does not.
		rec, ok = pods.KubeletNamed(key)
	}
	if !ok || !plans.Vettable(rec) || q.logs.contradict(q.t, key, rec) {
		return nil, false
	}
	return q.t.Plan(rec.UID), true
}

// PlanWithoutRead returns the plan a pod is answered with without a read,
// and false when only a read can say: TablePlan's, or else, without a watch, that of the
// pod the last /pods read gave the name while the pod logs directory shows
// that no sandbox began on the node since that read began (package podlogs).
// So a pod stuck before its sandbox, or finished, costs no read per query
// and is answered while /pods is down; a pod being created has its log
// directory made before its CNI ADD asks, and is read.
func (q *Query) PlanWithoutRead(key model.PodKey) (*plans.Plan, bool) {
	if p, ok := q.TablePlan(key); ok {
		return p, true
	}
	if q.r.o.PodLogs == nil || q.r.Watched() {
		return nil, false // with a watch, TablePlan answered every name it knows
	}
	rec, ok := q.t.Pods().KubeletNamed(key)
	if !ok || !plans.Vettable(rec) || !namesLogs(q.t).Unchanged(q.logs.now) {
		return nil, false
	}
	return q.t.Plan(rec.UID), true
}

// planAfterRead returns the plan of key from q's table once it covers a
// /pods read that started after the query arrived (snap): TablePlan's; or,
// when the table still cannot say, that of the pod the read gives the name;
// nil, nothing added, when the read no longer lists the name (the kubelet
// lists a pod just deleted: it is answered as the kubelet answered it) or
// its record was pruned meanwhile.
func (q *Query) planAfterRead(snap *kubeletpods.PodList, key model.PodKey) *plans.Plan {
	if p, ok := q.TablePlan(key); ok {
		return p
	}
	kp, ok := snap.Lookup(key)
	if !ok {
		return nil
	}
	if rec, ok := q.t.Pods().Get(kp.UID); ok {
		return q.t.Plan(rec.UID)
	}
	return nil
}

// planDespiteFailedRead returns the plan of key when the /pods read it
// needed failed: that of the running sandbox's record of the name
// (state.Snapshot.Live), even one whose containers were stopping, unless
// the pod logs directory contradicts it (logs.contradict); false when
// there is none, and the pod is Unavailable (errDevicesUnknown). /pods
// cannot confirm the record now, and dropping a running pod's devices (or
// failing the answer) for every restart would be worse. A record whose
// spec is unknown has its devices refused by its plan (trust's
// spec-unknown), visibly, rather than guessed.
func (q *Query) planDespiteFailedRead(key model.PodKey) (*plans.Plan, bool) {
	rec, ok := q.t.Pods().Live(key)
	if !ok || q.logs.contradict(q.t, key, rec) {
		return nil, false
	}
	return q.t.Plan(rec.UID), true
}

// errDevicesUnknown is the error of a pod whose devices only a /pods read
// can say, when that read failed (readErr): Unavailable, so that the client
// retries (Multus fails the CNI ADD, and the kubelet retries it) rather
// than wiring the pod without its devices. A List that lists the pod fails
// as a whole with it.
func errDevicesUnknown(key model.PodKey, readErr error) error {
	return status.Errorf(codes.Unavailable,
		"podres-proxy: devices of pod %s in namespace %s are unknown: reading the kubelet's /pods failed: %v",
		key.Name, key.Namespace, readErr)
}
