package plans

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/trust"
)

// DeviceInfoWriter writes the NPWG device-info files of the devices a pod
// is answered with (devinfo.Writer). The builder tells it in the background,
// one goroutine per pod at most (holds), and an answer that hands
// out such a device waits for its file (Plan.Written), because Multus reads
// it right after its List, during the same CNI ADD.
type DeviceInfoWriter interface {
	// Wants reports whether a device gets a device-info file.
	Wants(d model.Device) bool
	Hold(pod model.PodRef, devices []model.Device)
}

// Options are what a Builder decides from.
type Options struct {
	Store *state.Store
	// Inventory returns the current inventory snapshot; nil: none.
	Inventory func() *inventory.Snapshot
	// InventoryChanged, when set, returns a channel closed at the
	// inventory's next change, so plans follow it before any query asks.
	// Without it a query that sees a new snapshot asks for a build.
	InventoryChanged func() <-chan struct{}
	Allocators       *allocator.Set
	// Gate vets decoded devices: only what it believes is reported.
	Gate *trust.Gate
	// MIGResource, when set, is the resource MIG instances are reported as.
	MIGResource string
	// DeviceInfo writes device-info files; nil writes none.
	DeviceInfo DeviceInfoWriter
	// Report is told each pod's refusals and undecodable annotations when
	// they change (events.go), never per query; nil reports none.
	Report Reporter
	Log    logrus.FieldLogger
}

// Builder keeps the current Table: Run builds a new one whenever the store
// or the inventory changes, and At waits for one that covers what a query
// has seen. It is safe for concurrent use.
type Builder struct {
	o    Options
	wake chan struct{} // a query needs a newer table than the current one

	// writing counts the device-info writes in flight, which Run waits
	// for before it returns.
	writing sync.WaitGroup
	holds   holds // the device-info writes, one goroutine per pod at most

	mu      sync.Mutex
	cur     *Table
	built   chan struct{} // closed, and replaced, when cur changes
	holders *trust.Holders
	shared  *trust.SharedGPUs
	entries map[string]entry
	// undecodable are the decode errors of each pod as last reported
	// (events.go), and started when the builder was made.
	undecodable map[string][]string
	started     time.Time
}

// New returns a builder; nothing is built until Run.
func New(o Options) *Builder {
	if o.Log == nil {
		o.Log = logrus.StandardLogger()
	}
	return &Builder{o: o, wake: make(chan struct{}, 1), built: make(chan struct{}), holds: holds{w: o.DeviceInfo}, started: time.Now()}
}

// ErrStopped is At's error once Run has returned.
var ErrStopped = errors.New("plans: the builder is stopped")

// Run builds a table now and again at every change, until ctx is done.
func (b *Builder) Run(ctx context.Context) {
	defer b.writing.Wait()
	defer func() {
		b.mu.Lock()
		b.cur = nil
		close(b.built) // waiters see no table and stop waiting
		b.built = nil
		b.mu.Unlock()
	}()
	for {
		changed := b.o.Store.Changed()
		var invChanged <-chan struct{}
		if b.o.InventoryChanged != nil {
			invChanged = b.o.InventoryChanged()
		}
		b.build()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-invChanged:
		case <-b.wake:
		}
	}
}

// At returns a table computed from a store snapshot at version or later,
// and from the inventory's current snapshot, waiting for the builder when
// the current one is older. A query reads the store's Version when it
// arrives (or after a kubelet read it waited for) and answers from At's
// table alone.
func (b *Builder) At(ctx context.Context, version uint64) (*Table, error) {
	for {
		b.mu.Lock()
		cur, built := b.cur, b.built
		b.mu.Unlock()
		if built == nil {
			return nil, ErrStopped
		}
		if cur != nil && cur.pods.Version() >= version && cur.inv == b.inventory() {
			return cur, nil
		}
		select {
		case b.wake <- struct{}{}:
		default: // a build is already asked for
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-built:
		}
	}
}

func (b *Builder) inventory() *inventory.Snapshot {
	if b.o.Inventory == nil {
		return nil
	}
	return b.o.Inventory()
}

// build computes the table of the store's and the inventory's current
// snapshots, keeping every plan none of whose inputs changed, starts the
// device-info writes of the new plans, publishes the table and then
// records what the new plans decided (refusals, slots): a query waits for
// a table, never for those writes, but for the device-info files of the
// devices its answer hands out.
func (b *Builder) build() {
	pods := b.o.Store.Snapshot()
	inv := b.inventory()
	records := pods.Records()

	holders := b.o.Gate.Holders(records, inv)
	if holders.Equal(b.holders) {
		holders = b.holders // the plans decided with the old table hold
	}
	shared := b.o.Gate.SharedGPUs(b.shared, records, inv)
	if shared.Equal(b.shared) {
		shared = b.shared
	}
	keep := b.cur != nil && b.cur.inv == inv && holders == b.holders && shared == b.shared

	entries := make(map[string]entry, len(b.entries))
	plans := make(map[string]*Plan)
	var fresh []*record.Record
	for _, rec := range records {
		if len(rec.Devices) == 0 && len(rec.Edited) == 0 {
			continue
		}
		e, ok := b.entries[rec.UID]
		if !ok || !keep || !sameInputs(e.rec, rec) {
			e = b.decide(rec, inv, holders, shared)
			fresh = append(fresh, rec)
		}
		entries[rec.UID] = e
		if e.plan != nil {
			plans[rec.UID] = e.plan
		}
	}

	// Before the plans are published: a plan whose pod's write is still
	// queued takes over its written channel (holds.hold).
	b.hold(fresh, entries)

	b.mu.Lock()
	b.cur = &Table{pods: pods, inv: inv, shared: shared, plans: plans}
	b.holders, b.shared, b.entries = holders, shared, entries
	close(b.built)
	b.built = make(chan struct{})
	b.mu.Unlock()

	b.record(fresh, entries)
	b.reportUndecodable(records)
}

