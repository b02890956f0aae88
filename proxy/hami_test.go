package proxy_test

import (
	"slices"
	"testing"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

const (
	hamiKey = "hami.io/vgpu-devices-allocated"
	// hamiFakeID is the kind of id HAMi's device plugin gives the kubelet:
	// <UUID>-<n>, not necessarily of the GPU HAMi's scheduler picked.
	hamiFakeID = gpuUUID2 + "-3"
)

// A HAMi pod: the kubelet reports the device plugin's fake id for the app
// container; the proxy reports the GPU HAMi's scheduler recorded instead, on
// that container (third in HAMi's list, after the init container and the
// sidecar), and leaves the container's other devices alone.
func TestHAMiUUIDsReplaceTheKubeletsFakeIDs(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("default", "vgpu", "uid-1", byHAMi,
		fk.WithAnnotation(hamiKey, ";;"+gpuUUID+",NVIDIA,3000,30:;"),
		fk.WithInit("fetch", nil),
		fk.WithSidecar("mesh", nil),
		fk.WithContainer("main", map[string]string{"nvidia.com/gpu": "1", "example.com/dev": "1"}),
		fk.WithKubeletDevices("main", "nvidia.com/gpu", 0, hamiFakeID),
		fk.WithKubeletDevices("main", "example.com/dev", 1, "dev-0")))

	listed := findPod(h.list(), "default", "vgpu")
	got := h.get("default", "vgpu")
	for call, pod := range map[string]*v1.PodResources{"List": listed, "Get": got} {
		main := devicesOf(pod, "main")
		if ids := main["nvidia.com/gpu"]; !slices.Equal(ids, []string{gpuUUID}) {
			t.Errorf("%s: main's nvidia.com/gpu = %v; want HAMi's %s in place of the kubelet's %s", call, ids, gpuUUID, hamiFakeID)
		}
		if ids := main["example.com/dev"]; !slices.Equal(ids, []string{"dev-0"}) {
			t.Errorf("%s: main's example.com/dev = %v; want the kubelet's own", call, ids)
		}
		if mesh := devicesOf(pod, "mesh"); len(mesh) != 0 {
			t.Errorf("%s: the sidecar got %v", call, mesh)
		}
	}

	resp, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var v1alpha1IDs []string
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if p.GetName() == "vgpu" && c.GetName() == "main" && d.GetResourceName() == "nvidia.com/gpu" {
					v1alpha1IDs = append(v1alpha1IDs, d.GetDeviceIds()...)
				}
			}
		}
	}
	if !slices.Equal(v1alpha1IDs, []string{gpuUUID}) {
		t.Errorf("v1alpha1: main's nvidia.com/gpu = %v; want %s only", v1alpha1IDs, gpuUUID)
	}
}

// A pod scheduled by HAMi before it listed init containers: its list has
// one entry per app container, which its length shows, so the GPU still
// reaches the app container instead of being dropped with the init one.
func TestLegacyHAMiListReachesTheAppContainer(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("default", "legacy", "uid-1", byHAMi,
		fk.WithAnnotation(hamiKey, gpuUUID+",NVIDIA,3000,30:;"),
		fk.WithInit("fetch", nil),
		fk.WithContainer("main", map[string]string{"nvidia.com/gpu": "1"}),
		fk.WithKubeletDevices("main", "nvidia.com/gpu", -1, hamiFakeID)))

	if ids := devicesOf(h.get("default", "legacy"), "main")["nvidia.com/gpu"]; !slices.Equal(ids, []string{gpuUUID}) {
		t.Errorf("main's nvidia.com/gpu = %v; want %s", ids, gpuUUID)
	}
}

// A container whose HAMi entry is malformed keeps what the kubelet said;
// the other container still gets its GPU, and the error is counted.
func TestMalformedHAMiContainerKeepsTheKubeletsIDs(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("default", "half", "uid-1", byHAMi,
		fk.WithAnnotation(hamiKey, gpuUUID+",NVIDIA,lots,30:;"+gpuUUID2+",NVIDIA,3000,30:;"),
		fk.WithContainer("a", map[string]string{"nvidia.com/gpu": "1"}),
		fk.WithContainer("b", map[string]string{"nvidia.com/gpu": "1"}),
		fk.WithKubeletDevices("a", "nvidia.com/gpu", -1, hamiFakeID),
		fk.WithKubeletDevices("b", "nvidia.com/gpu", -1, gpuUUID+"-0")))

	pod := h.get("default", "half")
	if ids := devicesOf(pod, "a")["nvidia.com/gpu"]; !slices.Equal(ids, []string{hamiFakeID}) {
		t.Errorf("a's nvidia.com/gpu = %v; want the kubelet's %s", ids, hamiFakeID)
	}
	if ids := devicesOf(pod, "b")["nvidia.com/gpu"]; !slices.Equal(ids, []string{gpuUUID2}) {
		t.Errorf("b's nvidia.com/gpu = %v; want %s", ids, gpuUUID2)
	}
	if rec, ok := h.store.Get("uid-1"); !ok || len(rec.DecodeErrors) != 1 {
		t.Errorf("record found %v; want it with one decode error", ok)
	}
	if n := h.counter("podres_proxy_annotation_errors_total", "allocator", "hami"); n < 1 {
		t.Errorf("annotation_errors_total{allocator=hami} = %v, want >= 1", n)
	}
}
