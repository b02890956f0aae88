// Package resolve says which plan answers each pod a query names: from
// the current plans table when it knows which pod the name is, otherwise
// after a /pods read that started after the query arrived (shared), with
// the kubelet's pod logs directory as evidence of a pod recreated under a
// name. It is the query path's one place of I/O: the shared reads, the
// directory's stat, and the wait for device-info files; it computes and
// writes nothing.
package resolve

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/state"
)

// Resolver makes the Queries that say which plan answers each pod of a
// kubelet answer; it computes and writes nothing. A pod the current table
// cannot answer waits for a /pods read that started after the query
// arrived, shared with concurrent queries: a pod being created (Multus asks
// during CNI ADD, before the sandbox exists) must be answered with its
// annotation, and PodResources has no UID to tell a recreated pod from its
// predecessor.
type Resolver struct {
	o     Options
	names *podlogs.NameReader // reads of o.PodLogs's entries, shared
	// checked is the table and directory a List last resolved every pod
	// of against the directory's entries, without a read (Query.Checked).
	checked atomic.Pointer[checkedLogs]
	// unavailable are the pods already reported answered Unavailable.
	unavailable reportedOnce
}

// Options are what a Resolver answers from.
type Options struct {
	// Store is read for its Version only: the table a query answers from
	// covers at least what the store held when the query looked.
	Store *state.Store
	Plans *plans.Builder
	// Pods reads /pods, shared between queries; nil: every read fails.
	Pods *kubeletpods.Reader
	// PodLogs is the kubelet's pod logs directory (PlanWithoutRead); nil: none.
	PodLogs *podlogs.Dir
	// Watching reports whether a kubelet watch (the Pods API) keeps the
	// store's names current, so that the pod the kubelet has under a name
	// is known without a read; nil: never.
	Watching func() bool
	// Log gets a warning per answer that did not wait for a device-info
	// file to be written; nil: logrus's standard logger.
	Log logrus.FieldLogger
	// Report is told, once per pod, of a pod whose UID the kubelet's names
	// give answered Unavailable (events.go); nil: none.
	Report plans.Reporter
}

// NewResolver returns the resolver of o.
func NewResolver(o Options) *Resolver {
	if o.Log == nil {
		o.Log = logrus.StandardLogger()
	}
	return &Resolver{o: o, names: podlogs.NewNameReader(o.PodLogs)}
}

// Table returns a table that covers everything the store held when it was
// called (plans.Builder.At). It fails with Unavailable while the daemon
// stops, so that clients retry as while it restarts, and otherwise with
// the wait's error.
func (r *Resolver) Table(ctx context.Context) (*plans.Table, error) {
	t, err := r.o.Plans.At(ctx, r.o.Store.Version())
	if errors.Is(err, plans.ErrStopped) {
		// The daemon is stopping: as when it is not there, so that
		// clients retry, as they do while it restarts.
		return nil, status.Error(codes.Unavailable, "podres-proxy is stopping")
	}
	if err != nil {
		return nil, fmt.Errorf("waiting for the pods' plans: %w", err)
	}
	return t, nil
}

// Watched reports whether a kubelet watch keeps the names current, so that
// a name TablePlan does not know is most likely no pod at all.
func (r *Resolver) Watched() bool { return r.o.Watching != nil && r.o.Watching() }

// errNoPodsSource is returned when a read is needed but none is configured.
var errNoPodsSource = errors.New("no kubelet /pods source is configured")

// Plans returns one plan per key, nil for a pod the kubelet lists that a
// /pods read shows deleted. It reads /pods (a read started after arrived,
// shared) only when q's table cannot answer a key without one (PlanWithoutRead), and
// then answers from a table that covers the read, which becomes q's. It
// fails with Unavailable when a pod is unknown and /pods cannot be read;
// it never answers without a pod's devices, since Multus would configure
// the pod's network without its VF and Antrea caches empty answers. A
// running record the directory does not contradict still answers when the
// read fails.
//
// For a view whose consumers read device-info files (ReadsDeviceInfo), it
// returns once the files of the plans' devices are written
// (plans.Plan.Written), or after DeviceInfoWait, never failing for them.
func (q *Query) Plans(ctx context.Context, keys []model.PodKey, arrived time.Time, v merge.View) ([]*plans.Plan, error) {
	out, err := q.plansNoWait(ctx, keys, arrived)
	if err != nil {
		return nil, err
	}
	if v.ReadsDeviceInfo() {
		q.r.waitWritten(ctx, out)
	}
	return out, nil
}

// DeviceInfoWait bounds how long an answer waits for device-info files.
// Writing one takes a millisecond; a write that takes longer is stalled (a
// slow or hung filesystem, a lock held), and Multus treats the file as
// optional: a CNI ADD without device-info in the network-status beats one
// that fails, and a stalled path must not fail every answer with the pod.
const DeviceInfoWait = time.Second

// waitWritten waits, at most DeviceInfoWait in all, for the device-info
// files of the plans' devices. It never fails the answer: what is not
// written by then is logged, and the answer goes without it.
func (r *Resolver) waitWritten(ctx context.Context, ps []*plans.Plan) {
	ctx, cancel := context.WithTimeout(ctx, DeviceInfoWait)
	defer cancel()
	for _, p := range ps {
		if err := p.Written(ctx); err != nil {
			r.o.Log.WithError(err).Warn("answered before the device-info files of its devices were written; Multus may show no device-info for them")
			return
		}
	}
}

// plansNoWait is Plans without the wait for device-info files.
func (q *Query) plansNoWait(ctx context.Context, keys []model.PodKey, arrived time.Time) ([]*plans.Plan, error) {
	out := make([]*plans.Plan, len(keys))
	var need []int
	for i, k := range keys {
		p, ok := q.PlanWithoutRead(k)
		if !ok {
			need = append(need, i)
			continue
		}
		out[i] = p
	}
	if len(need) == 0 {
		return out, nil
	}
	snap, err := q.r.read(ctx, arrived)
	if err != nil {
		for _, i := range need {
			p, ok := q.planDespiteFailedRead(keys[i])
			if !ok {
				q.r.reportUnavailable(q.t, keys[i], err)
				return nil, errDevicesUnknown(keys[i], err)
			}
			out[i] = p
		}
		return out, nil
	}
	// The read is in the store: answer every pod from a table that has it.
	if q.t, err = q.r.Table(ctx); err != nil {
		return nil, err
	}
	for i, k := range keys {
		out[i] = q.planAfterRead(snap, k)
	}
	return out, nil
}

func (r *Resolver) read(ctx context.Context, arrived time.Time) (*kubeletpods.PodList, error) {
	if r.o.Pods == nil {
		return nil, errNoPodsSource
	}
	snap, err := r.o.Pods.ReadAfter(ctx, arrived)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("waiting for /pods: %w", ctxErr)
		}
		return nil, err
	}
	return snap, nil
}
