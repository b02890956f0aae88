package trust

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// VetPod returns the devices of rec the gate believes, translated by inv and
// spelt as consumers match them, and those it refuses: what Vet refuses, a
// MIG instance carved from a GPU the scheduler did not give the pod
// (vetRecord), what conflicts with another pod's earlier claim (Contest,
// against holders; nil contests nothing), and every annotation edited in
// the API after the pod's sandbox started. problems are the devices inv
// could not translate (allocator.Translate), which are left out. It is pure:
// the caller records and reports the refusals (Report) when they change, so
// a forger costs one warning per change, not one per query.
func (g *Gate) VetPod(rec *record.Record, inv *inventory.Snapshot, holders *Holders) (kept []model.Device, refused []model.Refused, problems []error) {
	kept, refused, problems = g.vetRecord(rec, inv)
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
	return kept, refused, problems
}

// vetRecord is Vet for one of the node's records, its devices translated
// (allocator.Translate, problems) and normalised (devids.NormalizeIDs)
// first, with the rule that needs the pod's annotations: a MIG instance its
// allocator confines to the GPUs the scheduler gave the pod
// (allocator.Carver) counts only on one of them. Believed, one on another
// GPU would make that GPU's real holder a later claimant (contested).
// VetPod, Holders and SharedGPUs all vet through it, so a refused instance
// holds nothing.
func (g *Gate) vetRecord(r *record.Record, inv *inventory.Snapshot) (kept []model.Device, refused []model.Refused, problems []error) {
	devs, problems := allocator.Translate(r.Devices, inv)
	kept, refused = g.Vet(r.Spec, devids.NormalizeIDs(devs), inv)
	var drop []bool
	for i, dev := range kept {
		gpus, confined := g.set.CarvedFrom(dev, r.Annotations)
		for _, id := range dev.IDs {
			parent := migParent(dev, id)
			if !confined || !devids.IsMIG(id) || slices.ContainsFunc(gpus, func(gpu string) bool { return parent != "" && claimKey(gpu) == claimKey(parent) }) {
				continue
			}
			drop = markDropped(drop, len(kept), i)
			refused = append(refused, refusal(dev, ReasonParentNotAllocated, fmt.Sprintf(
				"MIG instance %s is carved from %s, which the scheduler did not give the pod (it gave %s)",
				strconv.Quote(id), strconv.Quote(parent), quoteNames(gpus))))
			break
		}
	}
	return without(kept, drop), refused, problems
}
