package merge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/metrics"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/trust"
)

// Plan is what the proxy adds to one pod of a kubelet answer, the same for
// every view: V1 and V1alpha1 render it for one (view.go).
type Plan struct {
	// assign gives each container its devices, by name; shared GPUs under
	// their plain UUID.
	assign allocator.Assignment
	// shares is the pod's share of each GPU it shares, by the GPU's key.
	shares map[string]podShare
}

// Empty reports whether the plan adds nothing.
func (p Plan) Empty() bool { return len(p.assign) == 0 }

// Resolver decides, for the pods of a kubelet answer, which devices to add.
// It answers from the store when the pod's sandbox is live and everything
// needed is known; otherwise it waits for a /pods read that started after the
// query arrived (shared with concurrent queries), because a pod being created
// (Multus asks during CNI ADD, before the sandbox exists) must be answered
// with its annotation, and PodResources has no UID to tell a recreated pod
// from its predecessor.
type Resolver struct {
	o      Options
	shared sharedCache // the ids of shared GPUs' sharers (sharedgpu.go)
	cache  planCache
}

// Options are what a Resolver decides from.
type Options struct {
	Store *state.Store
	// Pods reads /pods, shared between queries; nil: every read fails.
	Pods *kubeletpods.Reader
	// Watching reports whether a kubelet watch (the Pods API) keeps the
	// store's names current, so that the pod the kubelet has under a name
	// is known without a read; nil: never.
	Watching   func() bool
	Allocators *allocator.Set
	// Trust vets decoded devices: only what it believes is reported.
	Trust *trust.Checker
	// MIGResource, when set, is the resource MIG instances are reported as.
	MIGResource string
	// DeviceInfo writes the NPWG device-info files of the VFs and RDMA
	// devices answered; nil writes none.
	DeviceInfo DeviceInfoWriter
	Metrics    *metrics.Metrics
	Log        logrus.FieldLogger
}

// NewResolver returns the resolver of o.
func NewResolver(o Options) *Resolver { return &Resolver{o: o} }

// planCache remembers the Plan of each record version. Records are
// immutable and replaced on every change, so a Plan stays valid as long as
// the store hands out the same record; attributing devices parses every
// container's requests, which would otherwise be most of a steady List.
type planCache struct {
	mu sync.RWMutex
	m  map[string]cachedPlan // by pod UID
}

// A Plan is valid for the record, the inventory snapshot and, when the
// trust gate contested its devices against other pods' claims, the holders
// it was decided with (they change with any pod's record), and the shared
// GPUs' ids (likewise).
type cachedPlan struct {
	rec     *record.Record
	inv     *inventory.Snapshot
	holders *trust.Holders
	shared  *trust.SharedGPUs
	plan    Plan
}

func (c *planCache) get(rec *record.Record, inv *inventory.Snapshot, holders *trust.Holders, shared *trust.SharedGPUs) (Plan, bool) {
	c.mu.RLock()
	e, ok := c.m[rec.UID]
	c.mu.RUnlock()
	return e.plan, ok && e.rec == rec && e.holders == holders && e.shared == shared && e.inv == inv
}

// put stores a plan. When the cache holds more than twice the store's
// records (pods removed, or recreated under new UIDs), it is emptied first:
// the next queries recompute the plans they need.
func (c *planCache) put(rec *record.Record, inv *inventory.Snapshot, holders *trust.Holders, shared *trust.SharedGPUs, p Plan, records int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) > 2*records+64 {
		c.m = map[string]cachedPlan{}
	}
	c.m[rec.UID] = cachedPlan{rec: rec, inv: inv, holders: holders, shared: shared, plan: p}
}

// errNoPodsSource is returned when a read is needed but none is configured.
var errNoPodsSource = errors.New("no kubelet /pods source is configured")

