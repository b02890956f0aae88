package provenance

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// DeviceOrigin is one device of a PodResources answer and where it came
// from; query --sources prints one per (pod, container, resource, id), or
// per (resource, id) of GetAllocatableResources. Its JSON form is part of
// query's documented output (docs/inventory.md).
type DeviceOrigin struct {
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Resource  string `json:"resource"`
	DeviceID  string `json:"deviceId"`
	// NUMA are the nodes the answer gives the device, in answer order.
	NUMA []int64 `json:"numa,omitempty"`
	// Source is "kubelet" when the kubelet's own answer has the device;
	// otherwise, for a pod's device, the allocator whose annotation the
	// state store decoded it from, and for an allocatable device, the
	// inventory source that reported it; "unknown" when none accounts for
	// it.
	Source string `json:"source"`
	// NUMASource is where NUMA came from: "kubelet" for the kubelet's
	// devices, the inventory source (device-cr, file, sysfs) for added
	// ones, "unknown" when the inventory cannot say; absent without NUMA.
	NUMASource string `json:"numaSource,omitempty"`
}

// Evidence is what query --sources labels an answer's devices with. Each
// part is nil when it could not be read; query notes that on stderr, and the
// devices it would have explained are labelled unknown.
type Evidence struct {
	Kubelet   proto.Message       // the kubelet's answer to the same question
	Records   []*record.Record    // the state store's records
	Inventory *inventory.Snapshot // the inventory serve published
}

// podDevice identifies a device of one container, as the kubelet's answer
// is compared with the proxy's.
type podDevice struct {
	namespace, pod, container, resource, id string
}

// kubeletDevices indexes the kubelet's answer; ok is false when there is
// none to compare with.
func (p *Evidence) kubeletDevices() (pods map[podDevice]bool, allocatable map[[2]string]bool, ok bool) {
	pods, allocatable = map[podDevice]bool{}, map[[2]string]bool{}
	addPod := func(pr *v1.PodResources) {
		for _, c := range pr.GetContainers() {
			for _, d := range c.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					pods[podDevice{pr.GetNamespace(), pr.GetName(), c.GetName(), d.GetResourceName(), id}] = true
				}
			}
		}
	}
	switch r := p.Kubelet.(type) {
	case *v1.ListPodResourcesResponse:
		for _, pr := range r.GetPodResources() {
			addPod(pr)
		}
	case *v1.GetPodResourcesResponse:
		addPod(r.GetPodResources())
	case *v1.AllocatableResourcesResponse:
		for _, d := range r.GetDevices() {
			for _, id := range d.GetDeviceIds() {
				allocatable[[2]string{d.GetResourceName(), id}] = true
			}
		}
	default:
		return nil, nil, false
	}
	return pods, allocatable, true
}

// Label returns the devices of an answer with their origins, pods sorted as
// the table prints them, containers and devices in answer order.
func (p *Evidence) Label(resp proto.Message) []DeviceOrigin {
	kubeletPods, kubeletAllocatable, haveKubelet := p.kubeletDevices()
	var out []DeviceOrigin
	switch r := resp.(type) {
	case *v1.ListPodResourcesResponse:
		for _, pr := range SortedPods(r.GetPodResources()) {
			out = append(out, p.labelPod(pr, kubeletPods, haveKubelet)...)
		}
	case *v1.GetPodResourcesResponse:
		out = p.labelPod(r.GetPodResources(), kubeletPods, haveKubelet)
	case *v1.AllocatableResourcesResponse:
		for _, g := range byDevice(r.GetDevices()) {
			o := DeviceOrigin{Resource: g.resource, DeviceID: g.id, NUMA: g.numa, Source: Unknown}
			if haveKubelet && kubeletAllocatable[[2]string{g.resource, g.id}] {
				o.Source, o.NUMASource = Kubelet, numaSource(g.numa, Kubelet)
			} else if f := NUMAOf(p.Inventory, g.id); f.known {
				d, _ := p.Inventory.Lookup(g.id)
				o.Source, o.NUMASource = d.Source, numaSource(g.numa, f.sourceOf(g.numa))
			} else {
				o.NUMASource = numaSource(g.numa, Unknown)
			}
			out = append(out, o)
		}
	}
	return out
}

func (p *Evidence) labelPod(pr *v1.PodResources, kubelet map[podDevice]bool, haveKubelet bool) []DeviceOrigin {
	rec := recordOf(p.Records, model.PodKey{Namespace: pr.GetNamespace(), Name: pr.GetName()})
	var out []DeviceOrigin
	for _, c := range pr.GetContainers() {
		for _, g := range byDevice(c.GetDevices()) {
			o := DeviceOrigin{Namespace: pr.GetNamespace(), Pod: pr.GetName(), Container: c.GetName(),
				Resource: g.resource, DeviceID: g.id, NUMA: g.numa, Source: Unknown}
			switch {
			case haveKubelet && kubelet[podDevice{pr.GetNamespace(), pr.GetName(), c.GetName(), g.resource, g.id}]:
				o.Source, o.NUMASource = Kubelet, numaSource(g.numa, Kubelet)
			default:
				if a := allocatorOf(rec, p.Inventory, g.resource, g.id); a != "" {
					// The proxy added it, with the inventory's node.
					o.Source = a
					o.NUMASource = numaSource(g.numa, NUMAOf(p.Inventory, g.id).sourceOf(g.numa))
				} else {
					o.NUMASource = numaSource(g.numa, Unknown)
				}
			}
			out = append(out, o)
		}
	}
	return out
}

// sourceOf returns the inventory source of the node an answer gave a
// device, "unknown" when the inventory does not put it on those nodes (no
// inventory, or it changed since the answer).
func (f NUMAFacts) sourceOf(numa []int64) string {
	if !f.known || f.numa == nil || !slices.Equal(numa, []int64{*f.numa}) {
		return Unknown
	}
	return f.source
}

// numaSource is source when the answer gave the device NUMA nodes, "" when
// it gave none: there is then no node to explain.
func numaSource(numa []int64, source string) string {
	if len(numa) == 0 {
		return ""
	}
	return source
}

type oneDevice struct {
	resource, id string
	numa         []int64
}

// byDevice folds the one-entry-per-device-and-node list of an answer into
// one item per (resource, id), in answer order.
func byDevice(devs []*v1.ContainerDevices) []oneDevice {
	var out []oneDevice
	index := map[[2]string]int{}
	for _, d := range devs {
		for _, id := range d.GetDeviceIds() {
			k := [2]string{d.GetResourceName(), id}
			i, ok := index[k]
			if !ok {
				i = len(out)
				index[k] = i
				out = append(out, oneDevice{resource: d.GetResourceName(), id: id})
			}
			for _, n := range d.GetTopology().GetNodes() {
				if !slices.Contains(out[i].numa, n.GetID()) {
					out[i].numa = append(out[i].numa, n.GetID())
				}
			}
		}
	}
	return out
}

// SortedPods orders pods as the table prints them: by namespace/name.
func SortedPods(pods []*v1.PodResources) []*v1.PodResources {
	out := slices.Clone(pods)
	slices.SortStableFunc(out, func(a, b *v1.PodResources) int {
		return strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
	})
	return out
}
