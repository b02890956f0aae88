package trust

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Holders says which pod holds each device of the node, and what each
// device is part of: a VF of its PF, a MIG instance of its GPU. Build it
// with Gate.Holders; it is immutable.
type Holders struct {
	inv *inventory.Snapshot
	// on holds the claims granted on exactly a device (claimKey), under
	// those granted on a part of it (a VF of the PF, a MIG instance of the
	// GPU), by the device's key.
	on, under map[string][]claim
}

// claim is one pod's claim on a device: the earliest claim on a device
// holds it.
type claim struct {
	uid       string
	since     time.Time
	live      bool
	exclusive bool   // the pod claims the whole device, not a share of it
	id        string // the id claimed, as the pod's answer spells it
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

func (c claim) compare(o claim) int {
	switch {
	case c.before(o):
		return -1
	case o.before(c):
		return 1
	}
	return 0
}

// Holders decides, from every record of the node, which pod holds each
// device: among the running or pending pods whose claim vetRecord
// believes, the one whose allocation annotations were learned first, and
// whether it holds the device whole (then it is the only pod shown with
// it) or a share (then other sharers are shown too, and no pod may take it
// whole). That time is the sandbox's start when NRI or CRI reported the
// pod first, else its first sighting in /pods; it is persisted with the
// record, so a daemon restart keeps the holder, and an annotation edited
// later is learned anew, which makes the editor the later claimant. inv
// translates and checks ids as for the pod's own answer.
//
// A device and its parts contest each other as one device does: whoever
// holds a PF sets its VFs' MAC, VLAN and trust, and a MIG instance is a
// slice of its GPU. So a claim on a PF conflicts with claims on its VFs
// (the inventory, from sysfs physfn/virtfn or a Device object, knows which
// they are), a claim on a GPU with claims on its MIG instances, unless both
// are shares. Claims are granted in order, earliest first, each device of a
// pod only when none of its ids conflicts with a claim already granted, so
// that a claim refused itself never keeps a later one from a device.
func (g *Gate) Holders(records []*record.Record, inv *inventory.Snapshot) *Holders {
	type candidate struct {
		c   claim
		dev model.Device
	}
	var cands []candidate
	for _, r := range records {
		if !claimant(r) {
			continue
		}
		kept, _, _ := g.vetRecord(r, inv)
		for _, d := range kept {
			cands = append(cands, candidate{claim{uid: r.UID, since: r.Provenance.Annotations.At, live: r.Live(), exclusive: g.set.Exclusive(d)}, d})
		}
	}
	slices.SortStableFunc(cands, func(a, b candidate) int { return a.c.compare(b.c) })
	h := &Holders{inv: inv, on: map[string][]claim{}, under: map[string][]claim{}}
	for _, cand := range cands {
		if _, _, found := h.conflict(cand.c.uid, cand.c.exclusive, cand.dev); found {
			continue
		}
		for _, id := range cand.dev.IDs {
			c := cand.c
			c.id = id
			key, parent := h.keys(cand.dev, id)
			h.on[key] = append(h.on[key], c)
			if parent != "" {
				h.under[parent] = append(h.under[parent], c)
			}
		}
	}
	return h
}

// keys returns the key of a device id and the key of the device it is part
// of ("" when none or unknown): a VF's PF as the inventory knows it, a MIG
// instance's GPU.
func (h *Holders) keys(dev model.Device, id string) (key, parent string) {
	key = claimKey(id)
	if devids.IsMIG(id) {
		if p := migParent(dev, id); p != "" {
			parent = claimKey(p)
		}
		return key, parent
	}
	if d, ok := h.inv.Lookup(id); ok && d.PhysFn != "" {
		parent = claimKey(d.PhysFn)
	}
	return key, parent
}

// conflict returns a claim granted to another pod than uid that a claim on
// dev (whole when exclusive) cannot stand beside: one on one of dev's ids,
// on the device an id is part of, or on a part of it; both shares stand
// together. id is dev's id it concerns; false when there is none.
func (h *Holders) conflict(uid string, exclusive bool, dev model.Device) (held claim, id string, found bool) {
	for _, id := range dev.IDs {
		key, parent := h.keys(dev, id)
		lists := [][]claim{h.on[key], h.under[key]}
		if parent != "" {
			lists = append(lists, h.on[parent])
		}
		for _, list := range lists {
			for _, c := range list {
				if c.uid != uid && (exclusive || c.exclusive) {
					return c, id, true
				}
			}
		}
	}
	return claim{}, "", false
}

// migParent returns the GPU a MIG instance id is carved from: the one its
// pre-R470 form names (MIG-GPU-<uuid>/<gi>/<ci>), else the one its
// allocator recorded (Device.Parent); "" when neither says.
func migParent(dev model.Device, id string) string {
	if len(id) > 8 && strings.EqualFold(id[:8], "MIG-GPU-") {
		if gpu, _, ok := strings.Cut(id[4:], "/"); ok {
			return gpu
		}
	}
	return dev.Parent
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

// claimKey compares ids as the inventory does: case-insensitively, PCI
// addresses in sysfs form (a VF written without its domain is still the
// VF the inventory knows).
func claimKey(id string) string { return inventory.IDKey(id) }

// Contest refuses the devices of rec (devices: what Vet kept of them) that
// conflict with another pod's earlier claim (see Holders): a whole device
// when another pod claimed it, a part of it (a VF of the PF, a MIG instance
// of the GPU) or what it is part of first, whole or a share; a share when
// another pod holds one of those whole. Sharers of a device shared first
// stay shared. A later claimant thus gets none of a device an exclusive
// holder has, nor of its PF, VFs, GPU or MIG instances, and nobody takes
// whole a GPU others share.
func (g *Gate) Contest(rec *record.Record, devices []model.Device, h *Holders) (kept []model.Device, refused []model.Refused) {
	if h == nil {
		return devices, nil
	}
	var drop []bool
	for i, d := range devices {
		holder, id, found := h.conflict(rec.UID, g.set.Exclusive(d), d)
		if !found {
			continue
		}
		drop = markDropped(drop, len(devices), i)
		detail := fmt.Sprintf("id %s is held by pod uid %s, which claimed it first (%s, %s)",
			strconv.Quote(holder.id), holder.uid, holder.since.UTC().Format(time.RFC3339Nano), holder.kind())
		if claimKey(holder.id) != claimKey(id) {
			detail = fmt.Sprintf("id %s contests %s (a PF and its VFs, a GPU and its MIG instances are contested as one device); %s",
				strconv.Quote(id), strconv.Quote(holder.id), detail)
		}
		refused = append(refused, refusal(d, ReasonContested, detail))
	}
	return without(devices, drop), refused
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
