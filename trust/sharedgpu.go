package trust

// This file decides, for every GPU that live pods share (Device.Shared: a
// fractional Koordinator gpu-core, a HAMi or Volcano vGPU), each sharer's
// place: which one is the anchor and which slot every other one has. How
// those facts become device ids is a view's choice (proxy/merge's views:
// topology, dcgm, plain, kata), since no single spelling serves every
// consumer (docs/views.md).
//
//   - the GPU's first live sharer, in the trust gate's claim order (the
//     claim learned first, then a running sandbox, then the smaller UID),
//     is its anchor: the topology view reports it exactly as an exclusive
//     GPU, so that NFD and RTE count the GPU once, through it;
//   - every other sharer has a slot >= 1: the lowest one free among the
//     GPU's live sharers when the pod first shares it, then kept as long as
//     the pod shares the GPU, whoever leaves or joins, daemon restarts
//     included (the proxy records it in the pod's record,
//     Record.GPUSlots); it is what DCGM's vgpu label shows.
//
// When the anchor leaves, the next sharer in claim order becomes the anchor
// (it keeps no slot): a GPU that is still shared must stay counted once.

import (
	"maps"
	"slices"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// SharedGPUs is the id of every sharer of every shared GPU of the node.
// Build it with Gate.SharedGPUs; it is immutable, so a
// pointer identifies its content.
type SharedGPUs struct {
	gpus map[string]*gpuSharers // by claimKey of the GPU UUID
}

// gpuSharers are one GPU's live sharers.
type gpuSharers struct {
	anchor string         // the pod reported under the plain UUID
	slots  map[string]int // every other sharer's slot, by pod UID
}

// sharer is one pod's claim on a share of one GPU, and the slot its record
// says it had (0: none).
type sharer struct {
	gpu   string
	claim claim
	slot  int
}

// sharedGPU reports whether dev is a share of a GPU whose sharers get slot
// ids: a shared device of the gpu inventory type (NVIDIA's UUIDs; a MIG
// instance is a device of its own and never shared this way).
func sharedGPU(dev model.Device) bool {
	return dev.Shared && devids.InventoryType(dev) == "gpu"
}

// gpuUUID reports whether id names a whole GPU by UUID ("GPU-...").
func gpuUUID(id string) bool { return len(id) > 4 && strings.EqualFold(id[:4], "GPU-") }

// SharedGPUs decides the ids of the sharers of every GPU from every record
// of the node: the pods Holders counts as claimants, their devices
// translated, normalised and believed as for their own answers. prev is the
// table the last call returned (nil at start): a pod that keeps sharing a
// GPU keeps its slot.
func (g *Gate) SharedGPUs(prev *SharedGPUs, records []*record.Record, inv *inventory.Snapshot) *SharedGPUs {
	var sharers []sharer
	for _, r := range records {
		if !claimant(r) {
			continue
		}
		devs, _, _ := g.vetRecord(r, inv)
		c := claim{uid: r.UID, since: r.Provenance.Annotations.At, live: r.Live()}
		for _, d := range devs {
			if !sharedGPU(d) {
				continue
			}
			for _, id := range d.IDs {
				if gpuUUID(id) {
					sharers = append(sharers, sharer{gpu: claimKey(id), claim: c, slot: r.GPUSlots[claimKey(id)]})
				}
			}
		}
	}
	return nextSharedGPUs(prev, sharers)
}

// nextSharedGPUs builds the table for these claims, keeping prev's slots,
// else those the records kept. It is deterministic: the same claims and
// prev give the same table.
func nextSharedGPUs(prev *SharedGPUs, sharers []sharer) *SharedGPUs {
	byGPU := map[string][]claim{}
	recorded := map[string]map[string]int{} // gpu -> uid -> slot
	for _, s := range sharers {
		if !slices.ContainsFunc(byGPU[s.gpu], func(c claim) bool { return c.uid == s.claim.uid }) {
			byGPU[s.gpu] = append(byGPU[s.gpu], s.claim)
		}
		if s.slot > 0 {
			if recorded[s.gpu] == nil {
				recorded[s.gpu] = map[string]int{}
			}
			recorded[s.gpu][s.claim.uid] = s.slot
		}
	}
	out := &SharedGPUs{gpus: make(map[string]*gpuSharers, len(byGPU))}
	for gpu, claims := range byGPU {
		slices.SortFunc(claims, claim.compare) // the smaller UID breaks every tie
		g := &gpuSharers{anchor: claims[0].uid, slots: map[string]int{}}
		old := recorded[gpu]
		if prev != nil && prev.gpus[gpu] != nil {
			old = prev.gpus[gpu].slots
		}
		taken := map[int]bool{}
		// Sharers keep the slots they had, the earlier claim winning a
		// clash (a table rebuilt from records never has one).
		for _, c := range claims[1:] {
			if s, ok := old[c.uid]; ok && !taken[s] {
				g.slots[c.uid], taken[s] = s, true
			}
		}
		next := 1
		for _, c := range claims[1:] {
			if _, ok := g.slots[c.uid]; ok {
				continue
			}
			for taken[next] {
				next++
			}
			g.slots[c.uid], taken[next] = next, true
		}
		out.gpus[gpu] = g
	}
	return out
}

// Share is one pod's place among the sharers of one GPU: the facts every
// view renders its ids from (proxy/merge's views).
type Share struct {
	// Anchor is true for the GPU's first live sharer, the one the
	// topology view reports under the plain UUID.
	Anchor bool
	// Slot is the sharer's slot, >= 1; 0 for the anchor.
	Slot int
}

// ShareOf returns the share of the GPU id that the pod with this UID has,
// and false when the id is no GPU that live pods share, the pod is not
// among its sharers, or the table is nil.
func (s *SharedGPUs) ShareOf(uid, id string) (Share, bool) {
	if s == nil {
		return Share{}, false
	}
	g := s.gpus[claimKey(id)]
	if g == nil {
		return Share{}, false
	}
	if g.anchor == uid {
		return Share{Anchor: true}, true
	}
	slot, ok := g.slots[uid]
	return Share{Slot: slot}, ok
}

// SharedGPU reports whether id, one of dev's ids, is the plain UUID of a
// GPU of which dev is a share: the ids the views render.
func SharedGPU(dev model.Device, id string) bool {
	return sharedGPU(dev) && gpuUUID(id) && !strings.Contains(id, "::")
}

// Slots returns the slot of every GPU (by lower-case UUID) the pod with
// this UID shares as other than its first sharer, for Record.GPUSlots; nil
// when there is none.
func (s *SharedGPUs) Slots(uid string) map[string]int {
	if s == nil {
		return nil
	}
	var out map[string]int
	for gpu, g := range s.gpus {
		if slot, ok := g.slots[uid]; ok {
			if out == nil {
				out = map[string]int{}
			}
			out[gpu] = slot
		}
	}
	return out
}

// Empty reports whether no GPU is shared.
func (s *SharedGPUs) Empty() bool { return s == nil || len(s.gpus) == 0 }

// Equal reports whether two tables give every pod the same ids, so that a
// caller keeps the old one (and what it decided with it) when nothing
// changed.
func (s *SharedGPUs) Equal(o *SharedGPUs) bool {
	if s == nil || o == nil {
		return s == o
	}
	return maps.EqualFunc(s.gpus, o.gpus, func(a, b *gpuSharers) bool {
		return a.anchor == b.anchor && maps.Equal(a.slots, b.slots)
	})
}
