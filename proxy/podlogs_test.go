package proxy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/proxy"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// Without the Pods API, only a /pods read says which pod a name is. A pod
// that is not running (stuck before its sandbox on a missing Secret) is
// answered from the last read while the kubelet's pod logs directory shows
// that no sandbox began since (package podlogs): polling consumers cost no
// read per List, and keep their answers while /pods is down.

// stuckPod is a pod the kubelet admitted but cannot start (a Secret its
// volume needs is missing): no sandbox, no log directory, in every List.
func stuckPod(uid, gpu string) fk.Pod {
	return fk.NewPod("ml", "stuck", uid, byKoord, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpu)),
		koordApp, fk.WithPhase("Pending"))
}

// stuckGPUs lists and returns the stuck pod's GPUs.
func stuckGPUs(t *testing.T, h *harness) []string {
	t.Helper()
	return devicesOf(findPod(h.list(), "ml", "stuck"), "app")["nvidia.com/gpu"]
}

func TestAPodStuckBeforeItsSandboxCostsNoReadPerList(t *testing.T) {
	h := newHarness(t, withNode())
	running := fk.NewPod("ml", "web", "uid-web", byKoord, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpuUUID3)), koordApp)
	h.k.SetPods(running, stuckPod("uid-stuck", gpuUUID2))

	for i := range 10 {
		if got := stuckGPUs(t, h); !slices.Equal(got, []string{gpuUUID2}) {
			t.Fatalf("List %d: the stuck pod shows %v, want [%s]", i, got, gpuUUID2)
		}
		if got := devicesOf(h.get("ml", "stuck"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID2}) {
			t.Fatalf("Get %d: the stuck pod shows %v, want [%s]", i, got, gpuUUID2)
		}
	}
	if n := h.k.PodsReads(); n > 1 {
		t.Errorf("10 Lists and 10 Gets with a pod stuck before its sandbox read /pods %d times, want 1 (the first)", n)
	}

	// /pods goes down (the API server's token expired, a kubelet busy on
	// a tenant's annotations): every List still answers, the stuck pod
	// with its devices.
	h.k.SetPodsDown(true)
	for i := range 3 {
		if got := stuckGPUs(t, h); !slices.Equal(got, []string{gpuUUID2}) {
			t.Errorf("List %d with /pods down: the stuck pod shows %v, want [%s]", i, got, gpuUUID2)
		}
	}
}

func TestAPodRecreatedBeforeItsSandboxIsReadWhenItsSandboxBegins(t *testing.T) {
	// db-0 is stuck; it is deleted and recreated under its name with
	// another VF (the scheduler placed it anew); the Secret appears and the
	// kubelet begins the new pod's sandbox: Multus's List and Kata's Get
	// during its CNI ADD must show the new VF, never the one the last read
	// gave the name.
	h := newHarness(t, withTwoVFs())
	web := fk.NewPod("db", "web", "uid-web") // the node runs other pods
	first := statefulPod("uid-first", vf1)
	first.Status.Phase = "Pending"
	h.k.SetPods(web, first)
	for range 3 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf1}) {
			t.Fatalf("db-0 shows %v, want [%s]", got, vf1)
		}
	}
	reads := h.k.PodsReads()
	if reads != 1 {
		t.Errorf("3 Lists of the stuck db-0 read /pods %d times, want 1", reads)
	}

	second := statefulPod("uid-second", vf2)
	second.Status.Phase = "Pending"
	h.k.SetPods(web, second)
	h.k.BeginSandbox("db", "db-0", "uid-second")
	for i := range 3 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf2}) {
			t.Errorf("List %d during the new pod's CNI ADD shows %v, want its own [%s], never its predecessor's %s", i, got, vf2, vf1)
		}
		if got := devicesOf(h.get("db", "db-0"), "db")["koordinator.sh/rdma"]; !slices.Equal(got, []string{vf2}) {
			t.Errorf("Get %d during the new pod's CNI ADD shows %v, want [%s]", i, got, vf2)
		}
	}
	if n := h.k.PodsReads() - reads; n != 1 {
		t.Errorf("the new pod's sandbox cost %d /pods reads, want 1", n)
	}
}

func TestAPodLogsDirectoryThatIsNotTheKubeletsCostsARead(t *testing.T) {
	// --kubelet-pod-logs-dir names a directory the kubelet does not write
	// (its podLogsDir is elsewhere, or the path is not mounted): it never
	// changes, so it must not be trusted. The running pod's log directory
	// is not in it.
	other := t.TempDir()
	h := newHarness(t, withNode(), withProviders(func(p *proxy.Providers) { p.PodLogs = podlogs.New(other, nil) }))
	running := fk.NewPod("ml", "web", "uid-web", byKoord, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpuUUID3)), koordApp)
	h.k.SetPods(running, stuckPod("uid-stuck", gpuUUID2))
	for i := range 5 {
		if got := stuckGPUs(t, h); !slices.Equal(got, []string{gpuUUID2}) {
			t.Fatalf("List %d: the stuck pod shows %v, want [%s]", i, got, gpuUUID2)
		}
	}
	if n := h.k.PodsReads(); n != 5 {
		t.Errorf("5 Lists read /pods %d times, want 5: the directory is not the kubelet's", n)
	}
	warned := false
	for _, e := range h.logs.AllEntries() {
		if err, ok := e.Data["error"].(error); ok && strings.Contains(err.Error(), "not the kubelet's podLogsDir") {
			warned = true
		}
	}
	if !warned {
		t.Error("no warning says the pod logs directory is not the kubelet's")
	}
}
