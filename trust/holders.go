package trust

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Exclusive reports whether a device can be one pod's only: a Koordinator
// allocation of a whole device (a whole GPU, a VF, an RDMA PF without VFs,
// an FPGA). Shared GPUs (a fractional gpu-core, HAMi and Volcano vGPU,
// Volcano gpushare) are shared by design and never contested.
func Exclusive(dev model.Device) bool {
	return dev.Allocator == koordinator.Name && !dev.Shared
}

// Holders says which pod holds each exclusive device id of the node. Build
// it with Gate.Holders; it is immutable.
type Holders struct {
	byID map[string]claim
}

// claim is one pod's claim on an id: the earliest claim on an id holds it.
type claim struct {
	uid       string
	since     time.Time
	live      bool
	exclusive bool // the pod claims the whole device, not a share of it
}

// before reports whether c holds the device rather than o: the claim
// learned first (Record.Provenance.Annotations.At), then a running sandbox
// before a pending pod, then the smaller UID, so that every query and every
// restart picks the same pod.
func (c claim) before(o claim) bool {
	if !c.since.Equal(o.since) {
		return c.since.Before(o.since)
	}
	if c.live != o.live {
		return c.live
	}
	return c.uid < o.uid
}

// Holders decides, from every record of the node, which pod holds each
// device id: among the running or pending pods whose claim Vet believes,
// the one whose allocation annotations were learned first, and whether it
// holds the device whole (then it is the only pod shown with it) or a share
// (then other sharers are shown too, and no pod may take it whole). That
// time is the sandbox's start when NRI or CRI reported the pod first, else
// its first sighting in /pods; it is persisted with the record, so a daemon
// restart keeps the holder, and an annotation edited later is learned anew,
// which makes the editor the later claimant. inv translates and checks ids as
// for the pod's own answer.
func (g *Gate) Holders(records []*record.Record, inv *inventory.Snapshot) *Holders {
	h := &Holders{byID: map[string]claim{}}
	for _, r := range records {
		if !claimant(r) {
			continue
		}
		devs, _ := allocator.Translate(r.Devices, inv)
		kept, _ := g.Vet(r.Spec, devs, inv)
		for _, d := range kept {
			c := claim{uid: r.UID, since: r.Provenance.Annotations.At, live: r.Live(), exclusive: Exclusive(d)}
			for _, id := range d.IDs {
				k := claimKey(id)
				if cur, ok := h.byID[k]; !ok || c.before(cur) {
					h.byID[k] = c
				}
			}
		}
	}
	return h
}

func (c claim) kind() string {
	if c.exclusive {
		return "whole"
	}
	return "a share"
}

// claimant reports whether a record's devices can hold a device: a running
// or pending pod the kubelet does not consider finished, with annotations.
func claimant(r *record.Record) bool {
	if r.Provenance.Annotations == nil || len(r.Devices) == 0 {
		return false
	}
	if r.KubeletPhase == "Succeeded" || r.KubeletPhase == "Failed" {
		return false
	}
	return r.State == record.PhaseReady || r.State == record.PhasePending
}

// claimKey compares ids as the inventory does: case-insensitively.
func claimKey(id string) string { return strings.ToLower(id) }

// Contest refuses the devices of rec (devices: what Vet kept of them) that
// conflict with another pod's earlier claim on one of their ids: a whole
// device when another pod claimed it first, whole or a share of it; a share
// when another pod holds the device whole. Sharers of a device shared first
// stay shared. A later claimant thus gets none of a device an exclusive
// holder has, and nobody takes whole a GPU others share.
func (g *Gate) Contest(rec *record.Record, devices []model.Device, h *Holders) (kept []model.Device, refused []model.Refused) {
	if h == nil {
		return devices, nil
	}
	var drop []bool
	for i, d := range devices {
		exclusive := Exclusive(d)
		for _, id := range d.IDs {
			holder, ok := h.byID[claimKey(id)]
			if !ok || holder.uid == rec.UID || (!exclusive && !holder.exclusive) {
				continue
			}
			if drop == nil {
				drop = make([]bool, len(devices))
			}
			drop[i] = true
			refused = append(refused, model.Refused{
				Allocator: d.Allocator, Resource: d.Resource, IDs: slices.Clone(d.IDs),
				Reason: ReasonContested, Class: ReasonClass(ReasonContested),
				Detail: fmt.Sprintf("id %s is held by pod uid %s, which claimed it first (%s, %s)",
					strconv.Quote(id), holder.uid, holder.since.UTC().Format(time.RFC3339Nano), holder.kind()),
			})
			break
		}
	}
	if drop == nil {
		return devices, nil
	}
	for i, d := range devices {
		if !drop[i] {
			kept = append(kept, d)
		}
	}
	return kept, refused
}
