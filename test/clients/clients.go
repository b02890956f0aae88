// Package clients calls the PodResources API the way the real consumers do,
// so tests can show that each of them, unmodified, sees the added devices.
// Each function reproduces what its consumer asks (method, API version,
// timeout, message size limit) and how it reads the answer; the facts come
// from reading those consumers, summarised in the project's reference notes.
package clients

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
)

const (
	// The conventional client limits (kubelet e2e, Multus, NFD, RTE, Kata).
	conventionalTimeout = 10 * time.Second
	conventionalMaxSize = 16 << 20
	// gRPC's default, which DCGM exporter and Antrea keep.
	grpcDefaultMaxSize = 4 << 20
)

func dial(socket string, maxSize int) (*grpc.ClientConn, error) {
	target := socket
	if !strings.HasPrefix(target, "unix:") {
		target = "unix://" + socket
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxSize)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", socket, err)
	}
	return conn, nil
}

// listV1 calls v1 List the way a client with these limits does: a new
// connection, a 10 s deadline.
func listV1(ctx context.Context, socket string, maxSize int) (*v1.ListPodResourcesResponse, error) {
	conn, err := dial(socket, maxSize)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, conventionalTimeout)
	defer cancel()
	return v1.NewPodResourcesListerClient(conn).List(ctx, &v1.ListPodResourcesRequest{})
}

// listV1alpha1 is listV1 for the v1alpha1 service.
func listV1alpha1(ctx context.Context, socket string, maxSize int) (*v1alpha1.ListPodResourcesResponse, error) {
	conn, err := dial(socket, maxSize)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, conventionalTimeout)
	defer cancel()
	return v1alpha1.NewPodResourcesListerClient(conn).List(ctx, &v1alpha1.ListPodResourcesRequest{})
}

// getV1 calls v1 Get for one pod with the conventional 16 MiB limit.
func getV1(ctx context.Context, socket, namespace, name string) (*v1.PodResources, error) {
	conn, err := dial(socket, conventionalMaxSize)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, conventionalTimeout)
	defer cancel()
	resp, err := v1.NewPodResourcesListerClient(conn).Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	return resp.GetPodResources(), err
}

// idsV1 collects, in answer order, the device ids under resourceName of
// every container of the pods named namespace/name (matched by name, as
// clients do: there is no UID).
func idsV1(pods []*v1.PodResources, namespace, name, resourceName string) []string {
	var ids []string
	for _, p := range pods {
		if p.GetNamespace() != namespace || p.GetName() != name {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resourceName {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	return ids
}

// idsV1alpha1 is idsV1 for v1alpha1 answers.
func idsV1alpha1(pods []*v1alpha1.PodResources, namespace, name, resourceName string) []string {
	var ids []string
	for _, p := range pods {
		if p.GetNamespace() != namespace || p.GetName() != name {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resourceName {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	return ids
}

// MultusDeviceIDs is what Multus (v3.7.2 and later, thin and thick) hands to
// a delegate CNI during CNI ADD: it calls v1 List (10 s, 16 MiB), takes every
// PodResources whose namespace and name match (no UID), and collects the
// device ids of every container, in answer order, under the resource name
// its NetworkAttachmentDefinition names. An error fails the CNI ADD.
func MultusDeviceIDs(ctx context.Context, socket, namespace, name, resourceName string) ([]string, error) {
	resp, err := listV1(ctx, socket, conventionalMaxSize)
	if err != nil {
		return nil, fmt.Errorf("multus: list pod resources: %w", err)
	}
	return idsV1(resp.GetPodResources(), namespace, name, resourceName), nil
}

// GPUOwner is the pod and container DCGM exporter labels a GPU's metrics
// with, and in virtual-GPU mode the vgpu label.
type GPUOwner struct {
	Namespace, Pod, Container string
	// VGPU is the "<n>" of a "<id>::<n>" device id, which DCGM exporter's
	// virtual-GPU mode sets as the series' vgpu label; empty otherwise.
	VGPU string
}

// dcgmDevices calls f for every device id DCGM exporter reads from a v1
// List: v1 List with a 10 s timeout and gRPC's default 4 MiB limit,
// keeping nvidia.com/gpu (and nvidia.com/mig-*) devices.
func dcgmDevices(ctx context.Context, socket string, f func(p *v1.PodResources, c *v1.ContainerResources, id string)) error {
	resp, err := listV1(ctx, socket, grpcDefaultMaxSize)
	if err != nil {
		return fmt.Errorf("dcgm-exporter: list pod resources: %w", err)
	}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != "nvidia.com/gpu" && !strings.HasPrefix(d.GetResourceName(), "nvidia.com/mig-") {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					f(p, c, id)
				}
			}
		}
	}
	return nil
}

// DCGMDeviceToPod is DCGM exporter's mapping (4.2.3-4.1.3 and later, default
// "uid" id type, without --kubernetes-virtual-gpus): one owner per device
// key, last one wins, keyed by the exact device id string and, for an id
// "<id>::<n>" (NVIDIA's replica form), by <id> too, which is the key a
// GPU's metrics are looked up by.
func DCGMDeviceToPod(ctx context.Context, socket string) (map[string]GPUOwner, error) {
	out := map[string]GPUOwner{}
	err := dcgmDevices(ctx, socket, func(p *v1.PodResources, c *v1.ContainerResources, id string) {
		o := GPUOwner{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()}
		if base, _, ok := strings.Cut(id, "::"); ok {
			out[base] = o
		}
		out[id] = o
	})
	return out, err
}

// DCGMDeviceToSharingPods is DCGM exporter's mapping with
// --kubernetes-virtual-gpus (KUBERNETES_VIRTUAL_GPUS, 4.1.1-4.0.3 and
// later): every owner of each device key, in answer order, each with the
// vgpu label from its id's "::<n>" suffix; an id "<id>::<n>" is listed
// under <id> and under itself, any other id under itself. A GPU's metrics
// are emitted once per owner listed under its UUID, so the owners there
// are the GPU's label sets.
func DCGMDeviceToSharingPods(ctx context.Context, socket string) (map[string][]GPUOwner, error) {
	out := map[string][]GPUOwner{}
	err := dcgmDevices(ctx, socket, func(p *v1.PodResources, c *v1.ContainerResources, id string) {
		o := GPUOwner{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()}
		if base, n, ok := strings.Cut(id, "::"); ok {
			o.VGPU = n
			out[base] = append(out[base], o)
		}
		out[id] = append(out[id], o)
	})
	return out, err
}

// DCGMV1alpha1DeviceToPod is the same for DCGM exporter up to 4.2.3-4.1.1,
// which still calls v1alpha1 List.
func DCGMV1alpha1DeviceToPod(ctx context.Context, socket string) (map[string]GPUOwner, error) {
	resp, err := listV1alpha1(ctx, socket, grpcDefaultMaxSize)
	if err != nil {
		return nil, fmt.Errorf("dcgm-exporter (v1alpha1): list pod resources: %w", err)
	}
	out := map[string]GPUOwner{}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == "nvidia.com/gpu" {
					for _, id := range d.GetDeviceIds() {
						out[id] = GPUOwner{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName()}
					}
				}
			}
		}
	}
	return out, nil
}