// decide computes one pod's plan: its devices translated to ids, vetted,
// attributed to its containers, with its share of the GPUs it shares.
func (b *Builder) decide(rec *record.Record, inv *inventory.Snapshot, holders *trust.Holders, shared *trust.SharedGPUs) entry {
	e := entry{rec: rec}
	// A refused device adds nothing and removes nothing: what the kubelet
	// itself reported for the pod (a device plugin's GPU) stays as it is.
	devs, refused, problems := b.o.Gate.VetPod(rec, inv, holders)
	e.refused = refused
	if len(problems) > 0 {
		// Repeats at every build until the inventory knows the device.
		b.o.Log.WithField("pod", rec.Namespace+"/"+rec.Name).WithError(errors.Join(problems...)).Debug("devices without ids")
	}
	e.slots = shared.Slots(rec.UID)
	if len(devs) == 0 {
		return e
	}
	// The gate believes devices only on a pod whose spec it read, so
	// Assign fails only for a spec without app containers, which no
	// kubelet lists: such a pod adds nothing.
	a, ok := b.o.Allocators.Assign(rec.Spec, devs)
	if !ok {
		return e
	}
	if b.o.MIGResource != "" {
		// After attribution: the allocators' requests (nvidia.com/gpu)
		// decide the container, the name only what consumers see.
		relabelled := make(allocator.Assignment, len(a))
		for name, devs := range a {
			relabelled[name] = devids.MIGResource(devs, b.o.MIGResource)
		}
		a = relabelled
	}
	e.plan = &Plan{Containers: a, Shares: sharesOf(rec.UID, rec.Spec, a, shared)}
	if b.wantsDeviceInfo(rec, a) {
		e.plan.written = make(chan struct{})
	}
	return e
}

// sharesOf returns the pod's share of every shared GPU its containers were
// attributed (a), by the GPU's key (inventory.IDKey); nil when it shares
// none. This is all a Plan knows about shared GPUs: the views render the
// ids from it.
func sharesOf(uid string, spec *model.PodSpec, a allocator.Assignment, table *trust.SharedGPUs) map[string]Share {
	if table.Empty() || spec == nil {
		return nil
	}
	var out map[string]Share
	for _, c := range spec.Containers {
		for _, d := range a[c.Name] {
			for _, id := range d.IDs {
				if !trust.SharedGPU(d, id) {
					continue
				}
				key := inventory.IDKey(id)
				if _, seen := out[key]; seen {
					continue
				}
				s, ok := table.ShareOf(uid, id)
				if !ok {
					continue
				}
				if out == nil {
					out = map[string]Share{}
				}
				out[key] = Share{Share: s, First: c.Name}
			}
		}
	}
	return out
}

// wantsDeviceInfo reports whether a pod answered with a gets device-info
// files written for it: a pod not removed with a device that has one.
func (b *Builder) wantsDeviceInfo(rec *record.Record, a allocator.Assignment) bool {
	if b.o.DeviceInfo == nil || rec.State == record.PhaseRemoved {
		return false
	}
	for _, devs := range a {
		if slices.ContainsFunc(devs, b.o.DeviceInfo.Wants) {
			return true
		}
	}
	return false
}

// hold has the device-info files of the fresh plans' devices written in
// the background, each pod's in a goroutine of its own (holds), so that a
// slow file holds up only the answers that hand its device out
// (Plan.Written).
func (b *Builder) hold(fresh []*record.Record, entries map[string]entry) {
	for _, rec := range fresh {
		e := entries[rec.UID]
		if e.plan == nil || e.plan.written == nil {
			continue
		}
		ref := model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}
		b.holds.hold(ref, e.plan, b.writing.Go)
	}
}

// record records, in the store, what the plans of fresh records decided,
// after the table with them is published: the refusals (`inspect` shows
// them; a change is logged and counted once) and the shared-GPU slots (a
// restarted daemon gives them again), which the store persists in the
// background. Recording changes the store, which builds again; that build
// keeps every plan.
func (b *Builder) record(fresh []*record.Record, entries map[string]entry) {
	for _, rec := range fresh {
		e := entries[rec.UID]
		if b.o.Store.SetRefused(rec.UID, e.refused) {
			ref := model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}
			b.o.Gate.Report(ref, e.refused)
			b.reportRefused(rec, rec.Refused, e.refused)
		}
		if !maps.Equal(e.slots, rec.GPUSlots) {
			b.o.Store.SetGPUSlots(rec.UID, e.slots)
		}
	}
}
