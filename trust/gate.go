package trust

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// Reasons a decoded device is refused: the values of model.Refused.Reason
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
	// ReasonOverRequest: the pod's containers ask for fewer devices of the
	// kind than the annotation names (a pod requesting one whole GPU whose
	// annotation names four); the devices beyond what they ask for, in the
	// annotation's order, are refused. ResourceQuota and the scheduler
	// counted the requests, not the annotation. Class forged.
	ReasonOverRequest = "over-request"
	// ReasonParentNotAllocated: a MIG instance named where the scheduler
	// did not write it (a TensorFusion container's partition-uuids) is
	// carved from a GPU the scheduler did not give the pod; believed, it
	// would keep another pod from that GPU (contested). Class forged.
	ReasonParentNotAllocated = "parent-not-allocated"
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

// GateOptions configure a Gate.
type GateOptions struct {
	// SchedulerNames overrides, per allocator name, the scheduler names
	// whose pods the allocator's annotations are believed on; allocators
	// absent keep their format's (allocator.Set.SchedulerNames). A cluster
	// where Koordinator replaces the default scheduler sets koordinator:
	// default-scheduler.
	SchedulerNames map[string][]string
	// Log gets one warning per refused device (nil: logrus's standard
	// logger).
	Log logrus.FieldLogger
	// Metrics counts each refused device; nil: nothing.
	Metrics Metrics
}

// Metrics receives what the gate counts; the daemon passes its one
// metrics.Metrics, so this package imports no Prometheus. It must be safe
// for concurrent use and must not block.
type Metrics interface {
	// AllocationRefused counts one refused device, by its allocator and
	// the reason it was refused.
	AllocationRefused(allocator, reason string)
}

// Gate is the trust policy: which decoded devices are reported. It is pure
// like the rest of the package (Vet has no side effects; Report logs and
// counts), and safe for concurrent use.
type Gate struct {
	set        *allocator.Set
	schedulers map[string][]string
	log        logrus.FieldLogger
	metrics    Metrics
}

// NewGate returns the gate for the allocators of set. Scheduler names are
// compared exactly; an allocator given an empty list believes no pod.
func NewGate(set *allocator.Set, opts GateOptions) *Gate {
	names := map[string][]string{}
	for alloc, list := range opts.SchedulerNames {
		names[alloc] = slices.Clone(list)
	}
	log := opts.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &Gate{set: set, schedulers: names, log: log, metrics: opts.Metrics}
}

// SchedulerNames returns the scheduler names an allocator's annotations are
// believed on.
func (g *Gate) SchedulerNames(allocator string) []string {
	if names, ok := g.schedulers[allocator]; ok {
		return slices.Clone(names)
	}
	return g.set.SchedulerNames(allocator)
}

// Vettable reports whether a spec says enough to vet a pod's devices: it
// was read from /pods, with its scheduler name. A pod whose spec was never
// read (NRI reported it first) must be read from /pods first.
func Vettable(spec *model.PodSpec) bool {
	return spec != nil && spec.SchedulerName != ""
}

// Vet splits a pod's decoded (and translated) devices into those reported
// and those refused. A device counts only when all of these hold:
//
//   - the pod's spec.schedulerName is one the device's allocator's
//     scheduler uses, or one of another scheduler that writes the same
//     annotation (believedOn);
//   - some container of the pod (init, sidecar or app) requests what the
//     device provides, as its decoder's Wants judges requests;
//   - every id has the shape its resource needs: an NVIDIA resource's ids
//     are GPU-<uuid> or MIG-<uuid> (or MIG-GPU-<uuid>/<gi>/<ci>), an RDMA
//     device's are PCI addresses, any other a CDI-safe name (letters,
//     digits, "-_.:", at most 128 bytes, not "all");
//   - where inv knows devices of the device's type (gpu, rdma, fpga), each
//     id is one of them; a MIG instance, which the inventory does not list,
//     must name its parent GPU (MIG-GPU-<uuid>/<gi>/<ci>, or the device's
//     Parent) and the parent must be one of them;
//   - a pod-level device of an allocator that allocates per pod
//     (allocator.Capped: Koordinator) is within what the pod's containers
//     ask for: of each kind (type, resource), no more devices than
//     allocator.Set.Cap allows, the first ones in the annotation's order
//     kept (over-request).
//
// A device failing one is refused whole, with all its ids: reporting some of
// an RDMA allocation's VFs could hand Multus an arbitrary one. With a nil
// spec, or one without a scheduler name, every device is refused as
// unvetted. When nothing is refused, kept is
// devices itself. devices is never modified; inv may be nil (no
// membership check).
func (g *Gate) Vet(spec *model.PodSpec, devices []model.Device, inv *inventory.Snapshot) (kept []model.Device, refused []model.Refused) {
	if len(devices) == 0 {
		return devices, nil
	}
	var drop []bool
	for i, dev := range devices {
		reason, detail := g.check(spec, dev, inv)
		if reason == "" {
			continue
		}
		drop = markDropped(drop, len(devices), i)
		refused = append(refused, refusal(dev, reason, detail))
	}
	drop, refused = g.overRequest(spec, devices, drop, refused)
	return without(devices, drop), refused
}

// markDropped marks devices[i] in drop, made for n devices on first use,
// so that a pod with nothing refused costs no allocation.
func markDropped(drop []bool, n, i int) []bool {
	if drop == nil {
		drop = make([]bool, n)
	}
	drop[i] = true
	return drop
}