// NRIPluginsTopologyHints is what containers/nri-plugins' topology-aware
// policy derives for one container: it calls v1 Get (16 MiB) for the pod and
// turns the named container's device topology into NUMA node hints, keyed
// by resource name.
func NRIPluginsTopologyHints(ctx context.Context, socket, namespace, pod, container string) (map[string][]int64, error) {
	p, err := getV1(ctx, socket, namespace, pod)
	if err != nil {
		return nil, fmt.Errorf("nri-plugins: get pod resources: %w", err)
	}
	hints := map[string][]int64{}
	for _, c := range p.GetContainers() {
		if c.GetName() != container {
			continue
		}
		for _, d := range c.GetDevices() {
			for _, n := range d.GetTopology().GetNodes() {
				hints[d.GetResourceName()] = append(hints[d.GetResourceName()], n.GetID())
			}
		}
	}
	return hints, nil
}

// KataCDIDevices is what the Kata runtime cold-plugs for a sandbox: v1 Get
// (16 MiB) for the pod, every device of every container turned into a CDI
// name "<resource_name>=<device id>", de-duplicated. An error fails sandbox
// creation.
func KataCDIDevices(ctx context.Context, socket, namespace, pod string) ([]string, error) {
	p, err := getV1(ctx, socket, namespace, pod)
	if err != nil {
		return nil, fmt.Errorf("kata: get pod resources: %w", err)
	}
	seen := map[string]bool{}
	var out []string
	for _, c := range p.GetContainers() {
		for _, d := range c.GetDevices() {
			for _, id := range d.GetDeviceIds() {
				name := d.GetResourceName() + "=" + id
				if !seen[name] {
					seen[name] = true
					out = append(out, name)
				}
			}
		}
	}
	return out, nil
}

// KataColdPlug is what the Kata runtime passes through to a sandbox's VM
// at its creation: the CDI names KataCDIDevices makes of its Get answer,
// each resolved against the node's CDI devices (nodeCDI, the names the
// node's CDI specs declare, such as nvidia-ctk's "nvidia.com/gpu=<uuid>").
// A name no spec declares fails the cold plug, and with it the sandbox,
// with CDI's "unresolvable CDI devices" error; so does an error of Get.
func KataColdPlug(ctx context.Context, socket, namespace, pod string, nodeCDI []string) ([]string, error) {
	names, err := KataCDIDevices(ctx, socket, namespace, pod)
	if err != nil {
		return nil, err
	}
	var unresolved []string
	for _, n := range names {
		if !slices.Contains(nodeCDI, n) {
			unresolved = append(unresolved, n)
		}
	}
	if len(unresolved) > 0 {
		return nil, fmt.Errorf("kata: cold plug: unresolvable CDI devices %s", strings.Join(unresolved, ", "))
	}
	return names, nil
}

