package allocator

// This file decides whether an allocator annotation is believed. The
// decoders only read what an annotation says; any tenant can write any
// annotation on its own pod, and the proxy's answer moves hardware between
// pods (Multus hands the listed VF to the pod's network, Kata cold-plugs the
// listed devices, DCGM attributes GPUs). So a decoded device is reported only
// when the Gate lets it through; everything it refuses is returned with a
// reason, which the proxy logs, counts and records for `inspect`.

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/proxy/inventory"
	"github.com/podres-proxy/podres-proxy/state"
)

// Reasons a decoded device is refused: the values of state.Refused.Reason
// and of the reason label of podres_proxy_allocations_refused_total.
const (
	// ReasonWrongScheduler: the pod was not placed by a scheduler that
	// writes the allocator's annotation (a copied annotation on a pod of
	// default-scheduler). Class forged.
	ReasonWrongScheduler = "wrong-scheduler"
	// ReasonNoRequest: no container of the pod requests what the device
	// provides, so neither ResourceQuota nor the scheduler ever counted it.
	// Class forged.
	ReasonNoRequest = "no-request"
	// ReasonNotOnNode: the inventory knows this node's devices of the type
	// and the id is not one of them. Class forged.
	ReasonNotOnNode = "not-on-node"
	// ReasonUnsafeID: an id that is not the shape its resource needs (a GPU
	// UUID, a PCI address, a CDI-safe name), such as "all" or one with
	// control characters. Class malformed.
	ReasonUnsafeID = "unsafe-id"
	// ReasonContested: an exclusive device (a whole GPU, a VF, an RDMA PF
	// without VFs, an FPGA) another live pod held first. Class forged.
	ReasonContested = "contested"
	// ReasonEdited: an allocation annotation was changed (or removed) in
	// the API after the pod's sandbox started; the value the runtime
	// started the sandbox with is kept, so the edit is refused. Class
	// forged.
	ReasonEdited = "edited"
	// ReasonSpecUnknown: the pod's spec (its scheduler and requests) was
	// never read, so nothing about the allocation can be checked. Class
	// unvetted.
	ReasonSpecUnknown = "spec-unknown"
)

// Classes group the reasons for operators: a forged annotation names a
// device the pod has no right to; a malformed one names something no device
// can be; an unvetted pod could not be checked yet.
const (
	ClassForged    = "forged"
	ClassMalformed = "malformed"
	ClassUnvetted  = "unvetted"
)

// ReasonClass returns the class of a reason.
func ReasonClass(reason string) string {
	switch reason {
	case ReasonUnsafeID:
		return ClassMalformed
	case ReasonSpecUnknown:
		return ClassUnvetted
	default:
		return ClassForged
	}
}

// DefaultSchedulerNames returns, per allocator, the spec.schedulerName of the
// pods its scheduler places by default: koord-scheduler, hami-scheduler,
// volcano (both of Volcano's device plugins) and tensor-fusion-scheduler.
func DefaultSchedulerNames() map[string][]string {
	return map[string][]string{
		KoordinatorName:     {"koord-scheduler"},
		HAMiName:            {"hami-scheduler"},
		VolcanoVGPUName:     {"volcano"},
		VolcanoGPUShareName: {"volcano"},
		TensorFusionName:    {"tensor-fusion-scheduler"},
	}
}

// Membership is what the Gate asks the node's device inventory:
// *inventory.Snapshot and *inventory.Inventory have it.
type Membership interface {
	// HasType reports whether the inventory looks for devices of the type.
	HasType(typ string) bool
	// Lookup finds a device (or a VF) by id or PCI address.
	Lookup(id string) (inventory.Device, bool)
}

// GateOptions configure a Gate.
type GateOptions struct {
	// SchedulerNames overrides, per allocator name, the scheduler names
	// whose pods the allocator's annotations are believed on; allocators
	// absent keep DefaultSchedulerNames. A cluster where Koordinator
	// replaces the default scheduler sets koordinator: default-scheduler.
	SchedulerNames map[string][]string
	// Log gets one warning per refused device (nil: logrus's standard
	// logger).
	Log logrus.FieldLogger
	// OnRefuse, if set, is called once per refused device with its
	// allocator and reason, for a metric.
	OnRefuse func(allocator, reason string)
}

// Gate is the trust policy: which decoded devices are reported. It is pure
// like the rest of the package (Vet has no side effects; Report logs and
// counts), and safe for concurrent use if OnRefuse is.
type Gate struct {
	set        *Set
	schedulers map[string][]string
	log        logrus.FieldLogger
	onRefuse   func(allocator, reason string)
}

