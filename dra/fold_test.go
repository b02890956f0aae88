package dra

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
)

const (
	gpuDriver = "gpu.example.com"
	nicDriver = "nic.example.com"
	gpu       = "example.com/gpu"
	nic       = "example.com/nic"
	claim     = "trainer-extended-resources-x7k2p"
)

func ref(driver, device string) DeviceRef {
	return DeviceRef{Driver: driver, Pool: "node-1", Device: device}
}

// node are the node's devices as its ResourceSlices publish them.
var node = Facts{Devices: map[DeviceRef]Device{
	ref(gpuDriver, "gpu-0"): {ID: "GPU-0a1b", NUMANode: 0},
	ref(gpuDriver, "gpu-1"): {ID: "GPU-1c2d", NUMANode: 1},
	ref(nicDriver, "vf-0"):  {ID: "0000:3b:02.0", NUMANode: 1},
	ref(nicDriver, "vf-1"):  {ID: "0000:3b:02.1", NUMANode: -1},
	ref(gpuDriver, "gpu-9"): {NUMANode: 0}, // published without an id attribute
}}

// claimed is a DynamicResource as the kubelet lists it.
func claimed(name string, refs ...DeviceRef) *v1.DynamicResource {
	dr := &v1.DynamicResource{ClaimName: name, ClaimNamespace: "ml"}
	for _, r := range refs {
		dr.ClaimResources = append(dr.ClaimResources, &v1.ClaimResource{
			DriverName: r.Driver, PoolName: r.Pool, DeviceName: r.Device,
			CdiDevices: []*v1.CDIDevice{{Name: r.Driver + "/dev=" + r.Device}},
		})
	}
	return dr
}

func container(name string, drs ...*v1.DynamicResource) *v1.ContainerResources {
	return &v1.ContainerResources{Name: name, DynamicResources: drs}
}

func pod(name string, cs ...*v1.ContainerResources) *v1.PodResources {
	return &v1.PodResources{Name: name, Namespace: "ml", Containers: cs}
}

func device(resource, id string, numa ...int64) *v1.ContainerDevices {
	d := &v1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}}
	for _, n := range numa {
		d.Topology = &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: n}}}
	}
	return d
}

func mapping(container, resource, request string) model.ExtendedResourceRequest {
	return model.ExtendedResourceRequest{Container: container, Resource: resource, Request: request}
}

func wantPod(t *testing.T, got, want *v1.PodResources) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Errorf("pod answered\n%s\nwant\n%s", prototext.Format(got), prototext.Format(want))
	}
}

// The common case: one container asked for nvidia.com/gpu-like resources,
// a DRA driver's device answered, and NFD/RTE must see it under devices
// with its UUID and NUMA node. The claim's allocation is not needed.
func TestOneContainersExtendedResourceIsShownUnderDevices(t *testing.T) {
	p := pod("trainer", container("main", claimed(claim, ref(gpuDriver, "gpu-1"))))
	pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{
		mapping("main", gpu, "container-0-request-0"),
	}}}

	unfolded := FoldPod(p, pf, node)

	if len(unfolded) != 0 {
		t.Errorf("unfolded %v", unfolded)
	}
	// Moved, not copied: a consumer that reads both sees it once.
	wantPod(t, p, pod("trainer", &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)}}))
}

// The kubelet lists every device of the pod's extended resource claim
// under every container that has a request of it; each container must be
// shown only the devices its own requests got, and every NIC once.
func TestSeveralContainersGetTheirOwnDevicesOfTheClaim(t *testing.T) {
	all := []DeviceRef{ref(gpuDriver, "gpu-0"), ref(gpuDriver, "gpu-1"), ref(nicDriver, "vf-0")}
	p := pod("trainer",
		container("sidecar"),
		container("main", claimed(claim, all...)),
		container("helper", claimed(claim, all...)),
	)
	pf := PodFacts{
		Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{
			mapping("main", gpu, "container-1-request-0"),
			mapping("main", nic, "container-1-request-1"),
			mapping("helper", gpu, "container-2-request-0"),
		}},
		Allocation: Allocation{
			"container-1-request-0": {ref(gpuDriver, "gpu-0")},
			"container-1-request-1": {ref(nicDriver, "vf-0")},
			"container-2-request-0": {ref(gpuDriver, "gpu-1")},
		},
	}

	if unfolded := FoldPod(p, pf, node); len(unfolded) != 0 {
		t.Errorf("unfolded %v", unfolded)
	}
	wantPod(t, p, pod("trainer",
		container("sidecar"),
		&v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0), device(nic, "0000:3b:02.0", 1)}},
		&v1.ContainerResources{Name: "helper", Devices: []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)}},
	))
}

