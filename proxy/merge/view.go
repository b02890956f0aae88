package merge

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/trust"
)

// A View is how the answers spell the ids of GPUs that several pods share.
// No one spelling serves every consumer (docs/views.md): NFD and RTE count
// a GPU once only when one sharer has its plain UUID with a NUMA node and
// the others ids they skip; DCGM exporter labels every sharer evenly only
// when each has a "<uuid>::<n>" id; nri-plugins needs every sharer's NUMA
// node, which only the plain UUID carries; Kata cold-plugs what it is
// given, whole. So the proxy serves each view on a socket of its own, and
// each consumer mounts the one it understands. Everything but shared GPUs
// is the same in every view.
type View string

const (
	// Topology is the default view, for the topology counters (NFD
	// topology-updater, resource-topology-exporter): a shared GPU's anchor
	// has the plain UUID with its NUMA node, on its first container
	// sharing it ("<uuid>::0" on its others), every other sharer
	// "<uuid>::<slot>" with no topology, so the GPU is counted once and
	// never free while shared.
	Topology View = "topology"
	// DCGM is for DCGM exporter: every sharer "<uuid>::<slot>", the anchor
	// "<uuid>::0", so that with --kubernetes-virtual-gpus every sharer's
	// series has a vgpu label; its default mode reads "<uuid>::<n>" as
	// <uuid>, the last pod listed winning, which the DCGM view's List
	// order makes the anchor (orderForDCGM).
	DCGM View = "dcgm"
	// Plain is for consumers that read a device's NUMA node (nri-plugins'
	// hints) or hand ids to others (Multus): every sharer has the plain
	// UUID with its NUMA node.
	Plain View = "plain"
	// Kata is for Kata Containers' cold plug, which passes every device it
	// is given through to the pod's VM, whole: a pod sharing a GPU is
	// refused with a reason (Refusal) rather than given a GPU other
	// pods use, or an id CDI cannot resolve. In a List, its shared GPUs
	// are left out.
	Kata View = "kata"
	// Legacy is the topology view with the devices a DRA driver allocated
	// for extended resources moved from dynamic_resources to devices
	// (package dra, docs/dra.md), for consumers that read devices only:
	// NFD, resource-topology-exporter, nri-plugins.
	Legacy View = "legacy"
)

// Views are the views, the default first.
var Views = []View{Topology, DCGM, Plain, Kata, Legacy}

// ParseView returns the view named name.
func ParseView(name string) (View, error) {
	if v := View(name); slices.Contains(Views, v) {
		return v, nil
	}
	return "", fmt.Errorf("unknown view %q: want one of %s", name, viewNames())
}

func viewNames() string {
	names := make([]string, len(Views))
	for i, v := range Views {
		names[i] = string(v)
	}
	return strings.Join(names, ", ")
}

// render returns the id a view reports a container's device id as, and
// false when the view leaves it out.
func render(p *plans.Plan, v View, container string, d model.Device, id string) (string, bool) {
	if !trust.SharedGPU(d, id) {
		return id, true
	}
	s, ok := p.Shares[inventory.IDKey(id)]
	if !ok {
		return id, true
	}
	switch v {
	case Plain:
		return id, true
	case Kata:
		return "", false
	case DCGM:
		return id + "::" + strconv.Itoa(s.Slot), true
	}
	// Topology, the default, and Legacy, which is topology with DRA folded.
	if !s.Anchor {
		return id + "::" + strconv.Itoa(s.Slot), true
	}
	if container == s.First {
		return id, true
	}
	// The anchor's other containers: its slot, without the NUMA node, so
	// that NFD and RTE count the GPU once however many of them share it.
	return id + "::0", true
}

// Refusal is the error a view answers a Get of the plan's pod with
// instead of its devices, nil when it answers them. Only the Kata view
// refuses: Kata's cold plug passes each device it is given through to the
// pod's VM, which would take a GPU other pods share away from them (and a
// "<uuid>::<slot>" id names no CDI device, which fails the sandbox with no
// reason a user can act on). Code FailedPrecondition: the pod cannot run
// under Kata as it is, however often it is retried.
func Refusal(p *plans.Plan, v View, pod model.PodKey) error {
	if p == nil || v != Kata || len(p.Shares) == 0 {
		return nil
	}
	gpus := make([]string, 0, len(p.Shares))
	for _, c := range p.Containers {
		for _, d := range c {
			for _, id := range d.IDs {
				if _, ok := p.Shares[inventory.IDKey(id)]; ok && trust.SharedGPU(d, id) && !slices.Contains(gpus, id) {
					gpus = append(gpus, id)
				}
			}
		}
	}
	slices.Sort(gpus)
	return status.Errorf(codes.FailedPrecondition,
		"podres-proxy: pod %s in namespace %s shares GPU %s with other pods: Kata's cold plug passes whole devices through to the pod's VM and cannot share one; give the pod whole GPUs or run it without Kata",
		pod.Name, pod.Namespace, strings.Join(gpus, ", "))
}

// ReadsDeviceInfo reports whether Multus, the one consumer that reads the
// device-info files of the devices an answer hands out, may read the view:
// the plain view, which docs/views.md gives it, and the default view,
// which is all a node serves unless views are enabled (the chart enables
// none by default), so it is where such a node's Multus reads. The other
// views' consumers (DCGM exporter, Kata, the legacy view's NFD, RTE and
// nri-plugins) never read the files, so their answers never wait for them.
func (v View) ReadsDeviceInfo() bool { return v == Plain || v == Topology }
