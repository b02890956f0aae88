package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/podres-proxy/podres-proxy/test/clients"
)

// sharedGPUUUID is the GPU sharePodA and sharePodB share, on NUMA node 1 in
// the suite's inventory (writeInventory); every other GPU of the suite is
// on node 0.
const sharedGPUUUID = "GPU-8f3a2c1e-0005-4c6b-9d2e-5a7b3c4d1e05"

// Two pods Koordinator gave half of sharedGPUUUID each.
var (
	sharePodA = newSharePod("share-a")
	sharePodB = newSharePod("share-b")
)

func newSharePod(name string) testPod {
	half := limits("koordinator.sh/gpu-core", "50", "koordinator.sh/gpu-memory-ratio", "50")
	alloc := fmt.Sprintf(`{"gpu":[{"minor":4,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"},"id":%q}]}`, sharedGPUUUID)
	p := newTestPod(name, alloc, appContainers("app"), nil, map[string]corev1.ResourceList{"app": half})
	p.want = devices{"app": {gpuResource: {sharedGPUUUID}}}
	return p
}

// writeInventory writes serve's --inventory-file: every GPU the suite's
// pods are given, so that the trust gate, which then checks that a GPU is
// the node's, believes them all, with a NUMA node each (the shared one on
// node 1, alone there), which the views' consumers count and hint by.
func writeInventory(path string) error {
	type device struct {
		Type     string `json:"type"`
		ID       string `json:"id"`
		NUMANode int    `json:"numaNode"`
	}
	var devs []device
	for _, id := range []string{gpuUUID, sidecarGPUUUID, devGPUUUID, lateGPUUUID, hamiSidecarGPU, hamiAppGPU} {
		devs = append(devs, device{Type: "gpu", ID: id, NUMANode: 0})
	}
	devs = append(devs, device{Type: "gpu", ID: sharedGPUUUID, NUMANode: 1})
	b, err := json.MarshalIndent(map[string]any{"version": 1, "devices": devs}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the inventory: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write the inventory: %w", err)
	}
	return nil
}