// without returns devices less those drop marks: devices itself when drop
// is nil, else a copy (devices is never modified).
func without(devices []model.Device, drop []bool) []model.Device {
	if drop == nil {
		return devices
	}
	kept := make([]model.Device, 0, len(devices))
	for i, dev := range devices {
		if !drop[i] {
			kept = append(kept, dev)
		}
	}
	return kept
}

func refusal(dev model.Device, reason, detail string) model.Refused {
	return model.Refused{
		Allocator: dev.Allocator,
		Resource:  dev.Resource,
		IDs:       slices.Clone(dev.IDs),
		Reason:    reason,
		Class:     ReasonClass(reason),
		Detail:    detail,
	}
}

// overRequest marks in drop, and adds to refused, in the order of devices,
// the capped pod-level devices (allocator.Set.Cap) not yet dropped that go
// beyond what the pod's containers ask for: Assign would show them all to
// the one container asking.
func (g *Gate) overRequest(spec *model.PodSpec, devices []model.Device, drop []bool, refused []model.Refused) ([]bool, []model.Refused) {
	type kind struct {
		allocator, typ, resource string
		counts                   bool
	}
	seen := map[kind]int64{}
	asks := map[kind]int64{}
	for i, dev := range devices {
		if (drop != nil && drop[i]) || dev.ContainerIndex != nil || dev.Container != "" {
			continue // dropped, or given to one container by its allocator
		}
		k := kind{dev.Allocator, dev.Type, dev.Resource, dev.CountsRequests}
		n, counted := asks[k]
		if !counted {
			var capped bool
			if n, capped = g.set.Cap(spec, dev); !capped {
				continue
			}
			asks[k] = n
		}
		if seen[k]++; seen[k] <= n {
			continue
		}
		drop = markDropped(drop, len(devices), i)
		refused = append(refused, refusal(dev, ReasonOverRequest,
			fmt.Sprintf("the pod's containers ask for %d %s device(s) in all; the annotation names more", n, dev.Resource)))
	}
	return drop, refused
}

// check returns why dev is refused, "" when it is believed.
func (g *Gate) check(spec *model.PodSpec, dev model.Device, inv *inventory.Snapshot) (reason, detail string) {
	if !Vettable(spec) {
		return ReasonSpecUnknown, "the pod's spec (scheduler and requests) was never read from the kubelet's /pods"
	}
	if names := g.believedOn(dev); !slices.Contains(names, spec.SchedulerName) {
		return ReasonWrongScheduler, fmt.Sprintf("pod scheduled by %q; %s annotations are believed on pods of %s only",
			spec.SchedulerName, dev.Allocator, quoteNames(names))
	}
	if !slices.ContainsFunc(spec.Containers, func(c model.ContainerSpec) bool { return g.set.Requests(dev, c.Requests) }) {
		return ReasonNoRequest, fmt.Sprintf("no container of the pod requests %s", dev.Resource)
	}
	for _, id := range dev.IDs {
		if !safeID(dev, id) {
			return ReasonUnsafeID, fmt.Sprintf("id %s is not a valid %s device id", strconv.Quote(id), dev.Resource)
		}
	}
	if typ := devids.InventoryType(dev); typ != "" && inv.HasType(typ) {
		for _, id := range dev.IDs {
			if devids.IsMIG(id) {
				// The inventory lists whole GPUs: the instance is on this
				// node when its parent is.
				parent := migParent(dev, id)
				if d, ok := inv.Lookup(parent); parent == "" || !ok || d.Type != typ {
					return ReasonNotOnNode, fmt.Sprintf("MIG instance %s is not on a %s of this node's inventory (parent %s)",
						strconv.Quote(id), typ, strconv.Quote(parent))
				}
				continue
			}
			if d, ok := inv.Lookup(id); !ok || d.Type != typ {
				return ReasonNotOnNode, fmt.Sprintf("id %s is not a %s of this node's inventory", strconv.Quote(id), typ)
			}
		}
	}
	return "", ""
}

// believedOn returns the scheduler names dev's annotation is believed on:
// those of its allocator, and those of every other allocator whose scheduler
// writes that annotation (allocator.Set.AlsoWrittenBy).
func (g *Gate) believedOn(dev model.Device) []string {
	names := g.SchedulerNames(dev.Allocator)
	for _, other := range g.set.AlsoWrittenBy(dev) {
		names = append(names, g.SchedulerNames(other)...)
	}
	return names
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

// cdiSafeShape: a name a CDI device reference ("vendor/class=name")
// accepts and that no shell, path or log misreads.
var cdiSafeShape = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

// safeID reports whether id has the shape dev's resource needs.
func safeID(dev model.Device, id string) bool {
	if strings.EqualFold(id, "all") {
		return false // CDI's and NVIDIA's name for every device
	}
	switch {
	case strings.HasPrefix(dev.Resource, "nvidia.com/"):
		return devids.IsGPUID(id)
	case dev.Type == inventory.TypeRDMA:
		return devids.IsPCIAddress(id)
	default:
		return cdiSafeShape.MatchString(id)
	}
}

// Report logs a warning per refused device, naming the pod and the reason,
// and counts it in Metrics. The proxy calls it once per change of what a pod has
// refused, not once per query.
func (g *Gate) Report(pod model.PodRef, refused []model.Refused) {
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
		if g.metrics != nil {
			g.metrics.AllocationRefused(r.Allocator, r.Reason)
		}
	}
}
