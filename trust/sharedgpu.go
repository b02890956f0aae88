package trust

// This file gives the sharers of one GPU ids that stock consumers tell
// apart, without changing how many GPUs they count.
//
// DCGM exporter attributes a GPU's metrics from List: in its default mode
// one pod per device id (an id "<uuid>::<n>" counts as <uuid>; last writer
// wins); with --kubernetes-virtual-gpus every pod listed with the device,
// each series labelled vgpu=<n> from the "::<n>" suffix (NVIDIA's device
// plugin names time-slicing and MPS replicas that way). NFD's
// topology-updater subtracts, per NUMA node, each listed id it finds in
// GetAllocatableResources and ignores the others; RTE counts every listed
// entry that carries a NUMA topology. So, for each GPU that live pods share
// (Device.Shared: a fractional Koordinator gpu-core, a HAMi or Volcano vGPU):
//
//   - the GPU's first live sharer, in the trust gate's claim order (the
//     claim learned first, then a running sandbox, then the smaller UID),
//     is its anchor: it is reported under the plain UUID, with the GPU's
//     NUMA node, exactly as an exclusive GPU is. NFD and RTE count the
//     GPU once, through it, and never negative;
//   - every other sharer is reported as "<uuid>::<slot>", slot >= 1, with
//     no topology (NFD ignores the id, RTE does not count it). The slot is
//     the lowest one free among the GPU's live sharers when the pod first
//     shares it, and then kept as long as the pod shares the GPU, whoever
//     leaves or joins, daemon restarts included (the proxy records it in
//     the pod's record, Record.GPUSlots); it is what DCGM's vgpu label
//     shows.
//
// The anchor pod's plain UUID is on its first container sharing the GPU
// only; its other containers sharing it show "<uuid>::0" (OnePlainPerPod).
//
// When the anchor leaves, the next sharer in claim order becomes the anchor
// and is reported under the plain UUID from then on (its vgpu label goes):
// a GPU that is still shared must stay counted once, and NFD counts only
// ids GetAllocatableResources lists.

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator"
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

// SharedGPUID returns the id the pod with this UID is reported with for the
// GPU id: the id itself for the GPU's anchor, for an id that is no shared
// GPU, and on a nil table; "<id>::<slot>" for the GPU's other sharers.
func (s *SharedGPUs) SharedGPUID(uid, id string) string {
	if s == nil {
		return id
	}
	g := s.gpus[claimKey(id)]
	if g == nil || g.anchor == uid {
		return id
	}
	slot, ok := g.slots[uid]
	if !ok {
		return id
	}
	return id + "::" + strconv.Itoa(slot)
}

// Rewrite returns devs, the believed devices of the pod with this UID, with
// each shared GPU id replaced by SharedGPUID. devs is never modified; when
// nothing changes the result is devs itself.
func (s *SharedGPUs) Rewrite(uid string, devs []model.Device) []model.Device {
	if s == nil || len(s.gpus) == 0 {
		return devs
	}
	return model.MapIDs(devs, func(d model.Device, id string) string {
		if !sharedGPU(d) {
			return id
		}
		return s.SharedGPUID(uid, id)
	})
}

// sharedGPU reports whether dev is a share of a GPU whose sharers get slot
// ids: a shared device of the gpu inventory type (NVIDIA's UUIDs; a MIG
// instance is a device of its own and never shared this way).
func sharedGPU(dev model.Device) bool {
	return dev.Shared && allocator.InventoryType(dev) == "gpu"
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
		devs, _ := allocator.Translate(r.Devices, inv)
		devs = allocator.NormalizeIDs(devs)
		devs, _ = g.Vet(r.Spec, devs, inv)
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
		slices.SortFunc(claims, func(a, b claim) int {
			switch {
			case a.before(b):
				return -1
			case b.before(a):
				return 1
			}
			return cmp.Compare(a.uid, b.uid)
		})
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

// OnePlainPerPod keeps a shared GPU's plain UUID on the first container of
// the pod that has it, in spec order (the kubelet's order: sidecars before
// app containers), and reports the pod's other containers sharing it as
// "<uuid>::0": the anchor's slot, told apart by container in DCGM, with no
// NUMA node, so that NFD and RTE still count the GPU once when a pod's
// several containers share it (Koordinator gives a shared GPU to every
// container asking a share; HAMi lists the same GPU in several entries).
// a is never modified; when nothing changes the result is a itself.
func OnePlainPerPod(spec *model.PodSpec, a allocator.Assignment) allocator.Assignment {
	if spec == nil || len(a) < 2 {
		return a
	}
	seen := map[string]bool{}
	var out allocator.Assignment
	for _, c := range spec.Containers {
		devs, ok := a[c.Name]
		if !ok {
			continue
		}
		var again []string // plain shared GPU ids an earlier container has
		for _, d := range devs {
			if !sharedGPU(d) {
				continue
			}
			for _, id := range d.IDs {
				if !gpuUUID(id) || strings.Contains(id, "::") {
					continue
				}
				if seen[claimKey(id)] {
					again = append(again, id)
				}
			}
		}
		for _, d := range devs {
			if sharedGPU(d) {
				for _, id := range d.IDs {
					if gpuUUID(id) && !strings.Contains(id, "::") {
						seen[claimKey(id)] = true
					}
				}
			}
		}
		if len(again) == 0 {
			continue
		}
		if out == nil {
			out = maps.Clone(a)
		}
		rewritten := slices.Clone(devs)
		for i, d := range rewritten {
			if !sharedGPU(d) {
				continue
			}
			ids := slices.Clone(d.IDs)
			for j, id := range ids {
				if slices.Contains(again, id) {
					ids[j] = id + "::0"
				}
			}
			rewritten[i].IDs = ids
		}
		out[c.Name] = rewritten
	}
	if out == nil {
		return a
	}
	return out
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
