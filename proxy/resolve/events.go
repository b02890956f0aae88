package resolve

import (
	"fmt"
	"sync"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/report"
)

// maxReportedOnce bounds the pods remembered as reported: past it, the set
// starts again (a pod may then be reported twice, and no memory grows).
const maxReportedOnce = 4096

// reportedOnce is a bounded set of pod UIDs already reported.
type reportedOnce struct {
	mu   sync.Mutex
	uids map[string]struct{}
}

// first reports whether uid was not in the set, and adds it.
func (o *reportedOnce) first(uid string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.uids[uid]; ok {
		return false
	}
	if o.uids == nil || len(o.uids) >= maxReportedOnce {
		o.uids = map[string]struct{}{}
	}
	o.uids[uid] = struct{}{}
	return true
}

// reportUnavailable reports, once per pod, that a query about the pod
// named key, which the kubelet's names give a UID, was answered
// Unavailable because reading the kubelet's pods failed with err. It never
// waits (plans.Reporter), so an answer is not delayed by it.
func (r *Resolver) reportUnavailable(t *plans.Table, key model.PodKey, err error) {
	if r.o.Report == nil {
		return
	}
	rec, ok := t.Pods().KubeletNamed(key)
	if !ok || !r.unavailable.first(rec.UID) {
		return
	}
	r.o.Report.Pod(model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}, report.ReasonAnsweredUnavailable, "Answer",
		fmt.Sprintf("a query about the pod (a CNI plugin's, while the pod is created) was answered Unavailable: its devices are unknown, reading the kubelet's pods failed: %s; the client retries",
			report.Truncate(err.Error(), report.MaxExcerpt)))
}
