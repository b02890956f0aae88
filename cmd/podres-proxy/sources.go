package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

// deviceOrigin is one device of a PodResources answer and where it came
// from; query --sources prints one per (pod, container, resource, id), or
// per (resource, id) of GetAllocatableResources. Its JSON form is part of
// query's documented output (docs/inventory.md).
type deviceOrigin struct {
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

// provenance is what query --sources labels an answer's devices with. Each
// part is nil when it could not be read; a note on stderr says so and the
// devices it would have explained are labelled unknown.
type provenance struct {
	kubelet proto.Message       // the kubelet's answer to the same question
	records []*state.Record     // the state store's records
	inv     *inventory.Snapshot // the inventory serve published
}

// podDevice identifies a device of one container, as the kubelet's answer
// is compared with the proxy's.
type podDevice struct {
	namespace, pod, container, resource, id string
}

// kubeletDevices indexes the kubelet's answer; ok is false when there is
// none to compare with.
func (p *provenance) kubeletDevices() (pods map[podDevice]bool, allocatable map[[2]string]bool, ok bool) {
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
	switch r := p.kubelet.(type) {
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

// label returns the devices of an answer with their origins, pods sorted as
// the table prints them, containers and devices in answer order.
func (p *provenance) label(resp proto.Message) []deviceOrigin {
	kubeletPods, kubeletAllocatable, haveKubelet := p.kubeletDevices()
	var out []deviceOrigin
	switch r := resp.(type) {
	case *v1.ListPodResourcesResponse:
		for _, pr := range sortedPods(r.GetPodResources()) {
			out = append(out, p.labelPod(pr, kubeletPods, haveKubelet)...)
		}
	case *v1.GetPodResourcesResponse:
		out = p.labelPod(r.GetPodResources(), kubeletPods, haveKubelet)
	case *v1.AllocatableResourcesResponse:
		for _, g := range byDevice(r.GetDevices()) {
			o := deviceOrigin{Resource: g.resource, DeviceID: g.id, NUMA: g.numa, Source: originUnknown}
			if haveKubelet && kubeletAllocatable[[2]string{g.resource, g.id}] {
				o.Source, o.NUMASource = originKubelet, numaSource(g.numa, originKubelet)
			} else if f := numaOf(p.inv, g.id); f.known {
				d, _ := p.inv.Lookup(g.id)
				o.Source, o.NUMASource = d.Source, numaSource(g.numa, f.sourceOf(g.numa))
			} else {
				o.NUMASource = numaSource(g.numa, originUnknown)
			}
			out = append(out, o)
		}
	}
	return out
}

func (p *provenance) labelPod(pr *v1.PodResources, kubelet map[podDevice]bool, haveKubelet bool) []deviceOrigin {
	rec := recordOf(p.records, model.PodKey{Namespace: pr.GetNamespace(), Name: pr.GetName()})
	var out []deviceOrigin
	for _, c := range pr.GetContainers() {
		for _, g := range byDevice(c.GetDevices()) {
			o := deviceOrigin{Namespace: pr.GetNamespace(), Pod: pr.GetName(), Container: c.GetName(),
				Resource: g.resource, DeviceID: g.id, NUMA: g.numa, Source: originUnknown}
			switch {
			case haveKubelet && kubelet[podDevice{pr.GetNamespace(), pr.GetName(), c.GetName(), g.resource, g.id}]:
				o.Source, o.NUMASource = originKubelet, numaSource(g.numa, originKubelet)
			default:
				if a := allocatorOf(rec, p.inv, g.resource, g.id); a != "" {
					// The proxy added it, with the inventory's node.
					o.Source = a
					o.NUMASource = numaSource(g.numa, numaOf(p.inv, g.id).sourceOf(g.numa))
				} else {
					o.NUMASource = numaSource(g.numa, originUnknown)
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
func (f numaFacts) sourceOf(numa []int64) string {
	if !f.known || f.numa == nil || !slices.Equal(numa, []int64{*f.numa}) {
		return originUnknown
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

// printOrigins prints one row per device with its origins.
func printOrigins(out io.Writer, resp proto.Message, origins []deviceOrigin) error {
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	if _, ok := resp.(*v1.AllocatableResourcesResponse); ok {
		fmt.Fprintln(w, "RESOURCE\tDEVICE\tNUMA\tSOURCE\tNUMA-SOURCE")
		for _, o := range origins {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", o.Resource, o.DeviceID, orDash(ints(o.NUMA)), o.Source, orDash(o.NUMASource))
		}
		return w.Flush()
	}
	fmt.Fprintln(w, "NAMESPACE\tPOD\tCONTAINER\tRESOURCE\tDEVICE\tNUMA\tSOURCE\tNUMA-SOURCE")
	for _, o := range origins {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.Namespace, o.Pod, o.Container, o.Resource, o.DeviceID,
			orDash(ints(o.NUMA)), o.Source, orDash(o.NUMASource))
	}
	return w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// withOrigins adds "deviceSources" to the answer's JSON object. The answer's
// own fields stay exactly as without --sources, so that jq filters written
// for the plain answer keep working.
func withOrigins(answer []byte, origins []deviceOrigin) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(answer, &obj); err != nil {
		return nil, fmt.Errorf("encode answer: not a JSON object: %w", err)
	}
	if origins == nil {
		origins = []deviceOrigin{}
	}
	b, err := json.Marshal(origins)
	if err != nil {
		return nil, fmt.Errorf("encode device sources: %w", err)
	}
	if obj == nil {
		obj = map[string]json.RawMessage{}
	}
	obj["deviceSources"] = b
	return json.MarshalIndent(obj, "", "  ")
}

// sortedPods orders pods as the table prints them: by namespace/name.
func sortedPods(pods []*v1.PodResources) []*v1.PodResources {
	out := slices.Clone(pods)
	slices.SortStableFunc(out, func(a, b *v1.PodResources) int {
		return strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
	})
	return out
}
