package proxy_test

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/proxy/inventory"
	"github.com/podres-proxy/podres-proxy/state"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// A steady List is answered with the bytes built for the previous one when
// the kubelet's answer, the store and the inventory are all unchanged. These
// tests change one of the three at a time, leaving the other two as they
// were, and check that clients see the change at once.

// steadyPod is a running pod whose spec the proxy has learned and whose
// sandbox NRI has recorded: Lists about it need no /pods read.
func steadyPod(t *testing.T, h *harness, opts ...fk.PodOption) fk.Pod {
	t.Helper()
	p := fk.NewPod("default", "trainer", "uid-1", append([]fk.PodOption{fk.WithAnnotation(koordKey, oneGPU),
		fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"})}, opts...)...)
	h.k.SetPods(p)
	h.list() // learns the spec from /pods
	h.markLive(p, "sb-1")
	return p
}

// kubeletList is the kubelet's own answer, asked directly.
func kubeletList(t *testing.T, h *harness) *v1.ListPodResourcesResponse {
	t.Helper()
	resp, err := v1.NewPodResourcesListerClient(dialBench(t, h.k.Socket)).List(ctx(t), &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("kubelet List: %v", err)
	}
	return resp
}

func TestRepeatedListsAnswerAlikeAndFollowTheKubelet(t *testing.T) {
	h := newHarness(t)
	p := steadyPod(t, h)
	first, second := h.list(), h.list()
	if !proto.Equal(first, second) {
		t.Fatalf("two Lists with nothing changed differ:\n%v\n%v", first, second)
	}
	if got := devicesOf(findPod(second, "default", "trainer"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID}) {
		t.Fatalf("repeated List gave the GPUs %v, want %s", got, gpuUUID)
	}

	// The kubelet now also reports a device of its own for the pod (a
	// device plugin's); the store and the inventory are as they were.
	reads := h.k.PodsReads()
	fk.WithKubeletDevices("app", "example.com/dev", -1, "dev-0")(&p)
	fk.WithCPUs("app", 4, 5)(&p)
	h.k.SetPods(p)
	pod := findPod(h.list(), "default", "trainer")
	devs := devicesOf(pod, "app")
	if !slices.Equal(devs["example.com/dev"], []string{"dev-0"}) || !slices.Equal(devs["nvidia.com/gpu"], []string{gpuUUID}) {
		t.Errorf("after the kubelet's answer changed List gave %v, want its dev-0 and the GPU", devs)
	}
	if cpus := pod.GetContainers()[0].GetCpuIds(); !slices.Equal(cpus, []int64{4, 5}) {
		t.Errorf("after the kubelet's answer changed List gave cpus %v, want [4 5]", cpus)
	}
	resp, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var alpha []string
	for _, d := range resp.GetPodResources()[0].GetContainers()[0].GetDevices() {
		alpha = append(alpha, d.GetResourceName()+"="+strings.Join(d.GetDeviceIds(), ","))
	}
	slices.Sort(alpha)
	if want := []string{"example.com/dev=dev-0", "nvidia.com/gpu=" + gpuUUID}; !slices.Equal(alpha, want) {
		t.Errorf("v1alpha1 List gave %v, want %v", alpha, want)
	}
	if n := h.k.PodsReads() - reads; n != 0 {
		t.Errorf("a running pod's Lists cost %d /pods reads, want 0", n)
	}
}

func TestAPodRecreatedBetweenTwoListsGetsItsOwnDevicesThoughTheKubeletAnswersAlike(t *testing.T) {
	h := newHarness(t)
	old := steadyPod(t, h)
	h.list()
	before := kubeletList(t, h)

	// web-0 is deleted and recreated under the same name, with another GPU.
	// PodResources carries no UID, so the kubelet answers the same bytes.
	h.store.SandboxStopped(state.SourceNRI, "sb-1", "")
	h.store.SandboxRemoved(state.SourceNRI, "sb-1", "")
	recreated := fk.NewPod("default", "trainer", "uid-2", fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpuUUID2)),
		fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"}))
	h.k.SetPods(recreated)
	if after := kubeletList(t, h); !proto.Equal(before, after) {
		t.Fatalf("the test needs the kubelet to answer alike for %s and its successor:\n%v\n%v", old.Name, before, after)
	}
	if got := devicesOf(findPod(h.list(), "default", "trainer"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID2}) {
		t.Fatalf("recreated pod got %v, want its own GPU %s", got, gpuUUID2)
	}
	h.markLive(recreated, "sb-2")
	for range 2 {
		if got := devicesOf(findPod(h.list(), "default", "trainer"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID2}) {
			t.Fatalf("running recreated pod got %v, want its own GPU %s", got, gpuUUID2)
		}
	}
}

func TestListFollowsTheInventory(t *testing.T) {
	var cur atomic.Pointer[inventory.Snapshot]
	numa := func(n int64) *inventory.Snapshot {
		return inventory.NewSnapshot([]inventory.Device{{Type: inventory.TypeGPU, ID: gpuUUID, NUMANode: &n, Healthy: true}})
	}
	cur.Store(numa(0))
	h := newHarness(t, withChangingInventory(&cur))
	steadyPod(t, h)
	nodeOf := func() []int64 {
		var nodes []int64
		for _, d := range findPod(h.list(), "default", "trainer").GetContainers()[0].GetDevices() {
			for _, n := range d.GetTopology().GetNodes() {
				nodes = append(nodes, n.GetID())
			}
		}
		return nodes
	}
	if got := nodeOf(); !slices.Equal(got, []int64{0}) {
		t.Fatalf("GPU on NUMA %v, want 0", got)
	}
	nodeOf()
	// The GPU's NUMA node was learned anew (a Device object or file update).
	cur.Store(numa(1))
	if got := nodeOf(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("after the inventory changed the GPU is on NUMA %v, want 1", got)
	}
}

func TestAListThatNeededAPodsReadIsNotReusedWhenPodsIsDown(t *testing.T) {
	h := newHarness(t)
	// A pod NRI has not recorded: every List must read /pods for it.
	h.k.SetPods(fk.NewPod("default", "creating", "uid-1", fk.WithAnnotation(koordKey, oneGPU)))
	for range 2 {
		h.list()
		if _, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	h.k.SetPodsDown(true)
	if _, err := h.v1().List(ctx(t), &v1.ListPodResourcesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("List of a pod unknown to the store with /pods down = %v, want Unavailable", err)
	}
	if _, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("v1alpha1 List of a pod unknown to the store with /pods down = %v, want Unavailable", err)
	}
}
