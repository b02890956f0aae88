package merge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/state"
)

// Resolver finds the plan of each pod of a kubelet answer. It answers from
// the current plans.Table when the table says which pod a name is and has
// its spec; otherwise it waits for a /pods read that started after the
// query arrived (shared with concurrent queries), because a pod being
// created (Multus asks during CNI ADD, before the sandbox exists) must be
// answered with its annotation, and PodResources has no UID to tell a
// recreated pod from its predecessor. A pod not running that the last read
// saw is answered from that read while the kubelet's pod logs directory
// shows that no sandbox began since (Find). It computes and writes nothing.
type Resolver struct {
	o Options
}

// Options are what a Resolver answers from.
type Options struct {
	// Store is read for its Version only: the table a query answers from
	// covers at least what the store held when the query looked.
	Store *state.Store
	Plans *plans.Builder
	// Pods reads /pods, shared between queries; nil: every read fails.
	Pods *kubeletpods.Reader
	// PodLogs is the kubelet's pod logs directory (Find); nil: none.
	PodLogs *podlogs.Dir
	// Watching reports whether a kubelet watch (the Pods API) keeps the
	// store's names current, so that the pod the kubelet has under a name
	// is known without a read; nil: never.
	Watching func() bool
}

// NewResolver returns the resolver of o.
func NewResolver(o Options) *Resolver { return &Resolver{o: o} }

// Table returns a table that covers everything the store held when it was
// called.
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
// a name Lookup does not know is most likely no pod at all.
func (r *Resolver) Watched() bool { return r.o.Watching != nil && r.o.Watching() }

// Lookup returns the plan a pod is answered with from t alone, and false
// when t cannot say: it does not know which pod the name is now, or it
// knows the pod without its spec.
func (r *Resolver) Lookup(t *plans.Table, key model.PodKey) (*plans.Plan, bool) {
	pods := t.Pods()
	rec, ok := pods.Current(key)
	if !ok && r.Watched() {
		// The watch says which pod the name is now, with its spec and
		// annotations: a pod being created, one stuck before its sandbox
		// or a finished one costs no read. Without a watch only a read
		// says whether a name not running is still that pod (Find), and
		// the answers' caches keep what Lookup answers, so it does not.
		rec, ok = pods.Named(key)
	}
	if !ok || !plans.Vettable(rec) {
		return nil, false
	}
	return t.Plan(rec.UID), true
}

// Find returns the plan a pod is answered with without a read: Lookup's,
// or else, without a watch, that of the pod the last /pods read gave the
// name, while the kubelet's pod logs directory shows that no sandbox began
// on the node since that read began (package podlogs). A pod stuck before
// its sandbox (a missing Secret) or finished then costs no read per query,
// and is answered while /pods is down; the query that must not get a
// predecessor's devices, Multus's or Kata's during the sandbox's creation,
// comes after the kubelet made the pod's log directory, and reads.
func (r *Resolver) Find(t *plans.Table, key model.PodKey) (*plans.Plan, bool) {
	f := finder{r: r, t: t}
	return f.find(key)
}

// finder is Find for the pods of one query, which stats the pod logs
// directory once at most.
type finder struct {
	r      *Resolver
	t      *plans.Table
	asked  bool // whether the directory was stat'ed
	byName bool // what it said: names not running answer
}

func (f *finder) find(key model.PodKey) (*plans.Plan, bool) {
	if p, ok := f.r.Lookup(f.t, key); ok {
		return p, true
	}
	if f.r.o.PodLogs == nil || f.r.Watched() {
		return nil, false // with a watch, Lookup answered every name it knows
	}
	rec, ok := f.t.Pods().Named(key)
	if !ok || !plans.Vettable(rec) || !f.t.Pods().NamesLogs().Known() {
		return nil, false
	}
	if !f.asked {
		f.asked = true
		now, err := f.r.o.PodLogs.Stamp()
		f.byName = err == nil && f.t.Pods().NamesLogs().Unchanged(now)
	}
	if !f.byName {
		return nil, false
	}
	return f.t.Plan(rec.UID), true
}

// errNoPodsSource is returned when a read is needed but none is configured.
var errNoPodsSource = errors.New("no kubelet /pods source is configured")

// Plans returns one plan per key, and the table they come from, which is t
// when t could answer every key (Find). Otherwise it reads /pods (a read started
// after arrived) and answers from a table that covers the read. It fails
// with Unavailable when a pod is unknown and /pods cannot be read: an
// answer silently missing that pod's devices is worse than an error, since
// Multus would configure the pod's network without its VF and Antrea caches
// empty answers.
func (r *Resolver) Plans(ctx context.Context, t *plans.Table, keys []model.PodKey, arrived time.Time) ([]*plans.Plan, *plans.Table, error) {
	out := make([]*plans.Plan, len(keys))
	var need []int
	f := finder{r: r, t: t}
	for i, k := range keys {
		p, ok := f.find(k)
		if !ok {
			need = append(need, i)
			continue
		}
		out[i] = p
	}
	if len(need) == 0 {
		return out, t, nil
	}
	snap, err := r.read(ctx, arrived)
	if err != nil {
		for _, i := range need {
			// A live record the kubelet's names do not contradict still
			// answers, even one whose containers were stopping: /pods
			// cannot confirm it now, and dropping a running pod's devices
			// (or failing the answer) for every restart would be worse. A
			// live record whose spec is unknown has its devices refused
			// by its plan, visibly, rather than guessed.
			rec, ok := t.Pods().Live(keys[i])
			if !ok {
				return nil, nil, status.Errorf(codes.Unavailable,
					"podres-proxy: devices of pod %s in namespace %s are unknown: reading the kubelet's /pods failed: %v",
					keys[i].Name, keys[i].Namespace, err)
			}
			out[i] = t.Plan(rec.UID)
		}
		return out, t, nil
	}
	// The read is in the store: answer every pod from a table that has it.
	read, err := r.Table(ctx)
	if err != nil {
		return nil, nil, err
	}
	for i, k := range keys {
		if p, ok := r.Lookup(read, k); ok {
			out[i] = p
			continue
		}
		out[i] = nil
		kp, ok := snap.Lookup(k)
		if !ok {
			// The kubelet lists it but its /pods no longer does: the pod
			// was just deleted. Answer what the kubelet answered.
			continue
		}
		if rec, ok := read.Pods().Get(kp.UID); ok {
			out[i] = read.Plan(rec.UID)
		} // else pruned meanwhile: nothing to add for a deleted pod
	}
	return out, read, nil
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
