package proxy_test

import (
	"slices"
	"sync/atomic"
	"testing"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/state/record"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// The answers the proxy reuses (per-pod List segments, cached plans) must
// follow everything the trust gate weighs: other pods' claims and the
// inventory, not only the pod's own record.

func gpusOf(h *harness, name string) []string {
	h.t.Helper()
	return devicesOf(h.get("ml", name), "train")["nvidia.com/gpu"]
}

func listedGPUsOf(h *harness, name string) []string {
	h.t.Helper()
	return devicesOf(findPod(h.list(), "ml", name), "train")["nvidia.com/gpu"]
}

// twoClaimsOfOneWholeGPU starts two koord-scheduler pods that each claim
// the same whole GPU, first then second.
func twoClaimsOfOneWholeGPU(h *harness) (first, second fk.Pod) {
	koord := fk.WithSchedulerName("koord-scheduler")
	wholeGPU := fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})
	first = fk.NewPod("ml", "first", "uid-zz-first", koord, fk.WithAnnotation(koordKey, oneGPU), wholeGPU)
	second = fk.NewPod("ml", "second", "uid-aa-second", koord, fk.WithAnnotation(koordKey, oneGPU), wholeGPU)
	h.k.SetPods(first)
	h.markLive(first, "sandbox-1")
	h.list()
	h.k.SetPods(first, second)
	h.markLive(second, "sandbox-2")
	return first, second
}

func TestWhenAWholeGPUsHolderLeavesTheNextClaimantGetsIt(t *testing.T) {
	h := newHarness(t, withNode())
	_, second := twoClaimsOfOneWholeGPU(h)
	if got := listedGPUsOf(h, "second"); len(got) != 0 {
		t.Fatalf("second shows %v while first holds the GPU", got)
	}
	h.list() // second's answer is now reused

	h.store.SandboxRemoved(record.OriginNRI, "sandbox-1", "uid-zz-first")
	h.k.SetPods(second)
	if got := listedGPUsOf(h, "second"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("List: once the holder left, second shows %v, want %s", got, gpuUUID)
	}
	if got := gpusOf(h, "second"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("Get: once the holder left, second shows %v, want %s", got, gpuUUID)
	}
}

func TestAWholeGPUIsNeverShownOnTwoPodsWhenItsFirstHolderComesBack(t *testing.T) {
	// A node reboot: both sandboxes stop, the later claimant starts first
	// and alone holds the GPU; then the first holder starts again.
	h := newHarness(t, withNode())
	first, second := twoClaimsOfOneWholeGPU(h)
	h.store.SandboxStopped(record.OriginNRI, "sandbox-1", "uid-zz-first")
	h.store.SandboxStopped(record.OriginNRI, "sandbox-2", "uid-aa-second")
	h.markLive(second, "sandbox-2b")
	h.list()
	h.list()
	h.markLive(first, "sandbox-1b")
	resp := h.list()
	a := devicesOf(findPod(resp, "ml", "first"), "train")["nvidia.com/gpu"]
	b := devicesOf(findPod(resp, "ml", "second"), "train")["nvidia.com/gpu"]
	if len(a) > 0 && len(b) > 0 {
		t.Errorf("List shows one whole GPU on two pods: first %v, second %v", a, b)
	}
	if !slices.Equal(a, []string{gpuUUID}) {
		t.Errorf("first, which claimed the GPU first, shows %v", a)
	}
}

func TestAGPUTheInventoryFindsLaterIsShown(t *testing.T) {
	// The inventory does not know the GPU yet (discovery still running):
	// refused as not on the node; once it knows it, the pod shows it.
	var cur atomic.Pointer[inventory.Snapshot]
	devs := nodeDevices()
	cur.Store(inventory.NewSnapshot(devs[1:]))
	h := newHarness(t, withChangingInventory(&cur))
	p := fk.NewPod("ml", "p", "uid-p", fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, oneGPU),
		fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
	h.k.SetPods(p)
	h.markLive(p, "sandbox-1")
	if got := listedGPUsOf(h, "p"); len(got) != 0 {
		t.Fatalf("shows %v before the inventory knows the GPU", got)
	}
	h.list()
	cur.Store(inventory.NewSnapshot(devs))
	if got := listedGPUsOf(h, "p"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("List: once the inventory knows the GPU, p shows %v, want %s", got, gpuUUID)
	}
	if got := gpusOf(h, "p"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("Get: once the inventory knows the GPU, p shows %v, want %s", got, gpuUUID)
	}
}

func TestALivePodWhoseSpecWasNeverReadShowsItsDevicesInListAndGet(t *testing.T) {
	// NRI reported the sandbox before any /pods read saw the pod, so its
	// record has no spec to vet the devices with: List must read /pods
	// for it, as Get does, rather than refuse the devices as unvetted.
	h := newHarness(t, withNode())
	p := fk.NewPod("ml", "p", "uid-p", fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, oneGPU),
		fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
	h.markLive(p, "sandbox-1")
	h.k.SetPods(p)
	if got := listedGPUsOf(h, "p"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("List shows %v, want %s", got, gpuUUID)
	}
	if got := gpusOf(h, "p"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("Get shows %v, want %s", got, gpuUUID)
	}
}
