package proxy_test

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/state/record"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// A steady List reuses, pod by pod, what the proxy built for the previous
// one when the pod's part of the kubelet's answer, its store record and the
// inventory are all unchanged, in whatever order the kubelet lists the pods.
// These tests change one of the three at a time, leaving the other two as
// they were, and check that clients see the change at once and that only
// the pods that changed are built again.

// steadyPod is a running pod whose spec the proxy has learned and whose
// sandbox NRI has recorded: Lists about it need no /pods read.
func steadyPod(t *testing.T, h *harness, opts ...fk.PodOption) fk.Pod {
	t.Helper()
	p := fk.NewPod("default", "trainer", "uid-1", append([]fk.PodOption{byKoord, fk.WithAnnotation(koordKey, oneGPU),
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
	h.store.SandboxStopped(record.OriginNRI, "sb-1", "")
	h.store.SandboxRemoved(record.OriginNRI, "sb-1", "")
	recreated := fk.NewPod("default", "trainer", "uid-2", byKoord, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpuUUID2)),
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
	// A pod NRI has not recorded, whose sandbox the kubelet then begins
	// (Multus asks during its CNI ADD): the Lists must read /pods for it
	// again, not reuse what an earlier read said.
	h.k.SetPods(fk.NewPod("default", "creating", "uid-1", byKoord, fk.WithAnnotation(koordKey, oneGPU), koordApp, fk.WithPhase("Pending")))
	for range 2 {
		h.list()
		if _, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	h.k.BeginSandbox("default", "creating", "uid-1")
	h.k.SetPodsDown(true)
	if _, err := h.v1().List(ctx(t), &v1.ListPodResourcesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("List of a pod unknown to the store with /pods down = %v, want Unavailable", err)
	}
	if _, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("v1alpha1 List of a pod unknown to the store with /pods down = %v, want Unavailable", err)
	}
}

// canonical sorts an answer's pods by namespace and name and each
// container's devices, the two orders the kubelet does not keep.
func canonical(resp *v1.ListPodResourcesResponse) *v1.ListPodResourcesResponse {
	out := proto.Clone(resp).(*v1.ListPodResourcesResponse)
	slices.SortFunc(out.PodResources, func(a, b *v1.PodResources) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	for _, p := range out.PodResources {
		for _, c := range p.Containers {
			slices.SortStableFunc(c.Devices, func(a, b *v1.ContainerDevices) int {
				return cmp.Compare(fmt.Sprint(a), fmt.Sprint(b))
			})
		}
	}
	return out
}

// mixedPods are pods of every shape the merge handles: devices for one of
// two containers, a sidecar, a kubelet device beside an added one, the
// same GPU reported by the kubelet too, no allocation at all.
func mixedPods() []fk.Pod {
	pods := []fk.Pod{
		fk.NewPod("ns1", "vf", "uid-vf", byKoord, fk.WithAnnotation(koordKey, gpuAndVF),
			fk.WithSidecar("side", map[string]string{"koordinator.sh/rdma": "1"}),
			fk.WithContainer("main", map[string]string{"nvidia.com/gpu": "1"})),
		fk.NewPod("ns1", "two", "uid-two", byKoord, fk.WithAnnotation(koordKey, twoGPUs),
			fk.WithContainer("x", map[string]string{"nvidia.com/gpu": "1"}),
			fk.WithContainer("y", map[string]string{"nvidia.com/gpu": "1"})),
		fk.NewPod("ns2", "dup", "uid-dup", byKoord, fk.WithAnnotation(koordKey, oneGPU),
			fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"}),
			fk.WithKubeletDevices("app", "nvidia.com/gpu", 0, gpuUUID)),
		fk.NewPod("ns2", "devs", "uid-devs", byKoord, fk.WithAnnotation(koordKey, oneGPU),
			fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1", "example.com/dev": "3"}),
			fk.WithKubeletDevices("app", "example.com/dev", 1, "dev-0", "dev-1", "dev-2"),
			fk.WithCPUs("app", 2, 3)),
	}
	for i := range 12 {
		pods = append(pods, fk.NewPod("ns3", fmt.Sprintf("plain-%d", i), fmt.Sprintf("uid-plain-%d", i), fk.WithCPUs("app", int64(i))))
	}
	return pods
}

func TestAListFromAShuffledKubeletAnswerEqualsTheOneFromTheOrderedAnswer(t *testing.T) {
	h := newHarness(t)
	h.k.SetUnknownFields(true)
	pods := mixedPods()
	h.k.SetPods(pods...)
	h.list() // learns the specs
	for i, p := range pods {
		h.markLive(p, fmt.Sprintf("sb-%d", i))
	}
	v1alpha1List := func() *v1.ListPodResourcesResponse {
		resp, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// The same fields in v1's shape, to compare with one helper.
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var asV1 v1.ListPodResourcesResponse
		if err := proto.Unmarshal(b, &asV1); err != nil {
			t.Fatal(err)
		}
		return &asV1
	}

	h.k.SetFixedOrder(true)
	ordered, orderedAlpha := canonical(h.list()), canonical(v1alpha1List())
	h.k.SetFixedOrder(false)
	for i := range 10 {
		got := h.list()
		if c := canonical(got); !proto.Equal(c, ordered) {
			t.Fatalf("List %d from a shuffled kubelet answer differs from the ordered one:\n%v\n%v", i, c, ordered)
		}
		if c := canonical(v1alpha1List()); !proto.Equal(c, orderedAlpha) {
			t.Fatalf("v1alpha1 List %d from a shuffled kubelet answer differs from the ordered one:\n%v\n%v", i, c, orderedAlpha)
		}
		if i == 0 {
			for _, p := range got.GetPodResources() {
				if g := h.get(p.Namespace, p.Name); !proto.Equal(canonical(&v1.ListPodResourcesResponse{PodResources: []*v1.PodResources{g}}),
					canonical(&v1.ListPodResourcesResponse{PodResources: []*v1.PodResources{p}})) {
					t.Errorf("List and Get disagree for %s/%s:\nList: %v\nGet:  %v", p.Namespace, p.Name, p, g)
				}
			}
		}
	}
	if n := h.counter("podres_proxy_list_pods_total", "answer", "reused"); n == 0 {
		t.Errorf("no pod of a shuffled answer was reused")
	}
}

// liveTrainers gives the kubelet n pods, each with a Koordinator GPU of its
// own and opts(i), and makes them live in the store, their specs read.
func liveTrainers(h *harness, n int, opts func(i int) []fk.PodOption) []fk.Pod {
	var pods []fk.Pod
	for i := range n {
		gpu := fmt.Sprintf("GPU-%08x-1dfe-5bbc-7c12-46e817b1de9a", i)
		pods = append(pods, fk.NewPod("default", fmt.Sprintf("trainer-%d", i), fmt.Sprintf("uid-%d", i),
			append([]fk.PodOption{byKoord, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpu))}, opts(i)...)...))
	}
	h.k.SetPods(pods...)
	h.list()
	for i, p := range pods {
		h.markLive(p, fmt.Sprintf("sb-%d", i))
	}
	return pods
}

func TestAPodChangedBetweenTwoListsIsRebuiltAndTheOthersReused(t *testing.T) {
	h := newHarness(t)
	pods := liveTrainers(h, 6, func(int) []fk.PodOption {
		return []fk.PodOption{fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"})}
	})
	h.list()
	count := func() (reused, rebuilt float64) {
		return h.counter("podres_proxy_list_pods_total", "answer", "reused"), h.counter("podres_proxy_list_pods_total", "answer", "rebuilt")
	}
	step := func(what string, wantRebuilt float64) *v1.ListPodResourcesResponse {
		t.Helper()
		reused, rebuilt := count()
		resp := h.list()
		r2, b2 := count()
		if b2-rebuilt != wantRebuilt || r2-reused != float64(len(pods))-wantRebuilt {
			t.Errorf("%s: %v pods rebuilt and %v reused, want %v and %v", what, b2-rebuilt, r2-reused, wantRebuilt, float64(len(pods))-wantRebuilt)
		}
		return resp
	}
	step("nothing changed", 0)

	// The kubelet's answer changes for one pod: it now has exclusive CPUs.
	fk.WithCPUs("app", 6, 7)(&pods[3])
	h.k.SetPods(pods...)
	resp := step("one pod's CPUs changed", 1)
	if cpus := findPod(resp, "default", "trainer-3").GetContainers()[0].GetCpuIds(); !slices.Equal(cpus, []int64{6, 7}) {
		t.Errorf("changed pod's cpus = %v, want [6 7]", cpus)
	}
	step("nothing changed since", 0)

	// The store changes for one pod: trainer-1's sandbox stops. Every pod
	// with devices is rebuilt, not only trainer-1: the trust gate weighs
	// each pod's claims against every other pod's record (who holds a
	// whole GPU), and the answers it reused are not told which records
	// changed.
	h.store.SandboxStopped(record.OriginNRI, "sb-1", "")
	resp = step("one pod's sandbox stopped", float64(len(pods)))
	for i := range pods {
		want := fmt.Sprintf("GPU-%08x-1dfe-5bbc-7c12-46e817b1de9a", i)
		if got := devicesOf(findPod(resp, "default", pods[i].Name), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{want}) {
			t.Errorf("%s has GPUs %v, want its own %s", pods[i].Name, got, want)
		}
	}
}

// The kubelet lists a container's devices in map order, so a pod holding
// several devices of its device plugins comes in a new order on almost
// every List. Such pods must be reused like any other, not rebuilt on
// every call.
func TestPodsWithSeveralKubeletDevicesAreReusedWhateverTheirOrder(t *testing.T) {
	h := newHarness(t)
	liveTrainers(h, 4, func(i int) []fk.PodOption {
		return []fk.PodOption{
			fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1", "rdma/hca": "4"}),
			fk.WithKubeletDevices("app", "rdma/hca", int64(i%2), "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"),
			fk.WithKubeletDevices("app", "example.com/fpga", -1, "fpga-0"),
		}
	})
	h.k.SetFixedOrder(true)
	want := canonical(h.list())
	h.k.SetFixedOrder(false)
	rebuilt := h.counter("podres_proxy_list_pods_total", "answer", "rebuilt")
	orders := map[string]bool{}
	for i := range 20 {
		if c := canonical(h.list()); !proto.Equal(c, want) {
			t.Fatalf("List %d differs from the one of the kubelet's answer in order:\n%v\n%v", i, c, want)
		}
		b, _ := proto.Marshal(kubeletList(t, h))
		orders[string(b)] = true
	}
	if len(orders) < 2 {
		t.Fatalf("the kubelet gave %d orders in 20 Lists: the test shows nothing", len(orders))
	}
	if n := h.counter("podres_proxy_list_pods_total", "answer", "rebuilt") - rebuilt; n != 0 {
		t.Errorf("%v pods rebuilt in 20 Lists of an unchanged node whose kubelet lists devices in map order, want 0", n)
	}
}
