package resolve

import (
	"context"
	"time"

	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/state/names"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// LogsEvidence is the pod logs directory's stamp taken before a /pods read,
// as the store keeps it with the read's names (names.Evidence).
type LogsEvidence struct{ podlogs.Stamp }

// Same implements names.Evidence.
func (e LogsEvidence) Same(o names.Evidence) bool {
	x, ok := o.(LogsEvidence)
	return ok && e.Stamp.Same(x.Stamp)
}

// namesLogs is the stamp the store keeps with t's names; one that says
// nothing when their read gave none.
func namesLogs(t *plans.Table) podlogs.Stamp {
	e, _ := t.Pods().NamesEvidence().(LogsEvidence)
	return e.Stamp
}

// Query says which plan answers each pod one query names: from one plans
// table, and the kubelet's pod logs directory as the query found it (one
// stat; its entries read, shared, only when it changed since the table's
// /pods read). A Query is used by one query, from one goroutine. The
// directory because the kubelet makes a pod's log directory before it asks
// for the pod's sandbox, so before the CNI ADD that asks for its devices: a
// name whose newest entry is another UID than the table's running record is
// a pod recreated under that name, and is not answered from that record
// (docs/pod-sources.md).
type Query struct {
	r    *Resolver
	t    *plans.Table
	logs logs
}

// Query returns a query on a table that covers everything the store held
// when it was called; its errors are Table's.
func (r *Resolver) Query(ctx context.Context) (*Query, error) {
	t, err := r.Table(ctx)
	if err != nil {
		return nil, err
	}
	return &Query{r: r, t: t, logs: r.logsNow(ctx, t)}, nil
}

// Table is the table q answers from: the one it began with, or the one
// that covers its /pods read (Plans).
func (q *Query) Table() *plans.Table { return q.t }

// Fresh reports whether what the pod logs directory says is no newer than
// q's table, or was already checked against every pod of it (Checked), so
// that an answer checked against the table alone (the answers' caches) is
// still q's.
func (q *Query) Fresh() bool {
	if q.logs.names == nil {
		return true
	}
	c := q.r.checked.Load()
	return c != nil && c.t == q.t && c.stamp.Unchanged(q.logs.now)
}

// checkedLogs is a table and the pod logs directory as a List found them
// when it resolved every pod of the table with the directory's entries.
type checkedLogs struct {
	t     *plans.Table
	stamp podlogs.Stamp
}

// Checked records that an answer looked every one of its pods up in q's
// table with what the directory said (TablePlan) and needed no read. Until the
// table or the directory changes, the same lookups give the same plans, so
// later queries let the answers' caches skip them (Fresh): a node whose
// directory changed since the last /pods read (or that never read /pods:
// NRI told it every pod) would otherwise look every pod up at every List.
func (q *Query) Checked() {
	if q.logs.names != nil {
		q.r.checked.Store(&checkedLogs{t: q.t, stamp: q.logs.now})
	}
}

// clockSlack is how far behind the clock a directory's ctime may be (the
// kernel stamps it from a coarse clock, a tick or so behind): an entry
// made that much before a source said which pod a name is still counts, on
// the safe side (a read).
const clockSlack = 20 * time.Millisecond

// logs is the pod logs directory as one query found it.
type logs struct {
	now   podlogs.Stamp  // its stamp; zero: not looked at (a watch, none, or no stat)
	names *podlogs.Names // its entries, when it changed since the table's read
}

// logsNow stats the pod logs directory, and reads its entries (shared)
// when it changed since t's /pods read. With a watch too: the kubelet
// makes a pod's entry after its watch event is sent, but the event may
// still be on its way when the CNI ADD asks.
func (r *Resolver) logsNow(ctx context.Context, t *plans.Table) logs {
	if r.o.PodLogs == nil {
		return logs{}
	}
	now, err := r.o.PodLogs.Stamp()
	if err != nil {
		return logs{} // as without a directory: the names of the last read
	}
	if namesLogs(t).Unchanged(now) {
		return logs{now: now}
	}
	return logs{now: now, names: r.names.Read(ctx, now)}
}

// contradict reports whether the directory says key is another pod than
// rec, beyond t's /pods read and what a source said of the name since
// (less clockSlack), or cannot say (podlogs.Names.NewestAfter).
func (l logs) contradict(t *plans.Table, key model.PodKey, rec *record.Record) bool {
	if l.names == nil {
		return false
	}
	after := t.Pods().NamedAt(key)
	if !after.IsZero() {
		after = after.Add(-clockSlack) // zero: no source said; not a time to move
	}
	uid, doubt := l.names.NewestAfter(key, namesLogs(t), after)
	return doubt || (uid != "" && uid != rec.UID)
}
