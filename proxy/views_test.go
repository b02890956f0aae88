package proxy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/test/clients"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// These tests run each real consumer's reading of the answers (package
// clients) against a node where pods a and b share gpuUUID (NUMA node 1;
// a, the first sharer, is its anchor) and pod x has gpuUUID2 (NUMA node 0)
// whole. Each consumer is shown failing through the default (topology)
// view, the one answer the proxy had before views, for the reason the
// issue that brought views found, and right through its own view.

// viewsNode is sharingNode serving every view, with a, b and x.
func viewsNode(t *testing.T) *harness {
	t.Helper()
	h := sharingNode(t, withViews(merge.DCGM, merge.Plain, merge.Kata))
	h.k.SetPods(sharerA(), sharerB(), exclusiveX())
	return h
}

func sharerA() fk.Pod { return sharers["koordinator"]("a", gpuUUID) }
func sharerB() fk.Pod { return sharers["koordinator"]("b", gpuUUID) }

func exclusiveX() fk.Pod {
	return fk.NewPod("ml", "x", "uid-x", byKoord,
		fk.WithAnnotation(koordKey, `{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+gpuUUID2+`"}]}`),
		koordApp)
}

// DCGM exporter with --kubernetes-virtual-gpus: through the topology view
// the anchor's series have no vgpu label while the other sharer's have
// one; through the DCGM view every sharer has its slot.
func TestDCGMVirtualGPUModeLabelsEverySharerThroughTheDCGMView(t *testing.T) {
	h := viewsNode(t)
	topo, err := clients.DCGMDeviceToSharingPods(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if got := labelSets(topo[gpuUUID]); !slices.Contains(got, "a/infer vgpu=") {
		t.Errorf("through the topology view %s is labelled %q: want the anchor without a vgpu label, as the issue found", gpuUUID, got)
	}

	dcgm, err := clients.DCGMDeviceToSharingPods(ctx(t), h.views[merge.DCGM])
	if err != nil {
		t.Fatal(err)
	}
	if got, want := labelSets(dcgm[gpuUUID]), []string{"a/infer vgpu=0", "b/infer vgpu=1"}; !slices.Equal(got, want) {
		t.Errorf("through the DCGM view %s is labelled %q, want %q", gpuUUID, got, want)
	}
	if got, want := labelSets(dcgm[gpuUUID2]), []string{"x/app vgpu="}; !slices.Equal(got, want) {
		t.Errorf("through the DCGM view the exclusive %s is labelled %q, want %q", gpuUUID2, got, want)
	}
}

// DCGM exporter's default mode labels a GPU with the last pod listing it,
// and the kubelet lists pods in a new order each time: through the
// topology view the shared GPU's pod label follows the order, so it flips
// from scrape to scrape; through the DCGM view it is the anchor's whatever
// the order.
func TestDCGMDefaultModeLabelsASharedGPUWithItsAnchorThroughTheDCGMView(t *testing.T) {
	h := viewsNode(t)
	h.k.SetFixedOrder(true)
	owner := func(socket string) string {
		t.Helper()
		owners, err := clients.DCGMDeviceToPod(ctx(t), socket)
		if err != nil {
			t.Fatal(err)
		}
		if o := owners[gpuUUID2]; o.Pod != "x" {
			t.Errorf("the exclusive %s is labelled %+v, want pod x", gpuUUID2, o)
		}
		return owners[gpuUUID].Pod
	}
	var topo, dcgm []string
	for _, order := range [][]fk.Pod{{sharerA(), sharerB(), exclusiveX()}, {sharerB(), exclusiveX(), sharerA()}} {
		h.k.SetPods(order...)
		topo = append(topo, owner(h.socket))
		dcgm = append(dcgm, owner(h.views[merge.DCGM]))
	}
	if topo[0] == topo[1] {
		t.Errorf("through the topology view %s is labelled %q in both orders: want the flip the issue found", gpuUUID, topo)
	}
	if want := []string{"a", "a"}; !slices.Equal(dcgm, want) {
		t.Errorf("through the DCGM view %s is labelled %q in the two orders, want its anchor %q each time", gpuUUID, dcgm, want)
	}
}

// NFD's topology-updater and RTE count the shared GPU once, and never
// free, only through the topology view: through the plain view (what
// --shared-gpu-ids=uuid answered) both sharers count it.
func TestNFDAndRTECountASharedGPUOnceThroughTheTopologyView(t *testing.T) {
	h := viewsNode(t)
	numa1, numa0 := clients.NUMAKey{Resource: "nvidia.com/gpu", NUMA: 1}, clients.NUMAKey{Resource: "nvidia.com/gpu", NUMA: 0}

	free, _, err := clients.NFDFreePerNUMA(ctx(t), h.views[merge.Plain])
	if err != nil {
		t.Fatal(err)
	}
	avail, clamped, err := clients.RTEAvailablePerNUMA(ctx(t), h.views[merge.Plain])
	if err != nil {
		t.Fatal(err)
	}
	if free[numa1] != -1 || !slices.Contains(clamped, numa1) {
		t.Errorf("through the plain view NFD frees %d and RTE clamps %v on NUMA 1 (available %d): want the GPU counted twice", free[numa1], clamped, avail[numa1])
	}

	free, unknown, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	avail, clamped, err = clients.RTEAvailablePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []clients.NUMAKey{numa1, numa0} {
		if free[k] != 0 || avail[k] != 0 {
			t.Errorf("through the topology view NFD frees %d and RTE has %d available on %v, want each GPU used once", free[k], avail[k], k)
		}
	}
	if len(clamped) > 0 {
		t.Errorf("through the topology view RTE clamps %v", clamped)
	}
	if want := []string{"nvidia.com/gpu=" + gpuUUID + "::1"}; !slices.Equal(unknown, want) {
		t.Errorf("NFD skips %q, want only the second sharer's %q", unknown, want)
	}
}

// nri-plugins hints a container onto its devices' NUMA nodes: through the
// topology view the second sharer's GPU has no topology, so it gets no
// hint; through the plain view it gets NUMA node 1, as the anchor does.
func TestNRIPluginsHintEverySharerOntoItsGPUsNUMANodeThroughThePlainView(t *testing.T) {
	h := viewsNode(t)
	hint := func(socket, pod string) []int64 {
		t.Helper()
		hints, err := clients.NRIPluginsTopologyHints(ctx(t), socket, "ml", pod, "infer")
		if err != nil {
			t.Fatal(err)
		}
		return hints["nvidia.com/gpu"]
	}
	if got := hint(h.socket, "b"); len(got) != 0 {
		t.Errorf("through the topology view b is hinted %v: want no hint, as the issue found", got)
	}
	for _, pod := range []string{"a", "b"} {
		if got := hint(h.views[merge.Plain], pod); !slices.Equal(got, []int64{1}) {
			t.Errorf("through the plain view %s is hinted %v, want NUMA node 1", pod, got)
		}
	}
}

// Kata's cold plug: through the topology view the anchor gets a GPU other
// pods share passed through whole and the other sharer's sandbox fails
// with an opaque CDI error; through the Kata view both are refused with a
// reason that names the GPU, which the proxy logs, and the exclusive GPU
// is cold-plugged as before.
func TestKataRefusesASharedGPUWithAReasonThroughTheKataView(t *testing.T) {
	h := viewsNode(t)
	nodeCDI := []string{"nvidia.com/gpu=" + gpuUUID, "nvidia.com/gpu=" + gpuUUID2, "nvidia.com/gpu=all"}

	if got, err := clients.KataColdPlug(ctx(t), h.socket, "ml", "a", nodeCDI); err != nil || !slices.Equal(got, []string{"nvidia.com/gpu=" + gpuUUID}) {
		t.Errorf("through the topology view a cold-plugs %q (%v): want the shared GPU whole, as the issue found", got, err)
	}
	if _, err := clients.KataColdPlug(ctx(t), h.socket, "ml", "b", nodeCDI); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices") {
		t.Errorf("through the topology view b's cold plug fails with %v, want CDI's unresolvable device, as the issue found", err)
	}

	kata := h.views[merge.Kata]
	for _, pod := range []string{"a", "b"} {
		got, err := clients.KataColdPlug(ctx(t), kata, "ml", pod, nodeCDI)
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "shares GPU "+gpuUUID) || !strings.Contains(err.Error(), "Kata") {
			t.Errorf("through the Kata view %s cold-plugs %q (%v), want a refusal naming the shared GPU", pod, got, err)
		}
		if !logged(h, logrus.WarnLevel, "ml/"+pod) {
			t.Errorf("the refusal of %s is not logged", pod)
		}
	}
	if got, err := clients.KataColdPlug(ctx(t), kata, "ml", "x", nodeCDI); err != nil || !slices.Equal(got, []string{"nvidia.com/gpu=" + gpuUUID2}) {
		t.Errorf("through the Kata view x cold-plugs %q (%v), want its whole GPU", got, err)
	}

	// A List through the Kata view leaves the shared GPU out.
	resp, err := v1.NewPodResourcesListerClient(h.connTo(kata)).List(ctx(t), &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range []string{"a", "b"} {
		if got := devicesOf(findPod(resp, "ml", pod), "infer")["nvidia.com/gpu"]; len(got) > 0 {
			t.Errorf("a List through the Kata view gives %s %q, want no shared GPU", pod, got)
		}
	}
}

// logged reports whether an entry at level was logged with a field or
// message containing s.
func logged(h *harness, level logrus.Level, s string) bool {
	for _, e := range h.logs.AllEntries() {
		if e.Level != level {
			continue
		}
		if strings.Contains(e.Message, s) {
			return true
		}
		for _, v := range e.Data {
			if str, ok := v.(string); ok && strings.Contains(str, s) {
				return true
			}
		}
	}
	return false
}