// Without the claim's allocation (the API server was away when the pod
// appeared) a claim serving several containers cannot be split: nothing is
// guessed, the kubelet's answer stays as it was, and the devices are
// reported as unfolded.
func TestAClaimOfSeveralContainersIsNotGuessedWithoutItsAllocation(t *testing.T) {
	both := []DeviceRef{ref(gpuDriver, "gpu-0"), ref(gpuDriver, "gpu-1")}
	p := pod("trainer", container("main", claimed(claim, both...)), container("helper", claimed(claim, both...)))
	before := proto.Clone(p).(*v1.PodResources)
	pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{
		mapping("main", gpu, "container-0-request-0"),
		mapping("helper", gpu, "container-1-request-0"),
	}}}

	unfolded := FoldPod(p, pf, node)

	wantPod(t, p, before)
	if len(unfolded) != 4 || unfolded[0].Reason != ReasonUnattributed {
		t.Errorf("unfolded %v, want the 2 devices of each container as %s", unfolded, ReasonUnattributed)
	}
}

// A plain init container's request can be in the claim too; PodResources
// never lists that container, so the claim appears under one container
// only, yet not all its devices are that container's.
func TestAnInitContainersShareOfTheClaimIsNotGivenToTheAppContainer(t *testing.T) {
	p := pod("trainer", container("main", claimed(claim, ref(gpuDriver, "gpu-0"), ref(gpuDriver, "gpu-1"))))
	before := proto.Clone(p).(*v1.PodResources)
	pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{
		mapping("init", gpu, "container-0-request-0"),
		mapping("main", gpu, "container-1-request-0"),
	}}}
	FoldPod(p, pf, node)
	wantPod(t, p, before)

	pf.Allocation = Allocation{"container-0-request-0": {ref(gpuDriver, "gpu-0")}, "container-1-request-0": {ref(gpuDriver, "gpu-1")}}
	FoldPod(p, pf, node)
	wantPod(t, p, pod("trainer", &v1.ContainerResources{
		Name:             "main",
		Devices:          []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)},
		DynamicResources: []*v1.DynamicResource{claimed(claim, ref(gpuDriver, "gpu-0"))},
	}))
}

// One container asking for two resources from one claim: which device is
// which resource needs the allocation too.
func TestTwoResourcesOfOneContainerNeedTheAllocation(t *testing.T) {
	p := pod("trainer", container("main", claimed(claim, ref(gpuDriver, "gpu-0"), ref(nicDriver, "vf-0"))))
	before := proto.Clone(p).(*v1.PodResources)
	pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{
		mapping("main", gpu, "container-0-request-0"),
		mapping("main", nic, "container-0-request-1"),
	}}}
	if unfolded := FoldPod(p, pf, node); len(unfolded) != 2 {
		t.Errorf("unfolded %v, want both devices", unfolded)
	}
	wantPod(t, p, before)
}

// A device shared between pods (DRA consumable capacity: each claim gets a
// share of one GPU) is shown to each sharer against the real GPU, as
// shared GPUs are on the default socket: DCGM attributes each sharer, NFD
// counts the GPU once per NUMA node.
func TestASharedDeviceIsShownToEachSharer(t *testing.T) {
	for _, name := range []string{"a", "b"} {
		c := "pod-" + name + "-extended-resources"
		dr := claimed(c, ref(gpuDriver, "gpu-0"))
		share := "share-" + name
		dr.ClaimResources[0].ShareId = &share
		p := pod(name, container("main", dr))
		pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: c, Requests: []model.ExtendedResourceRequest{mapping("main", gpu, "r")}}}
		if unfolded := FoldPod(p, pf, node); len(unfolded) != 0 {
			t.Errorf("pod %s: unfolded %v", name, unfolded)
		}
		wantPod(t, p, pod(name, &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)}}))
	}
}