// NewGate returns the gate for the allocators of set. Scheduler names are
// compared exactly; an allocator given an empty list believes no pod.
func NewGate(set *Set, opts GateOptions) *Gate {
	names := DefaultSchedulerNames()
	for alloc, list := range opts.SchedulerNames {
		names[alloc] = slices.Clone(list)
	}
	log := opts.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &Gate{set: set, schedulers: names, log: log, onRefuse: opts.OnRefuse}
}

// SchedulerNames returns the scheduler names an allocator's annotations are
// believed on.
func (g *Gate) SchedulerNames(allocator string) []string {
	return slices.Clone(g.schedulers[allocator])
}

// Vettable reports whether a spec says enough to vet a pod's devices: it
// was read from /pods, with its scheduler name. A record written before the
// scheduler name was kept must be read again first.
func Vettable(spec *state.PodSpec) bool {
	return spec != nil && spec.SchedulerName != ""
}

// Vet splits a pod's decoded (and translated) devices into those reported
// and those refused. A device counts only when all of these hold:
//
//   - the pod's spec.schedulerName is one the device's allocator's
//     scheduler uses;
//   - some container of the pod (init, sidecar or app) requests what the
//     device provides, as its decoder's Wants judges requests;
//   - every id has the shape its resource needs: an NVIDIA resource's ids
//     are GPU-<uuid> or MIG-<uuid> (or MIG-GPU-<uuid>/<gi>/<ci>), an RDMA
//     device's are PCI addresses, any other a CDI-safe name (letters,
//     digits, "-_.:", at most 128 bytes, not "all");
//   - where inv knows devices of the device's type (gpu, rdma, fpga), each
//     id is one of them (a MIG instance is not looked up: the inventory
//     lists whole GPUs).
//
// A device failing one is refused whole, with all its ids: reporting some of
// an RDMA allocation's VFs could hand Multus an arbitrary one. With a nil
// spec, or one without a scheduler name, every device is refused as
// unvetted. When nothing is refused, kept is
// devices itself. devices is never modified; inv may be nil, or lack
// Membership (no membership check).
func (g *Gate) Vet(spec *state.PodSpec, devices []state.Device, inv Inventory) (kept []state.Device, refused []state.Refused) {
	if len(devices) == 0 {
		return devices, nil
	}
	var m Membership
	if !isNil(inv) {
		m, _ = inv.(Membership)
	}
	var drop []bool
	for i, dev := range devices {
		reason, detail := g.check(spec, dev, m)
		if reason == "" {
			continue
		}
		if drop == nil {
			drop = make([]bool, len(devices))
		}
		drop[i] = true
		refused = append(refused, state.Refused{
			Allocator: dev.Allocator,
			Resource:  dev.Resource,
			IDs:       slices.Clone(dev.IDs),
			Reason:    reason,
			Class:     ReasonClass(reason),
			Detail:    detail,
		})
	}
	if drop == nil {
		return devices, nil
	}
	kept = make([]state.Device, 0, len(devices)-len(refused))
	for i, dev := range devices {
		if !drop[i] {
			kept = append(kept, dev)
		}
	}
	return kept, refused
}

// check returns why dev is refused, "" when it is believed.
func (g *Gate) check(spec *state.PodSpec, dev state.Device, inv Membership) (reason, detail string) {
	if !Vettable(spec) {
		return ReasonSpecUnknown, "the pod's spec (scheduler and requests) was never read from the kubelet's /pods"
	}
	if names := g.schedulers[dev.Allocator]; !slices.Contains(names, spec.SchedulerName) {
		return ReasonWrongScheduler, fmt.Sprintf("pod scheduled by %q; %s annotations are believed on pods of %s only",
			spec.SchedulerName, dev.Allocator, quoteNames(names))
	}
	if !slices.ContainsFunc(spec.Containers, func(c state.ContainerSpec) bool { return g.set.requests(dev, c.Requests) }) {
		return ReasonNoRequest, fmt.Sprintf("no container of the pod requests %s", dev.Resource)
	}
	for _, id := range dev.IDs {
		if !safeID(dev, id) {
			return ReasonUnsafeID, fmt.Sprintf("id %s is not a valid %s device id", strconv.Quote(id), dev.Resource)
		}
	}
	if typ := inventoryType(dev); inv != nil && typ != "" && inv.HasType(typ) {
		for _, id := range dev.IDs {
			if isMIG(id) {
				continue
			}
			if d, ok := inv.Lookup(id); !ok || d.Type != typ {
				return ReasonNotOnNode, fmt.Sprintf("id %s is not a %s of this node's inventory", strconv.Quote(id), typ)
			}
		}
	}
	return "", ""
}

