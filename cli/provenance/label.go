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

// Label returns the devices of an answer with their origins, pods sorted as
// the table prints them, containers and devices in answer order.
func (p *Evidence) Label(resp proto.Message) []DeviceOrigin {
	kubelet := map[[5]string]bool{}
	for _, o := range devicesOf(p.Kubelet) {
		kubelet[o.key()] = true
	}
	_, allocatable := resp.(*v1.AllocatableResourcesResponse)
	out := devicesOf(resp)
	for i, o := range out {
		numaSource := Unknown
		o.Source = Unknown
		switch f := NUMAOf(p.Inventory, o.DeviceID); {
		case kubelet[o.key()]:
			o.Source, numaSource = Kubelet, Kubelet
		case allocatable && f.known:
			d, _ := p.Inventory.Lookup(o.DeviceID)
			o.Source, numaSource = d.Source, f.sourceOf(o.NUMA)
		case !allocatable:
			rec := recordOf(p.Records, model.PodKey{Namespace: o.Namespace, Name: o.Pod})
			if a := allocatorOf(rec, p.Inventory, o.Resource, o.DeviceID); a != "" {
				// The proxy added it, with the inventory's node.
				o.Source, numaSource = a, f.sourceOf(o.NUMA)
			}
		}
		if len(o.NUMA) > 0 {
			// Without a node there is no node to explain.
			o.NUMASource = numaSource
		}
		out[i] = o
	}
	return out
}

// key identifies a device of one container, or an allocatable device, as
// the kubelet's answer is compared with the proxy's.
func (o DeviceOrigin) key() [5]string {
	return [5]string{o.Namespace, o.Pod, o.Container, o.Resource, o.DeviceID}
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

// devicesOf lists the devices of an answer, one per (pod, container,
// resource, id), or per (resource, id) of GetAllocatableResources, with
// the NUMA nodes the answer gives each; nil for no answer.
func devicesOf(resp proto.Message) []DeviceOrigin {
	if r, ok := resp.(*v1.AllocatableResourcesResponse); ok {
		return byDevice(DeviceOrigin{}, r.GetDevices())
	}
	var out []DeviceOrigin
	for _, pr := range Pods(resp) {
		for _, c := range pr.GetContainers() {
			out = append(out, byDevice(DeviceOrigin{Namespace: pr.GetNamespace(), Pod: pr.GetName(), Container: c.GetName()}, c.GetDevices())...)
		}
	}
	return out
}

// byDevice folds the one-entry-per-device-and-node list of an answer into
// one item per (resource, id), in answer order, each a copy of base.
func byDevice(base DeviceOrigin, devs []*v1.ContainerDevices) []DeviceOrigin {
	var out []DeviceOrigin
	index := map[[2]string]int{}
	for _, d := range devs {
		for _, id := range d.GetDeviceIds() {
			k := [2]string{d.GetResourceName(), id}
			i, ok := index[k]
			if !ok {
				i = len(out)
				index[k] = i
				o := base
				o.Resource, o.DeviceID = d.GetResourceName(), id
				out = append(out, o)
			}
			for _, n := range d.GetTopology().GetNodes() {
				if !slices.Contains(out[i].NUMA, n.GetID()) {
					out[i].NUMA = append(out[i].NUMA, n.GetID())
				}
			}
		}
	}
	return out
}

// Pods returns the pods of a List or Get answer as the tables print them:
// by namespace/name.
func Pods(resp proto.Message) []*v1.PodResources {
	switch r := resp.(type) {
	case *v1.ListPodResourcesResponse:
		out := slices.Clone(r.GetPodResources())
		slices.SortStableFunc(out, func(a, b *v1.PodResources) int {
			return strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
		})
		return out
	case *v1.GetPodResourcesResponse:
		return []*v1.PodResources{r.GetPodResources()}
	}
	return nil
}
