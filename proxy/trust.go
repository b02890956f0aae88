package proxy

import (
	"sync"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

// The resolver's side of the trust rules (proxy/allocator/trust.go decides):
// which records can be vetted without a /pods read, and applying the gate to
// a pod's devices with what it needs from the store.

// vettable reports whether the record says enough to vet its devices
// without reading /pods: its spec, with the scheduler name when a trust gate
// is set.
func (r *resolver) vettable(rec *state.Record) bool {
	if r.trust == nil {
		return rec.Spec != nil
	}
	return allocator.Vettable(rec.Spec)
}

// vet returns the devices of rec the trust gate believes: those Vet keeps,
// less those that conflict with another pod's earlier claim (Gate.Contest). What it refuses is recorded in
// the store, and logged and counted when that changed, so a forger costs one
// warning per change, not one per query.
func (r *resolver) vet(rec *state.Record, devs []model.Device, inv allocator.Inventory, holders *allocator.Holders) []model.Device {
	if r.trust == nil {
		return devs
	}
	kept, refused := r.trust.Vet(rec.Spec, devs, inv)
	for _, key := range rec.Edited {
		refused = append(refused, model.Refused{
			Allocator: r.allocators.AllocatorOf(key),
			Reason:    allocator.ReasonEdited,
			Class:     allocator.ReasonClass(allocator.ReasonEdited),
			Detail:    key + " was changed in the API after the pod's sandbox started; the value the sandbox started with is kept",
		})
	}
	if len(kept) > 0 {
		var contested []model.Refused
		kept, contested = r.trust.Contest(rec, kept, holders)
		refused = append(refused, contested...)
	}
	if r.store.SetRefused(rec.UID, refused) {
		r.trust.Report(model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}, refused)
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
	inv     allocator.Inventory
	h       *allocator.Holders
}

func (c *holdersCache) get(store *state.Store, gate *allocator.Gate, inv allocator.Inventory) *allocator.Holders {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := store.Version(); c.h == nil || c.version != v || !sameInventory(c.inv, inv) {
		c.h, c.version, c.inv = gate.Holders(store.Records(), inv), v, inv
	}
	return c.h
}
