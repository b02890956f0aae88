package proxy_test

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/clients"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// A StatefulSet pod is force-deleted while its sandbox is still being torn
// down, and recreated at once under the same name with a new UID and
// another VF. PodResources names pods without UIDs, so the running record
// of that name must not answer for the new pod during its CNI ADD.

const (
	vf1 = "0000:3b:02.1"
	vf2 = "0000:3b:02.2"
	pf  = "0000:3b:00.0"
)

func vfAllocation(vf string) string {
	return `{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"100"},"id":"` + pf + `","extension":{"vfs":[{"minor":-1,"busID":"` + vf + `"}]}}]}`
}

func withTwoVFs() option {
	zero := int64(0)
	return withInventory(inventory.Device{Type: inventory.TypeRDMA, ID: pf, BusID: pf, Minor: &zero, NUMANode: &zero,
		Healthy: true, Source: inventory.SourceFile, VFs: []inventory.VF{{BusID: vf1}, {BusID: vf2}}})
}

func statefulPod(uid, vf string) fk.Pod {
	return fk.NewPod("db", "db-0", uid, fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, vfAllocation(vf)),
		fk.WithContainer("db", map[string]string{"koordinator.sh/rdma": "100"}))
}

// runningOld brings up db-0 with vf1: learned from /pods, its sandbox and
// container reported by NRI.
func runningOld(t *testing.T, h *harness) fk.Pod {
	t.Helper()
	old := statefulPod("uid-old", vf1)
	h.k.SetPods(old)
	h.list()
	h.markLive(old, "sb-old")
	h.store.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-old", SandboxID: "sb-old", Name: "db", State: model.ContainerRunning})
	if got := multusVFs(t, h); !slices.Equal(got, []string{vf1}) {
		t.Fatalf("before the deletion db-0 shows %v, want [%s]", got, vf1)
	}
	return old
}

func multusVFs(t *testing.T, h *harness) []string {
	t.Helper()
	ids, err := clients.MultusDeviceIDs(ctx(t), h.socket, "db", "db-0", "koordinator.sh/rdma")
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestARecreatedPodIsNeverAnsweredWithItsPredecessorsVF(t *testing.T) {
	h := newHarness(t, withTwoVFs())
	runningOld(t, h)

	// Force deletion: the kubelet stops the old pod's container (NRI
	// StopContainer) and, from then on, lists the new pod under the name.
	h.k.SetPods(statefulPod("uid-new", vf2))
	h.store.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-old", SandboxID: "sb-old", Name: "db", State: model.ContainerStopped})

	// The new pod's CNI ADD: Multus (List), nri-plugins/Kata (Get).
	for i := range 3 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf2}) {
			t.Errorf("List %d during the new pod's CNI ADD shows %v, want its own [%s], never its predecessor's %s", i, got, vf2, vf1)
		}
		if got := devicesOf(h.get("db", "db-0"), "db")["koordinator.sh/rdma"]; !slices.Equal(got, []string{vf2}) {
			t.Errorf("Get %d during the new pod's CNI ADD shows %v, want [%s]", i, got, vf2)
		}
	}
	// The new sandbox starts while the old one is still being torn down.
	h.markLive(statefulPod("uid-new", vf2), "sb-new")
	if got := multusVFs(t, h); !slices.Equal(got, []string{vf2}) {
		t.Errorf("with both sandboxes running db-0 shows %v, want [%s]", got, vf2)
	}
}

func TestARecreatedPodSeenByAnyKubeletReadIsNotAnsweredFromItsPredecessor(t *testing.T) {
	// The old sandbox's containers were not reported stopped yet, but a
	// /pods read made for another pod already shows db-0 with its new UID.
	h := newHarness(t, withTwoVFs())
	runningOld(t, h)
	h.k.SetPods(statefulPod("uid-new", vf2), fk.NewPod("other", "newcomer", "uid-newcomer"))
	h.get("other", "newcomer") // a pod the store does not know: a /pods read
	if got := multusVFs(t, h); !slices.Equal(got, []string{vf2}) {
		t.Errorf("db-0 shows %v, want the new pod's [%s], never its predecessor's %s", got, vf2, vf1)
	}
}

