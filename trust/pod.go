package trust

import (
	"maps"
	"slices"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// VetPod returns the devices of rec the gate believes (devs: its decoded,
// translated devices) and those it refuses: what Vet refuses, what
// conflicts with another pod's earlier claim (Contest, against holders;
// nil contests nothing), and every annotation edited in the API after the
// pod's sandbox started. It is pure: the caller records and reports the
// refusals (Report) when they change, so a forger costs one warning per
// change, not one per query.
func (g *Gate) VetPod(rec *record.Record, devs []model.Device, inv *inventory.Snapshot, holders *Holders) (kept []model.Device, refused []model.Refused) {
	kept, refused = g.Vet(rec.Spec, devs, inv)
	for _, key := range rec.Edited {
		refused = append(refused, model.Refused{
			Allocator: g.set.AllocatorOf(key),
			Reason:    ReasonEdited,
			Class:     ReasonClass(ReasonEdited),
			Detail:    key + " was changed in the API after the pod's sandbox started; the value the sandbox started with is kept",
		})
	}
	if len(kept) > 0 {
		var contested []model.Refused
		kept, contested = g.Contest(rec, kept, holders)
		refused = append(refused, contested...)
	}
	return kept, refused
}

// Equal reports whether two tables grant every claim alike, so that what
// was decided with one holds with the other. Both are built from the same
// inventory snapshot or the answer is false.
func (h *Holders) Equal(o *Holders) bool {
	if h == nil || o == nil {
		return h == o
	}
	same := func(a, b []claim) bool { return slices.Equal(a, b) }
	return h.inv == o.inv && maps.EqualFunc(h.on, o.on, same) && maps.EqualFunc(h.under, o.under, same)
}
