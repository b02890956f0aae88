package proxy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/clients"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// These tests run DCGM exporter's pod mapping (both modes), NFD's and RTE's
// accounting against pods that share one GPU, as HAMi, Koordinator and
// Volcano allocate them: gpuUUID on NUMA node 1, gpuUUID2 free on node 0.

// sharingNode is a proxy, vetting devices as serve does, whose inventory
// and allocatable list two GPUs.
func sharingNode(t *testing.T, opts ...option) *harness {
	t.Helper()
	zero, one := int64(0), int64(1)
	gpus := []inventory.Device{
		{Type: inventory.TypeGPU, ID: gpuUUID, NUMANode: &one, Healthy: true},
		{Type: inventory.TypeGPU, ID: gpuUUID2, NUMANode: &zero, Healthy: true},
	}
	// The inventory is also what GetAllocatableResources lists.
	return newHarness(t, append([]option{withInventory(gpus...)}, opts...)...)
}

// sharer is a pod of one allocator holding a share of a GPU.
type sharer func(name, gpu string) fk.Pod

var sharers = map[string]sharer{
	"koordinator": func(name, gpu string) fk.Pod {
		return fk.NewPod("ml", name, "uid-"+name, fk.WithSchedulerName("koord-scheduler"),
			fk.WithAnnotation(koordKey, `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"30","koordinator.sh/gpu-memory-ratio":"30"},"id":"`+gpu+`"}]}`),
			fk.WithContainer("infer", map[string]string{"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory-ratio": "30"}))
	},
	"hami": func(name, gpu string) fk.Pod {
		return fk.NewPod("ml", name, "uid-"+name, fk.WithSchedulerName("hami-scheduler"),
			fk.WithAnnotation(hamiKey, gpu+",NVIDIA,3000,30:;"),
			fk.WithContainer("infer", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}),
			fk.WithKubeletDevices("infer", "nvidia.com/gpu", -1, gpu+"-"+name))
	},
	"volcano": func(name, gpu string) fk.Pod {
		return fk.NewPod("ml", name, "uid-"+name, fk.WithSchedulerName("volcano"),
			fk.WithAnnotation("volcano.sh/vgpu-ids-new", gpu+",NVIDIA,3000,30:"),
			fk.WithContainer("infer", map[string]string{"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "3000"}))
	},
}

// labelSets returns the label sets DCGM's virtual-GPU mode gives a GPU's
// metrics, as "pod/container vgpu=<n>".
func labelSets(owners []clients.GPUOwner) []string {
	var out []string
	for _, o := range owners {
		out = append(out, fmt.Sprintf("%s/%s vgpu=%s", o.Pod, o.Container, o.VGPU))
	}
	slices.Sort(out)
	return out
}

func TestThreePodsSharingAGPU(t *testing.T) {
	for alloc, pod := range sharers {
		t.Run(alloc, func(t *testing.T) {
			h := sharingNode(t)
			h.k.SetPods(pod("a", gpuUUID), pod("b", gpuUUID), pod("c", gpuUUID))

			// Virtual-GPU mode: one label set per sharer, told apart by vgpu.
			shared, err := clients.DCGMDeviceToSharingPods(ctx(t), h.socket)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"a/infer vgpu=", "b/infer vgpu=1", "c/infer vgpu=2"}
			if got := labelSets(shared[gpuUUID]); !slices.Equal(got, want) {
				t.Errorf("DCGM virtual-GPU mode labels %s with %q, want %q", gpuUUID, got, want)
			}

			// Default mode: the GPU carries one of its pods.
			owners, err := clients.DCGMDeviceToPod(ctx(t), h.socket)
			if err != nil {
				t.Fatal(err)
			}
			if o := owners[gpuUUID]; !slices.Contains([]string{"a", "b", "c"}, o.Pod) || o.Container != "infer" {
				t.Errorf("DCGM default mode labels %s with %+v, want one of its sharers", gpuUUID, o)
			}

			// NFD and RTE: the shared GPU is one used device, the other free.
			free, unknown, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
			if err != nil {
				t.Fatal(err)
			}
			wantFree := map[clients.NUMAKey]int{{Resource: "nvidia.com/gpu", NUMA: 1}: 0, {Resource: "nvidia.com/gpu", NUMA: 0}: 1}
			for k, v := range wantFree {
				if free[k] != v {
					t.Errorf("NFD: free %v = %d, want %d", k, free[k], v)
				}
			}
			for _, u := range unknown {
				if !strings.Contains(u, "::") {
					t.Errorf("NFD: %s is unknown to GetAllocatableResources", u)
				}
			}
			avail, clamped, err := clients.RTEAvailablePerNUMA(ctx(t), h.socket)
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range wantFree {
				if avail[k] != v {
					t.Errorf("RTE: available %v = %d, want %d", k, avail[k], v)
				}
			}
			if len(clamped) > 0 {
				t.Errorf("RTE clamps %v: more used than allocatable", clamped)
			}
		})
	}
}

// HAMi's most reported complaint (its issue 1741): 8 vGPUs scheduled on
// a node, DCGM attributes 5. Eight pods sharing the node's two GPUs give
// eight label sets, and each GPU counts once as used.
func TestHAMiEightVGPUsShowEight(t *testing.T) {
	h := sharingNode(t)
	var pods []fk.Pod
	for i := range 8 {
		pods = append(pods, sharers["hami"](fmt.Sprintf("p%d", i), []string{gpuUUID, gpuUUID2}[i%2]))
	}
	h.k.SetPods(pods...)
	shared, err := clients.DCGMDeviceToSharingPods(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	sets := append(labelSets(shared[gpuUUID]), labelSets(shared[gpuUUID2])...)
	if slices.Sort(sets); len(slices.Compact(slices.Clone(sets))) != 8 || len(sets) != 8 {
		t.Errorf("DCGM virtual-GPU mode gives %d label sets %q, want 8 distinct", len(sets), sets)
	}
	avail, clamped, err := clients.RTEAvailablePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if avail[clients.NUMAKey{Resource: "nvidia.com/gpu", NUMA: 0}] != 0 || avail[clients.NUMAKey{Resource: "nvidia.com/gpu", NUMA: 1}] != 0 || len(clamped) > 0 {
		t.Errorf("RTE: available %v, clamped %v; want both GPUs used once", avail, clamped)
	}
}

// A sharer keeps its slot while others come and go; when the GPU's first
// sharer leaves, the next one is reported under the plain UUID, so that
// a GPU still shared stays counted.
func TestASharersSlotIsStableForItsLife(t *testing.T) {
	h := sharingNode(t)
	pod := sharers["koordinator"]
	a, b, c := pod("a", gpuUUID), pod("b", gpuUUID), pod("c", gpuUUID)
	h.k.SetPods(a, b, c)
	for _, p := range []fk.Pod{a, b, c} {
		h.markLive(p, "sandbox-"+p.Name)
	}
	ids := func(names ...string) []string {
		t.Helper()
		var out []string
		for _, n := range names {
			out = append(out, devicesOf(h.get("ml", n), "infer")["nvidia.com/gpu"]...)
		}
		return out
	}
	if got, want := ids("a", "b", "c"), []string{gpuUUID, gpuUUID + "::1", gpuUUID + "::2"}; !slices.Equal(got, want) {
		t.Fatalf("a, b, c show %q, want %q", got, want)
	}
	// The slots are in the pods' records, for a restarted daemon.
	if rec, _ := h.store.Get("uid-c"); rec == nil || rec.GPUSlots[strings.ToLower(gpuUUID)] != 2 {
		t.Errorf("c's record keeps slots %v, want its slot 2", rec.GPUSlots)
	}

	// b leaves, d joins: c keeps ::2, d takes the free ::1.
	h.store.SandboxRemoved(record.OriginNRI, "sandbox-b", "uid-b")
	d := pod("d", gpuUUID)
	h.k.SetPods(a, c, d)
	h.markLive(d, "sandbox-d")
	if got, want := ids("a", "c", "d"), []string{gpuUUID, gpuUUID + "::2", gpuUUID + "::1"}; !slices.Equal(got, want) {
		t.Fatalf("after b left and d joined: a, c, d show %q, want %q", got, want)
	}

	// a, the first sharer, leaves: c, the next, takes the plain UUID.
	h.store.SandboxRemoved(record.OriginNRI, "sandbox-a", "uid-a")
	h.k.SetPods(c, d)
	if got, want := ids("c", "d"), []string{gpuUUID, gpuUUID + "::1"}; !slices.Equal(got, want) {
		t.Fatalf("after a left: c, d show %q, want %q", got, want)
	}
}

// A MIG instance HAMi recorded is reported as MIG-<uuid> on its parent
// GPU's NUMA node, under the resource configured for MIG instances, and
// the kubelet's fake id for the container is still replaced.
func TestAMIGInstanceIsOnItsGPUsNUMANode(t *testing.T) {
	const mig = "MIG-5f1d6b3c-8a2e-4f0b-9c1d-2e3f4a5b6c7d"
	for _, resource := range []string{"", "nvidia.com/mig-1g.10gb"} {
		t.Run("resource="+resource, func(t *testing.T) {
			h := sharingNode(t, withProviders(func(d *proxy.Providers) { d.MIGResource = resource }))
			h.k.SetPods(fk.NewPod("ml", "mig", "uid-mig", fk.WithSchedulerName("hami-scheduler"),
				fk.WithAnnotation(hamiKey, gpuUUID+",NVIDIA,9856,14:;"),
				fk.WithAnnotation("hami.io/vgpu-mig-allocations", `[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"`+gpuUUID+`","migUUID":"`+mig+`"}]`),
				fk.WithContainer("infer", map[string]string{"nvidia.com/gpu": "1"}),
				fk.WithKubeletDevices("infer", "nvidia.com/gpu", -1, hamiFakeID)))
			want := resource
			if want == "" {
				want = "nvidia.com/gpu"
			}
			var got []string
			for _, c := range h.get("ml", "mig").GetContainers() {
				for _, d := range c.GetDevices() {
					got = append(got, fmt.Sprintf("%s=%s numa=%v", d.GetResourceName(), d.GetDeviceIds(), d.GetTopology().GetNodes()))
				}
			}
			if w := []string{fmt.Sprintf("%s=[%s] numa=[ID:1]", want, mig)}; !slices.Equal(got, w) {
				t.Errorf("the MIG pod shows %q, want %q", got, w)
			}
		})
	}
}

// A pod whose two containers share a GPU (Koordinator gives a shared GPU
// to every container asking a share) counts it once too: its second
// container shows the anchor's slot 0.
func TestTwoContainersOfOnePodSharingAGPUCountItOnce(t *testing.T) {
	h := sharingNode(t)
	share := map[string]string{"koordinator.sh/gpu-core": "30", "koordinator.sh/gpu-memory-ratio": "30"}
	h.k.SetPods(
		fk.NewPod("ml", "a", "uid-a", fk.WithSchedulerName("koord-scheduler"),
			fk.WithAnnotation(koordKey, `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"60","koordinator.sh/gpu-memory-ratio":"60"},"id":"`+gpuUUID+`"}]}`),
			fk.WithContainer("infer", share), fk.WithContainer("embed", share)),
		sharers["koordinator"]("b", gpuUUID))
	shared, err := clients.DCGMDeviceToSharingPods(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a/embed vgpu=0", "a/infer vgpu=", "b/infer vgpu=1"}
	if got := labelSets(shared[gpuUUID]); !slices.Equal(got, want) {
		t.Errorf("DCGM virtual-GPU mode labels %s with %q, want %q", gpuUUID, got, want)
	}
	free, _, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	avail, clamped, err := clients.RTEAvailablePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	k := clients.NUMAKey{Resource: "nvidia.com/gpu", NUMA: 1}
	if free[k] != 0 || avail[k] != 0 || len(clamped) > 0 {
		t.Errorf("NFD free %d, RTE available %d (clamped %v) on NUMA 1; want the GPU used once", free[k], avail[k], clamped)
	}
}
