package trust

import (
	"sync"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Checker applies the Gate to one pod's devices with what that needs from
// the store: the other pods' claims (Holders, kept for one store version
// and inventory snapshot), and the pod's record, into which what was refused
// is written so that `inspect` shows it. It is safe for concurrent use.
type Checker struct {
	gate    *Gate
	store   *state.Store
	holders holdersCache
}

// NewChecker returns a checker of the pods of store against gate.
func NewChecker(gate *Gate, store *state.Store) *Checker {
	return &Checker{gate: gate, store: store}
}

// Gate returns the checker's gate.
func (c *Checker) Gate() *Gate { return c.gate }

// Vettable reports whether the record says enough to vet its devices
// without reading /pods: its spec, with the scheduler name.
func (c *Checker) Vettable(rec *record.Record) bool { return Vettable(rec.Spec) }

// Holders returns who holds each exclusive device of the node, for the
// store's current records and inv.
func (c *Checker) Holders(inv *inventory.Snapshot) *Holders {
	return c.holders.get(c.store, c.gate, inv)
}

// Vet returns the devices of rec the gate believes: those Gate.Vet keeps,
// less those that conflict with another pod's earlier claim (Gate.Contest).
// Edited annotations are refused too. What it refuses is recorded in the
// store, and logged and counted when that changed, so a forger costs one
// warning per change, not one per query.
func (c *Checker) Vet(rec *record.Record, devs []model.Device, inv *inventory.Snapshot, holders *Holders) []model.Device {
	kept, refused := c.gate.Vet(rec.Spec, devs, inv)
	for _, key := range rec.Edited {
		refused = append(refused, model.Refused{
			Allocator: c.gate.set.AllocatorOf(key),
			Reason:    ReasonEdited,
			Class:     ReasonClass(ReasonEdited),
			Detail:    key + " was changed in the API after the pod's sandbox started; the value the sandbox started with is kept",
		})
	}
	if len(kept) > 0 {
		var contested []model.Refused
		kept, contested = c.gate.Contest(rec, kept, holders)
		refused = append(refused, contested...)
	}
	if c.store.SetRefused(rec.UID, refused) {
		c.gate.Report(model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}, refused)
	}
	return kept
}

// holdersCache keeps the holders of devices computed for one store version
// and inventory snapshot: deciding them vets every record of the node, which
// only a change to some record or to the inventory can change. A new value
// is a new pointer, which is how the plans and answer segments decided
// with the old one know they are stale.
type holdersCache struct {
	mu      sync.Mutex
	version uint64
	inv     *inventory.Snapshot
	h       *Holders
}

func (c *holdersCache) get(store *state.Store, gate *Gate, inv *inventory.Snapshot) *Holders {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := store.Version(); c.h == nil || c.version != v || c.inv != inv {
		c.h, c.version, c.inv = gate.Holders(store.Records(), inv), v, inv
	}
	return c.h
}