// allocatableThenList is what the topology exporters ask, in their order,
// on one connection (10 s per call, 16 MiB): GetAllocatableResources, then
// List.
func allocatableThenList(ctx context.Context, socket string) (*v1.AllocatableResourcesResponse, *v1.ListPodResourcesResponse, error) {
	conn, err := dial(socket, conventionalMaxSize)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	c := v1.NewPodResourcesListerClient(conn)
	actx, cancel := context.WithTimeout(ctx, conventionalTimeout)
	defer cancel()
	alloc, err := c.GetAllocatableResources(actx, &v1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("get allocatable resources: %w", err)
	}
	lctx, cancel2 := context.WithTimeout(ctx, conventionalTimeout)
	defer cancel2()
	list, err := c.List(lctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list pod resources: %w", err)
	}
	return alloc, list, nil
}

// NUMAKey is a resource on one NUMA node.
type NUMAKey struct {
	Resource string
	NUMA     int64
}

// NFDFreePerNUMA is NFD topology-updater's accounting: GetAllocatableResources
// once (an error is fatal at start), a map resource -> device id -> NUMA node
// from it, then List, subtracting each listed id from its NUMA node's count.
// Ids or resources the allocatable answer does not know are logged by NFD
// as "unknown resource" and ignored; they are returned here so tests can
// show that none are.
func NFDFreePerNUMA(ctx context.Context, socket string) (free map[NUMAKey]int, unknown []string, err error) {
	alloc, list, err := allocatableThenList(ctx, socket)
	if err != nil {
		return nil, nil, fmt.Errorf("nfd: %w", err)
	}
	numaOf := map[string]map[string]int64{}
	free = map[NUMAKey]int{}
	for _, d := range alloc.GetDevices() {
		for _, n := range d.GetTopology().GetNodes() {
			if numaOf[d.GetResourceName()] == nil {
				numaOf[d.GetResourceName()] = map[string]int64{}
			}
			for _, id := range d.GetDeviceIds() {
				numaOf[d.GetResourceName()][id] = n.GetID()
				free[NUMAKey{d.GetResourceName(), n.GetID()}]++
			}
		}
	}
	for _, p := range list.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				for _, id := range d.GetDeviceIds() {
					n, ok := numaOf[d.GetResourceName()][id]
					if !ok {
						unknown = append(unknown, d.GetResourceName()+"="+id)
						continue
					}
					free[NUMAKey{d.GetResourceName(), n}]--
				}
			}
		}
	}
	sort.Strings(unknown)
	return free, unknown, nil
}

// RTEAvailablePerNUMA is resource-topology-exporter's accounting:
// GetAllocatableResources (10 s, 16 MiB, the socket as a unix:// URL),
// counting the device ids of each entry on every node of its topology, then
// List, counting each container's device ids the same way. Unlike NFD it
// never matches ids against the allocatable answer: a device is counted on
// the nodes its List entry names, and one without topology is not counted.
// Available is allocatable minus used, clamped at 0 with a warning; the
// clamped keys are returned so tests can show that none are.
func RTEAvailablePerNUMA(ctx context.Context, socket string) (available map[NUMAKey]int, clamped []NUMAKey, err error) {
	if !strings.HasPrefix(socket, "unix:") {
		socket = "unix://" + socket
	}
	alloc, list, err := allocatableThenList(ctx, socket)
	if err != nil {
		return nil, nil, fmt.Errorf("rte: %w", err)
	}
	count := func(into map[NUMAKey]int, d *v1.ContainerDevices) {
		for _, n := range d.GetTopology().GetNodes() {
			into[NUMAKey{d.GetResourceName(), n.GetID()}] += len(d.GetDeviceIds())
		}
	}
	allocatable := map[NUMAKey]int{}
	for _, d := range alloc.GetDevices() {
		count(allocatable, d)
	}
	used := map[NUMAKey]int{}
	for _, p := range list.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				count(used, d)
			}
		}
	}
	available = map[NUMAKey]int{}
	for k, n := range allocatable {
		available[k] = n
	}
	for k, n := range used {
		available[k] -= n
		if available[k] < 0 {
			available[k] = 0
			clamped = append(clamped, k)
		}
	}
	sort.Slice(clamped, func(i, j int) bool {
		if clamped[i].Resource != clamped[j].Resource {
			return clamped[i].Resource < clamped[j].Resource
		}
		return clamped[i].NUMA < clamped[j].NUMA
	})
	return available, clamped, nil
}

// AntreaVFDeviceIDs is Antrea's secondary-network SR-IOV lookup: v1alpha1
// List (10 s, gRPC's default 4 MiB), device ids of the pod's containers
// under resourceName. Antrea caches the answer per pod even when it is
// empty, so the first answer must already be right.
func AntreaVFDeviceIDs(ctx context.Context, socket, namespace, name, resourceName string) ([]string, error) {
	resp, err := listV1alpha1(ctx, socket, grpcDefaultMaxSize)
	if err != nil {
		return nil, fmt.Errorf("antrea: list pod resources: %w", err)
	}
	return idsV1alpha1(resp.GetPodResources(), namespace, name, resourceName), nil
}
