package proxy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
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
	h := newHarness(t, withTrust(nil), withNode())
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
	h := newHarness(t, withTrust(nil), withNode())
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
	h := newHarness(t, withTrust(nil), withChangingInventory(&cur))
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

func TestAfterAnUpgradeFromSchema1ListAndGetShowTheDevices(t *testing.T) {
	// A record the previous release wrote has a spec without the
	// scheduler's name: List must read /pods for it, as Get does, rather
	// than refuse the pod's devices as unvetted.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pods"), 0o700); err != nil {
		t.Fatal(err)
	}
	ann, _ := json.Marshal(oneGPU)
	v1 := `{
  "schemaVersion": 1,
  "uid": "uid-p",
  "namespace": "ml",
  "name": "p",
  "sandboxID": "sandbox-1",
  "state": "ready",
  "containers": [{"name": "train", "id": "c0ffee", "state": "running"}],
  "spec": {"containers": [{"name": "train", "kind": "app", "requests": {"koordinator.sh/gpu-core": "100"}}]},
  "annotations": {"scheduling.koordinator.sh/device-allocated": ` + string(ann) + `},
  "devices": [{"allocator": "koordinator", "type": "gpu", "resource": "nvidia.com/gpu", "ids": ["` + gpuUUID + `"], "minor": 0}],
  "sources": {"sandbox": {"source": "nri", "at": "2025-03-01T12:00:00Z"}, "spec": {"source": "kubelet", "at": "2025-03-01T12:00:00Z"}, "annotations": {"source": "nri", "at": "2025-03-01T12:00:00Z"}},
  "updatedAt": "2025-03-01T12:00:00Z"
}
`
	if err := os.WriteFile(filepath.Join(dir, "pods", "uid-p.json"), []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, withTrust(nil), withNode(), withStateDir(dir))
	h.k.SetPods(fk.NewPod("ml", "p", "uid-p", fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, oneGPU),
		fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})))
	if got := listedGPUsOf(h, "p"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("List after the upgrade shows %v, want %s", got, gpuUUID)
	}
	if got := gpusOf(h, "p"); !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("Get after the upgrade shows %v, want %s", got, gpuUUID)
	}
}