// A pod's own claim (a ResourceClaim it references itself, here one two
// pods share) asked for no extended resource: it stays under
// dynamic_resources only, unless the operator maps its driver to a
// resource name; then both pods are shown the device.
func TestAPodsOwnClaimIsFoldedOnlyWhenItsDriverIsMapped(t *testing.T) {
	shared := func(name string) *v1.PodResources {
		return pod(name, container("main", claimed("shared-nic", ref(nicDriver, "vf-1")), claimed(claim, ref(gpuDriver, "gpu-0"))))
	}
	pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{mapping("main", gpu, "r")}}}

	p := shared("a")
	FoldPod(p, pf, node)
	wantPod(t, p, pod("a", &v1.ContainerResources{
		Name:             "main",
		Devices:          []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)},
		DynamicResources: []*v1.DynamicResource{claimed("shared-nic", ref(nicDriver, "vf-1"))},
	}))

	mapped := node
	mapped.DriverResources = map[string]string{nicDriver: "example.com/sriov-vf"}
	for _, name := range []string{"a", "b"} {
		p := shared(name)
		FoldPod(p, pf, mapped)
		wantPod(t, p, pod(name, &v1.ContainerResources{
			Name:    "main",
			Devices: []*v1.ContainerDevices{device("example.com/sriov-vf", "0000:3b:02.1"), device(gpu, "GPU-0a1b", 0)},
		}))
	}
}

// A device no ResourceSlice of the node lists (the driver withdrew it, or
// the slices are not read yet) has no id consumers could match: it stays
// where the kubelet put it and is reported, never shown by its DRA name.
func TestADeviceWithoutResourceSliceStaysUnderDynamicResources(t *testing.T) {
	gone := ref(gpuDriver, "gpu-7")
	p := pod("trainer", container("main", claimed(claim, gone, ref(gpuDriver, "gpu-9"), ref(gpuDriver, "gpu-1"))))
	pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{mapping("main", gpu, "r")}}}

	unfolded := FoldPod(p, pf, node)

	want := []Unfolded{{"main", gone, ReasonNoSlice}, {"main", ref(gpuDriver, "gpu-9"), ReasonNoID}}
	if !reflect.DeepEqual(unfolded, want) {
		t.Errorf("unfolded %v, want %v", unfolded, want)
	}
	wantPod(t, p, pod("trainer", &v1.ContainerResources{
		Name:             "main",
		Devices:          []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)},
		DynamicResources: []*v1.DynamicResource{claimed(claim, gone, ref(gpuDriver, "gpu-9"))},
	}))
}

// Trust: the kubelet vouches for allocations. A device the claim's
// allocation and the slices know, but that the kubelet does not list
// under the container, is never shown there.
func TestNothingTheKubeletDidNotReportIsShown(t *testing.T) {
	p := pod("trainer", container("main", claimed(claim, ref(gpuDriver, "gpu-0"))), container("helper"))
	pf := PodFacts{
		Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{
			mapping("main", gpu, "r0"), mapping("helper", gpu, "r1"),
		}},
		Allocation: Allocation{"r0": {ref(gpuDriver, "gpu-0")}, "r1": {ref(gpuDriver, "gpu-1")}},
	}
	FoldPod(p, pf, node)
	wantPod(t, p, pod("trainer", &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)}}, container("helper")))

	// A claim of another namespace with the same name is not the pod's.
	other := pod("trainer", container("main", claimed(claim, ref(gpuDriver, "gpu-0"))))
	other.Containers[0].DynamicResources[0].ClaimNamespace = "elsewhere"
	before := proto.Clone(other).(*v1.PodResources)
	FoldPod(other, pf, node)
	wantPod(t, other, before)
}

// An id the kubelet already lists under the resource (a device plugin of
// the same resource reported it) is not listed twice.
func TestAnIDAlreadyListedIsNotAddedAgain(t *testing.T) {
	p := pod("trainer", container("main", claimed(claim, ref(gpuDriver, "gpu-0"))))
	p.Containers[0].Devices = []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)}
	pf := PodFacts{Claim: &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{mapping("main", gpu, "r")}}}
	FoldPod(p, pf, node)
	wantPod(t, p, pod("trainer", &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)}}))
}

// GetAllocatableResources lists the node's devices of classes with an
// extended resource name and of mapped drivers, once per id, and not
// those the kubelet lists already or that have no id.
func TestAllocatableListsTheNodesDevicesOfExtendedResourceClasses(t *testing.T) {
	f := node
	f.ClassResources = map[string]string{gpuDriver: gpu}
	f.DriverResources = map[string]string{nicDriver: nic}
	existing := []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)}

	got := Allocatable(f, existing)

	want := []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0), device(nic, "0000:3b:02.0", 1), device(nic, "0000:3b:02.1")}
	if len(got) != len(want) {
		t.Fatalf("allocatable %v, want %v", got, want)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("allocatable[%d] %v, want %v", i, got[i], want[i])
		}
	}
	if got := Allocatable(node, nil); len(got) != 0 {
		t.Errorf("without classes or mappings: allocatable %v, want none", got)
	}
}
