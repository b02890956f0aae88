package merge

import (
	"maps"
	"sync"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/trust"
)

// The Resolver's side of shared GPUs (trust/sharedgpu.go decides each
// sharer's place): the table of every shared GPU's sharers, kept per store
// version and inventory snapshot like the holders; a Plan keeps its pod's
// shares (sharesOf) and the views render ids from them (view.go).

// sharedCache keeps the sharers' ids decided for one store version and
// inventory snapshot. Each new table is built from the previous one, so a
// pod keeps its slot for as long as it shares the GPU; a new table is a new
// pointer, which is how plans built with the old one know they are stale;
// a table that gives every pod the same ids keeps the old pointer.
type sharedCache struct {
	mu      sync.Mutex
	version uint64
	inv     *inventory.Snapshot
	t       *trust.SharedGPUs
}

func (c *sharedCache) get(store *state.Store, gate *trust.Gate, inv *inventory.Snapshot) *trust.SharedGPUs {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v := store.Version(); c.t == nil || c.version != v || c.inv != inv {
		records := store.Records()
		if t := gate.SharedGPUs(c.t, records, inv); !t.Equal(c.t) {
			c.t = t // else the same pointer: plans decided with it stay valid
		}
		c.version, c.inv = v, inv
		// Record each sharer's slots, so that a restarted daemon gives
		// them again. That changes the store's version once: the next
		// call builds the same table from this one.
		for _, r := range records {
			if slots := c.t.Slots(r.UID); !maps.Equal(slots, r.GPUSlots) {
				store.SetGPUSlots(r.UID, slots)
			}
		}
	}
	return c.t
}

// sharedGPUs returns the current table.
func (r *Resolver) sharedGPUs(inv *inventory.Snapshot) *trust.SharedGPUs {
	return r.shared.get(r.o.Store, r.o.Trust.Gate(), inv)
}

// DependsOnOthers reports whether a pod's answer can change when another
// pod's record does: that of any pod with devices, since the trust gate
// weighs claims against each other (and a GPU's sharers' ids depend on who
// else shares it).
func (r *Resolver) DependsOnOthers(rec *record.Record) bool { return len(rec.Devices) > 0 }