// Plans returns one Plan per key, and whether every Plan came from the
// store alone (no /pods read), in which case the same keys, store version
// and inventory give the same plans. It fails with Unavailable when some pod
// is unknown to the store and /pods cannot be read: an answer silently
// missing that pod's devices is worse than an error, since Multus would
// configure the pod's network without its VF and Antrea caches empty answers.
func (r *Resolver) Plans(ctx context.Context, keys []model.PodKey, arrived time.Time, inv *inventory.Snapshot) (plans []Plan, fromStore bool, err error) {
	plans = make([]Plan, len(keys))
	var need []int
	watching := r.o.Watching != nil && r.o.Watching()
	for i, k := range keys {
		rec, ok := r.o.Store.Current(k)
		if !ok && watching {
			// The watch says which pod the name is now, with its spec
			// and annotations: a pod being created, one stuck before its
			// sandbox or a finished one costs no read. Without a watch a
			// pod not running is read again: only a read says whether
			// its name is still that pod.
			rec, ok = r.o.Store.Named(k)
		}
		if ok && (len(rec.Devices) == 0 || r.Vettable(rec)) {
			plans[i] = r.PlanFor(rec, inv)
			continue
		}
		need = append(need, i)
	}
	if len(need) == 0 {
		return plans, true, nil
	}
	snap, err := r.read(ctx, arrived)
	if err != nil {
		for _, i := range need {
			// A live record the kubelet's names do not contradict still
			// answers, even one whose containers were stopping: /pods
			// cannot confirm it now, and dropping a running pod's devices
			// (or failing the answer) for every restart would be worse.
			rec, ok := r.o.Store.Live(keys[i])
			if !ok {
				return nil, false, status.Errorf(codes.Unavailable,
					"podres-proxy: devices of pod %s in namespace %s are unknown: reading the kubelet's /pods failed: %v",
					keys[i].Name, keys[i].Namespace, err)
			}
			// A live record whose spec is unknown cannot be vetted:
			// PlanFor refuses its devices, visibly, rather than guess.
			plans[i] = r.PlanFor(rec, inv)
		}
		return plans, false, nil
	}
	for _, i := range need {
		kp, ok := snap.Lookup(keys[i])
		if !ok {
			// The kubelet lists it but its /pods no longer does: the pod
			// was just deleted. Answer what the kubelet answered.
			continue
		}
		rec, ok := r.o.Store.Get(kp.UID)
		if !ok {
			continue // pruned meanwhile; nothing to add for a deleted pod
		}
		plans[i] = r.PlanFor(rec, inv)
	}
	return plans, false, nil
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

// PlanFor attributes a record's devices to its containers.
func (r *Resolver) PlanFor(rec *record.Record, inv *inventory.Snapshot) Plan {
	if len(rec.Devices) == 0 {
		if len(rec.Edited) > 0 {
			r.vet(rec, nil, inv, nil) // no devices, but the edit is refused and shown
		}
		return Plan{}
	}
	holders := r.o.Trust.Holders(inv)
	shared := r.sharedGPUs(inv)
	if p, ok := r.cache.get(rec, inv, holders, shared); ok {
		return p
	}
	// A Plan that needed the inventory to name a device can change when
	// the inventory does; those (pods from older schedulers) are
	// recomputed every time.
	cacheable := !allocator.NamedByNumber(rec.Devices)
	devs := r.translate(rec, inv)
	devs = allocator.NormalizeIDs(devs)
	// A refused device adds nothing and removes nothing: what the kubelet
	// itself reported for the pod (a device plugin's GPU) stays as it is.
	devs = r.vet(rec, devs, inv, holders)
	devs = r.reported(rec, devs)
	var p Plan
	// The gate believes devices only on a pod whose spec it read, so
	// Assign fails only for a spec without app containers, which no
	// kubelet lists: such a pod adds nothing.
	if a, ok := r.assign(rec.Spec, devs); ok {
		p = r.relabel(Plan{assign: a, shares: sharesOf(rec.UID, rec.Spec, a, shared)})
	}
	if cacheable {
		r.cache.put(rec, inv, holders, shared, p, r.o.Store.Len())
	}
	return p
}

// assign attributes devs to the spec's containers; false when there is
// nothing to attribute.
func (r *Resolver) assign(spec *model.PodSpec, devs []model.Device) (allocator.Assignment, bool) {
	if len(devs) == 0 {
		return nil, false
	}
	return r.o.Allocators.Assign(spec, devs)
}

// translate fills in the ids of devices the allocator named only by minor
// (older Koordinator) or index (Volcano gpushare), from the inventory. Ids
// it cannot find stay empty and are left out of the answer; that is logged
// at debug level, since it repeats on every query until the inventory
// knows the device.
func (r *Resolver) translate(rec *record.Record, inv *inventory.Snapshot) []model.Device {
	devs, problems := allocator.Translate(rec.Devices, inv)
	if len(problems) > 0 && r.o.Log != nil {
		r.o.Log.WithField("pod", rec.Namespace+"/"+rec.Name).WithError(errors.Join(problems...)).Debug("devices without ids")
	}
	return devs
}

// Vettable reports whether the record says enough to vet its devices
// without reading /pods: its spec, with the scheduler name.
func (r *Resolver) Vettable(rec *record.Record) bool { return r.o.Trust.Vettable(rec) }

// vet returns the devices of rec the trust gate believes (see trust.Checker).
func (r *Resolver) vet(rec *record.Record, devs []model.Device, inv *inventory.Snapshot, holders *trust.Holders) []model.Device {
	return r.o.Trust.Vet(rec, devs, inv, holders)
}
