// Package plans computes, whenever the pods or the inventory change, what
// the proxy adds to each pod of the kubelet's answers, and keeps it in an
// immutable Table that answers read without computing or writing anything.
//
// A pod's Plan is its decoded devices translated to ids (allocator.Translate),
// vetted by the trust gate against its spec and against the other pods'
// claims (trust.Gate.VetPod, Holders), given their shared-GPU ids
// (trust.SharedGPUs) and attributed to its containers (allocator.Set.Assign).
// All of that depends on the record, on the other records and on the
// inventory, so one function computes it (Builder.build) from one snapshot
// of each, in the background, when either changes. What deciding writes
// (the refusals and shared-GPU slots recorded for `inspect` and restarts,
// the device-info files Multus reads) is written there too, after the
// Table that answers with it is published: the read path only looks up,
// and waits for no write but the device-info files of the devices its
// answer hands out, the first time (Plan.Written).
package plans

import (
	"context"
	"time"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/trust"
)

// Plan is what the proxy adds to one pod of a kubelet answer, the same for
// every view (proxy/merge renders it for one): each container's devices, by
// container name, shared GPUs under their plain UUID, and the pod's share
// of each GPU it shares. Plans are shared by every answer and never
// modified; a pod whose plan changed gets a new one, so the pointer says
// whether an answer built with a plan is still right.
type Plan struct {
	Containers allocator.Assignment
	// Shares is the pod's share of each GPU it shares with other pods, by
	// the GPU's key (inventory.IDKey); nil when it shares none.
	Shares map[string]Share
	// written is closed once the device-info files of the plan's devices
	// are written; nil when it has no such device.
	written chan struct{}
}

// Written returns once the device-info files of the plan's devices are
// written (at once when it has none, or they were), or with ctx's cause:
// Multus reads a VF's file right after the answer that hands the VF out,
// in the same CNI ADD, so that answer waits for it, briefly
// (resolve.DeviceInfoWait); no other does.
func (p *Plan) Written(ctx context.Context) error {
	if p == nil || p.written == nil {
		return nil
	}
	select {
	case <-p.written:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Share is a pod's share of one GPU: its place among the GPU's sharers,
// and the first container in spec order that has it (the one the topology
// view gives the anchor's plain UUID).
type Share struct {
	trust.Share
	First string
}

// Anchors reports whether the plan's pod is the anchor of a shared GPU.
func (p *Plan) Anchors() bool {
	if p == nil {
		return false
	}
	for _, s := range p.Shares {
		if s.Anchor {
			return true
		}
	}
	return false
}

// Table is the plans of every record of one store snapshot and one
// inventory snapshot. It is immutable.
type Table struct {
	pods   *state.Snapshot
	inv    *inventory.Snapshot
	shared *trust.SharedGPUs
	plans  map[string]*Plan // by UID; absent: the pod adds nothing
}

// SharesGPUs reports whether pods of the node share a GPU: when none do,
// every view answers the same.
func (t *Table) SharesGPUs() bool { return !t.shared.Empty() }

// Pods returns the records the table was computed from: look a pod up
// there, so that its record and its plan agree.
func (t *Table) Pods() *state.Snapshot { return t.pods }

// Inventory returns the inventory snapshot the table was computed with,
// which answers where the plans' devices sit.
func (t *Table) Inventory() *inventory.Snapshot { return t.inv }

// Plan returns the plan of the pod with this UID; nil when it adds nothing.
func (t *Table) Plan(uid string) *Plan { return t.plans[uid] }

// Vettable reports whether a record says enough to decide its devices
// without reading the pod from the kubelet: its spec, with the scheduler
// name (trust.Vettable). Without it, its plan refuses every device.
func Vettable(rec *record.Record) bool {
	return len(rec.Devices) == 0 || (rec.Spec != nil && rec.Spec.SchedulerName != "")
}

// entry is a pod's plan and what it was decided from, so that the next
// build can keep it when none of that changed.
type entry struct {
	rec     *record.Record
	plan    *Plan
	refused []model.Refused
	slots   map[string]int
}

// sameInputs reports whether a plan decided from a holds for b: the same
// pod, devices, spec, edits and phase. Records are copied on every change
// (refusals recorded, containers seen), and those copies share their
// devices and spec.
func sameInputs(a, b *record.Record) bool {
	if a == b {
		return true
	}
	return a.UID == b.UID && a.Namespace == b.Namespace && a.Name == b.Name &&
		a.Spec == b.Spec && sameSlice(a.Devices, b.Devices) && sameSlice(a.Edited, b.Edited) &&
		a.Live() == b.Live() && a.State == b.State &&
		seenAt(a.Provenance.Annotations).Equal(seenAt(b.Provenance.Annotations))
}

// seenAt is when a fact was learned; zero when it never was.
func seenAt(s *record.Seen) time.Time {
	if s == nil {
		return time.Time{}
	}
	return s.At
}

// sameSlice reports whether two slices are the same slice (not merely
// equal): records replace, never modify, their slices.
func sameSlice[T any](a, b []T) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