// TestViewsShowTwoPodsSharingAGPUToEachConsumer runs two pods sharing one
// GPU on the node and asks each view as its consumer does (package
// clients): DCGM exporter the dcgm view, NFD and RTE the topology view,
// nri-plugins the plain view, Kata the kata view (docs/views.md).
func TestViewsShowTwoPodsSharingAGPUToEachConsumer(t *testing.T) {
	requireProxy(t)
	requireNode(t)
	if !h.servesViews() {
		t.Skip("podres-proxy serve has no --view")
	}
	for _, p := range []testPod{sharePodA, sharePodB} {
		if err := p.create(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.remove(); err != nil {
				t.Error(err)
			}
		})
	}
	if err := waitRunning(3*time.Minute, sharePodA.fullName(), sharePodB.fullName()); err != nil {
		t.Fatalf("the sharing pods did not start: %v", err)
	}
	ctx := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return c
	}
	pods := []string{sharePodA.fullName(), sharePodB.fullName()}

	// DCGM exporter, virtual-GPU mode, through the dcgm view: one series per
	// sharer, slots 0 and 1. The anchor is slot 0.
	var anchor, other string
	poll(t, 30*time.Second, "the dcgm view to label both sharers", func() error {
		var shared map[string][]clients.GPUOwner
		err := limited(func() (err error) {
			shared, err = clients.DCGMDeviceToSharingPods(ctx(), h.viewSockets["dcgm"])
			return err
		})
		if err != nil {
			return err
		}
		slots := map[string]string{}
		for _, o := range shared[sharedGPUUUID] {
			if o.Namespace == podNamespace && o.Container == "app" {
				slots[o.VGPU] = o.Pod
			}
		}
		if len(slots) != 2 || slots["0"] == "" || slots["1"] == "" {
			return fmt.Errorf("the dcgm view labels %s with %v, want the two sharers as vgpu 0 and 1", sharedGPUUUID, shared[sharedGPUUUID])
		}
		anchor, other = slots["0"], slots["1"]
		return nil
	})
	if !slices.Contains(pods, anchor) || !slices.Contains(pods, other) {
		t.Fatalf("the dcgm view's sharers are %s and %s, want %v", anchor, other, pods)
	}
	// Default mode: the anchor, at every scrape, whatever order the kubelet
	// lists the pods in.
	for range 8 {
		var owners map[string]clients.GPUOwner
		err := limited(func() (err error) { owners, err = clients.DCGMDeviceToPod(ctx(), h.viewSockets["dcgm"]); return err })
		if err != nil {
			t.Fatal(err)
		}
		if got := owners[sharedGPUUUID].Pod; got != anchor {
			t.Fatalf("DCGM's default mode labels %s with %s through the dcgm view, want its anchor %s every time", sharedGPUUUID, got, anchor)
		}
	}

	// NFD and RTE through the topology view: the GPU is used once on NUMA
	// node 1; through the plain view it would be used twice.
	gpu1 := clients.NUMAKey{Resource: gpuResource, NUMA: 1}
	var free map[clients.NUMAKey]int
	if err := limited(func() (err error) { free, _, err = clients.NFDFreePerNUMA(ctx(), h.proxySocket); return err }); err != nil {
		t.Fatal(err)
	}
	var avail map[clients.NUMAKey]int
	var clamped []clients.NUMAKey
	if err := limited(func() (err error) {
		avail, clamped, err = clients.RTEAvailablePerNUMA(ctx(), h.proxySocket)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if free[gpu1] != 0 || avail[gpu1] != 0 || slices.Contains(clamped, gpu1) {
		t.Errorf("through the topology view NFD frees %d and RTE has %d available (clamped %v) on NUMA 1, want the shared GPU used once", free[gpu1], avail[gpu1], clamped)
	}
	if err := limited(func() (err error) { free, _, err = clients.NFDFreePerNUMA(ctx(), h.viewSockets["plain"]); return err }); err != nil || free[gpu1] != -1 {
		t.Errorf("through the plain view NFD frees %d on NUMA 1 (%v): want the GPU counted by both sharers, which is why NFD reads the topology view", free[gpu1], err)
	}

	// nri-plugins through the plain view: both sharers hinted onto node 1;
	// through the topology view the other sharer gets no hint.
	for _, pod := range pods {
		var hints map[string][]int64
		err := limited(func() (err error) {
			hints, err = clients.NRIPluginsTopologyHints(ctx(), h.viewSockets["plain"], podNamespace, pod, "app")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := hints[gpuResource]; !slices.Equal(got, []int64{1}) {
			t.Errorf("through the plain view nri-plugins hints %s onto %v, want NUMA node 1", pod, got)
		}
	}
	var hints map[string][]int64
	if err := limited(func() (err error) {
		hints, err = clients.NRIPluginsTopologyHints(ctx(), h.proxySocket, podNamespace, other, "app")
		return err
	}); err != nil || len(hints[gpuResource]) != 0 {
		t.Errorf("through the topology view nri-plugins hints %s onto %v (%v), want none: its id has no topology", other, hints[gpuResource], err)
	}

	// Kata through the kata view: both sharers refused with the reason;
	// through the topology view the other sharer fails on CDI.
	nodeCDI := []string{"nvidia.com/gpu=" + sharedGPUUUID, "nvidia.com/gpu=all"}
	for _, pod := range pods {
		err := limited(func() error {
			_, err := clients.KataColdPlug(ctx(), h.viewSockets["kata"], podNamespace, pod, nodeCDI)
			return err
		})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "shares GPU "+sharedGPUUUID) {
			t.Errorf("through the kata view %s's cold plug fails with %v, want a refusal naming the shared GPU", pod, err)
		}
	}
	if err := limited(func() error {
		_, err := clients.KataColdPlug(ctx(), h.proxySocket, podNamespace, other, nodeCDI)
		return err
	}); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices") {
		t.Errorf("through the topology view %s's cold plug fails with %v, want CDI's unresolvable device", other, err)
	}
}

// limited runs a client's call, again while the rate limit refuses it (up
// to 2 s), as call does: the kubelet's limit (100 calls a second, a burst of
// 10 per client) applies to the proxy's sockets too, and this test is one
// client asking many times in a row.
func limited(call func() error) error {
	for attempt := 0; ; attempt++ {
		err := call()
		if status.Code(err) != codes.ResourceExhausted || attempt == 20 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