func TestARestartedContainerCostsNoKubeletReadWhileNoSandboxBegins(t *testing.T) {
	h := newHarness(t, withTwoVFs())
	runningOld(t, h)
	// The container exits and is restarted: the name is still its pod, and
	// no sandbox began on the node since the last read (a successor's
	// would have), so that read still says so.
	h.store.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-old", SandboxID: "sb-old", Name: "db", State: model.ContainerStopped})
	reads := h.k.PodsReads()
	for range 5 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf1}) {
			t.Fatalf("db-0 shows %v, want [%s]", got, vf1)
		}
	}
	if n := h.k.PodsReads() - reads; n != 0 {
		t.Errorf("5 Lists after a container stopped read /pods %d times, want 0", n)
	}
	// Another pod's sandbox begins: one read tells whether db-0 is still
	// its pod, not one per List.
	h.k.BeginSandbox("other", "web", "uid-web")
	reads = h.k.PodsReads()
	for range 5 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf1}) {
			t.Fatalf("db-0 shows %v, want [%s]", got, vf1)
		}
	}
	if n := h.k.PodsReads() - reads; n != 1 {
		t.Errorf("5 Lists after a sandbox began read /pods %d times, want 1", n)
	}
}

// recreateUnderItsName force-deletes the running db-0 and admits a new
// db-0 with vf2, as the kubelet does without the Pods API: /pods lists the
// new pod (pending) alone, and its log directory is made before its
// sandbox is asked for; the old sandbox still runs, its containers not yet
// reported stopped, and no /pods read has happened since.
func recreateUnderItsName(h *harness) {
	successor := statefulPod("uid-new", vf2)
	successor.Status.Phase = "Pending"
	h.k.SetPods(successor)
	h.k.BeginSandbox("db", "db-0", "uid-new")
}

func TestARunningPodRecreatedUnderItsNameIsNeverAnsweredWithItsPredecessorsVF(t *testing.T) {
	h := newHarness(t, withTwoVFs())
	runningOld(t, h)
	recreateUnderItsName(h)

	// Multus (List) and Kata or nri-plugins (Get) during the new pod's
	// CNI ADD.
	for i := range 3 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf2}) {
			t.Errorf("List %d during the new pod's CNI ADD shows %v, want its own [%s], never its predecessor's %s", i, got, vf2, vf1)
		}
		if got := devicesOf(h.get("db", "db-0"), "db")["koordinator.sh/rdma"]; !slices.Equal(got, []string{vf2}) {
			t.Errorf("Get %d during the new pod's CNI ADD shows %v, want [%s]", i, got, vf2)
		}
	}
}

func TestARunningPodRecreatedUnderItsNameIsUnavailableWhilePodsIsDown(t *testing.T) {
	h := newHarness(t, withTwoVFs())
	runningOld(t, h)
	h.k.SetPodsDown(true)
	recreateUnderItsName(h)
	for i := range 3 {
		_, err := h.v1().List(ctx(t), &v1.ListPodResourcesRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("List %d with /pods down after db-0 was recreated: %v, want Unavailable, never its predecessor's %s", i, err, vf1)
		}
		_, err = h.v1().Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "db", PodName: "db-0"})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("Get %d with /pods down after db-0 was recreated: %v, want Unavailable", i, err)
		}
	}
}

func TestRunningPodsOnASteadyNodeCostNoKubeletRead(t *testing.T) {
	h := newHarness(t, withTwoVFs())
	runningOld(t, h)
	reads := h.k.PodsReads()
	for i := range 10 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf1}) {
			t.Fatalf("List %d: db-0 shows %v, want [%s]", i, got, vf1)
		}
		if got := devicesOf(h.get("db", "db-0"), "db")["koordinator.sh/rdma"]; !slices.Equal(got, []string{vf1}) {
			t.Fatalf("Get %d: db-0 shows %v, want [%s]", i, got, vf1)
		}
	}
	if n := h.k.PodsReads() - reads; n != 0 {
		t.Errorf("10 Lists and 10 Gets of a running pod on a node where no sandbox began read /pods %d times, want 0", n)
	}
}

func TestARunningPodRecreatedUnderItsNameIsNotAnsweredFromItsPredecessorBeforeTheWatchShowsIt(t *testing.T) {
	// With the Pods API the kubelet sends the successor's event before it
	// makes its log directory, but the event may still be on its way when
	// the CNI ADD asks: the directory's entry says the name is another pod.
	h := newHarness(t, withTwoVFs(), withProviders(func(p *proxy.Providers) { p.Watching = func() bool { return true } }))
	runningOld(t, h)
	recreateUnderItsName(h)
	for i := range 3 {
		if got := multusVFs(t, h); !slices.Equal(got, []string{vf2}) {
			t.Errorf("List %d during the new pod's CNI ADD, its watch event not yet applied, shows %v, want its own [%s], never its predecessor's %s",
				i, got, vf2, vf1)
		}
	}
}