func quoteNames(names []string) string {
	if len(names) == 0 {
		return "(none)"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

const uuidPattern = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`

var (
	// gpuIDShape: what DCGM and NVIDIA's CDI specs name a GPU or MIG
	// instance by; case-insensitive, as nvidia-smi and the allocators differ.
	gpuIDShape = regexp.MustCompile(`^(?i)(?:(?:GPU|MIG)-` + uuidPattern + `|MIG-GPU-` + uuidPattern + `/[0-9]{1,3}/[0-9]{1,3})$`)
	// pciShape: a PCI address, domain:bus:device.function (a VMD domain
	// has five digits).
	pciShape = regexp.MustCompile(`^[0-9a-fA-F]{4,5}:[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]$`)
	// cdiSafeShape: a name a CDI device reference ("vendor/class=name")
	// accepts and that no shell, path or log misreads.
	cdiSafeShape = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)
)

// safeID reports whether id has the shape dev's resource needs.
func safeID(dev state.Device, id string) bool {
	if strings.EqualFold(id, "all") {
		return false // CDI's and NVIDIA's name for every device
	}
	switch {
	case strings.HasPrefix(dev.Resource, "nvidia.com/"):
		return gpuIDShape.MatchString(id)
	case dev.Type == inventory.TypeRDMA:
		return pciShape.MatchString(id)
	default:
		return cdiSafeShape.MatchString(id)
	}
}

func isMIG(id string) bool { return len(id) > 4 && strings.EqualFold(id[:4], "MIG-") }

// inventoryType is the inventory's type for a decoded device, "" when the
// inventory has none: Koordinator and Volcano gpushare name gpu, rdma and
// fpga; HAMi and Volcano vGPU name the vendor, and an NVIDIA resource is a
// GPU.
func inventoryType(dev state.Device) string {
	switch t := strings.ToLower(dev.Type); {
	case t == inventory.TypeGPU || t == inventory.TypeRDMA || t == inventory.TypeFPGA:
		return t
	case strings.HasPrefix(dev.Resource, "nvidia.com/"):
		return inventory.TypeGPU
	}
	return ""
}

// Exclusive reports whether a device can be one pod's only: a Koordinator
// allocation of a whole device (a whole GPU, a VF, an RDMA PF without VFs,
// an FPGA). Shared GPUs (a fractional gpu-core, HAMi and Volcano vGPU,
// Volcano gpushare) are shared by design and never contested.
func Exclusive(dev state.Device) bool {
	return dev.Allocator == KoordinatorName && !dev.Shared
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
// learned first (Record.Sources.Annotations.At), then a running sandbox
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
func (g *Gate) Holders(records []*state.Record, inv Inventory) *Holders {
	h := &Holders{byID: map[string]claim{}}
	for _, r := range records {
		if !claimant(r) {
			continue
		}
		devs, _ := Translate(r.Devices, inv)
		kept, _ := g.Vet(r.Spec, devs, inv)
		for _, d := range kept {
			c := claim{uid: r.UID, since: r.Sources.Annotations.At, live: r.Live(), exclusive: Exclusive(d)}
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
func claimant(r *state.Record) bool {
	if r.Sources.Annotations == nil || len(r.Devices) == 0 {
		return false
	}
	if r.KubeletPhase == "Succeeded" || r.KubeletPhase == "Failed" {
		return false
	}
	return r.State == state.PhaseReady || r.State == state.PhasePending
}

// claimKey compares ids as the inventory does: case-insensitively.
func claimKey(id string) string { return strings.ToLower(id) }

// Contest refuses the devices of rec (devices: what Vet kept of them) that
// conflict with another pod's earlier claim on one of their ids: a whole
// device when another pod claimed it first, whole or a share of it; a share
// when another pod holds the device whole. Sharers of a device shared first
// stay shared. A later claimant thus gets none of a device an exclusive
// holder has, and nobody takes whole a GPU others share.
func (g *Gate) Contest(rec *state.Record, devices []state.Device, h *Holders) (kept []state.Device, refused []state.Refused) {
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
			refused = append(refused, state.Refused{
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

// Report logs a warning per refused device, naming the pod and the reason,
// and calls OnRefuse. The proxy calls it once per change of what a pod has
// refused, not once per query.
func (g *Gate) Report(pod state.PodRef, refused []state.Refused) {
	for _, r := range refused {
		g.log.WithFields(logrus.Fields{
			"pod":       pod.Namespace + "/" + pod.Name,
			"uid":       pod.UID,
			"allocator": r.Allocator,
			"resource":  r.Resource,
			"ids":       quoteNames(r.IDs),
			"reason":    r.Reason,
			"class":     r.Class,
		}).Warn("allocation refused, the pod is answered without it: " + r.Detail)
		if g.onRefuse != nil {
			g.onRefuse(r.Allocator, r.Reason)
		}
	}
}
