package proxy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/clients"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/trust"
)

// These tests are a tenant's attempts to get another pod's devices by
// writing an allocator's annotation on its own pod, answered the way the
// consumers that move hardware ask.

// nodeDevices is a node with the GPUs and the RDMA NIC the tests' annotations
// name, as the inventory finds them.
func nodeDevices() []inventory.Device {
	zero, one := int64(0), int64(1)
	return []inventory.Device{
		{Type: inventory.TypeGPU, ID: gpuUUID, Minor: &zero, NUMANode: &zero, Healthy: true, Source: inventory.SourceFile},
		{Type: inventory.TypeGPU, ID: gpuUUID2, Minor: &one, NUMANode: &one, Healthy: true, Source: inventory.SourceFile},
		{Type: inventory.TypeRDMA, ID: pfAddr, BusID: pfAddr, Minor: &zero, NUMANode: &zero, Healthy: true, Source: inventory.SourceFile,
			VFs: []inventory.VF{{BusID: vfAddr}}},
	}
}

func withNode() option { return withInventory(nodeDevices()...) }

// refusedReasons returns the reasons the store recorded for a pod's refused
// devices, sorted.
func refusedReasons(h *harness, uid string) []string {
	rec, ok := h.store.Get(uid)
	if !ok {
		return nil
	}
	var out []string
	for _, r := range rec.Refused {
		out = append(out, r.Reason)
	}
	slices.Sort(out)
	return out
}

func TestForgedAnnotationsGetNothingAndTheVictimKeepsItsDevices(t *testing.T) {
	h := newHarness(t, withNode())
	victim := fk.NewPod("ml", "victim", "uid-victim", fk.WithSchedulerName("koord-scheduler"),
		fk.WithAnnotation(koordKey, gpuAndVF),
		fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "1"}))
	forgers := []fk.Pod{
		// A copy of the victim's annotation on a default-scheduler pod
		// asking for nothing.
		fk.NewPod("tenant", "copycat", "uid-copycat", fk.WithAnnotation(koordKey, gpuAndVF)),
		// The same, asking for the resources: default-scheduler never
		// allocated them, so the request is only a quota charge.
		fk.NewPod("tenant", "asker", "uid-asker", fk.WithAnnotation(koordKey, gpuAndVF),
			fk.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "1"})),
		// Placed by koord-scheduler (any pod may name it), asking for
		// nothing: koord-scheduler allocated nothing and left the
		// tenant's annotation alone.
		fk.NewPod("tenant", "koord-freeloader", "uid-freeloader", fk.WithSchedulerName("koord-scheduler"),
			fk.WithAnnotation(koordKey, gpuAndVF)),
	}
	h.k.SetPods(append([]fk.Pod{victim}, forgers...)...)

	for _, f := range forgers {
		ids, err := clients.MultusDeviceIDs(ctx(t), h.socket, f.Namespace, f.Name, "koordinator.sh/rdma")
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 0 {
			t.Errorf("Multus would move VF %v into forger %s", ids, f.Name)
		}
		cdi, err := clients.KataCDIDevices(ctx(t), h.socket, f.Namespace, f.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(cdi) != 0 {
			t.Errorf("Kata would cold-plug %v into forger %s", cdi, f.Name)
		}
	}
	ids, err := clients.MultusDeviceIDs(ctx(t), h.socket, "ml", "victim", "koordinator.sh/rdma")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{vfAddr}) {
		t.Errorf("Multus hands the victim %v, want its VF %s", ids, vfAddr)
	}

	owners, err := clients.DCGMDeviceToPod(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if want := (clients.GPUOwner{Namespace: "ml", Pod: "victim", Container: "train"}); owners[gpuUUID] != want {
		t.Errorf("DCGM labels the victim's GPU with %+v, want %+v", owners[gpuUUID], want)
	}

	free, unknown, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) > 0 {
		t.Errorf("NFD finds ids it does not know: %v", unknown)
	}
	for key, want := range map[clients.NUMAKey]int{
		{Resource: "nvidia.com/gpu", NUMA: 0}: 0, // the victim's
		{Resource: "nvidia.com/gpu", NUMA: 1}: 1, // nobody's
	} {
		if free[key] != want {
			t.Errorf("NFD counts %d free %s on NUMA %d, want %d (a forger must not use the victim's GPU twice)", free[key], key.Resource, key.NUMA, want)
		}
	}

	// Each refusal is recorded, counted once per device whatever the
	// number of queries, and logged with the pod and the reason.
	for uid, want := range map[string][]string{
		"uid-copycat":    {trust.ReasonWrongScheduler, trust.ReasonWrongScheduler},
		"uid-asker":      {trust.ReasonWrongScheduler, trust.ReasonWrongScheduler},
		"uid-freeloader": {trust.ReasonNoRequest, trust.ReasonNoRequest},
		"uid-victim":     nil,
	} {
		if got := refusedReasons(h, uid); !slices.Equal(got, want) {
			t.Errorf("%s: refused %v, want %v", uid, got, want)
		}
	}
	for reason, want := range map[string]float64{trust.ReasonWrongScheduler: 4, trust.ReasonNoRequest: 2} {
		if got := h.counter("podres_proxy_allocations_refused_total", "allocator", "koordinator", "reason", reason); got != want {
			t.Errorf("podres_proxy_allocations_refused_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
	logged := map[string]bool{}
	for _, e := range h.logs.AllEntries() {
		if e.Data["reason"] != nil {
			logged[e.Data["pod"].(string)+" "+e.Data["reason"].(string)] = true
		}
	}
	for _, want := range []string{"tenant/copycat wrong-scheduler", "tenant/asker wrong-scheduler", "tenant/koord-freeloader no-request"} {
		if !logged[want] {
			t.Errorf("no warning for %s; logged %v", want, logged)
		}
	}
}

func TestSchedulerNamesAreConfigurable(t *testing.T) {
	// Koordinator runs as the default scheduler: its pods say
	// default-scheduler, and koord-scheduler is not in use.
	h := newHarness(t, withSchedulerNames(map[string][]string{koordinator.Name: {"default-scheduler"}}), withNode())
	h.k.SetPods(
		fk.NewPod("ml", "train", "uid-1", fk.WithAnnotation(koordKey, oneGPU),
			fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})),
		fk.NewPod("ml", "other", "uid-2", fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, oneGPU),
			fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})))
	if got := devicesOf(h.get("ml", "train"), "train")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("default-scheduler pod with --koordinator-scheduler-names=default-scheduler shows %v, want %s", got, gpuUUID)
	}
	if got := devicesOf(h.get("ml", "other"), "train")["nvidia.com/gpu"]; len(got) != 0 {
		t.Errorf("koord-scheduler pod shows %v although only default-scheduler is trusted", got)
	}
}

func TestUnsafeAndForeignIDsAreRefused(t *testing.T) {
	h := newHarness(t, withNode())
	const notHere = "GPU-00000000-1111-4222-8333-444455556666"
	gpu := func(id string) string {
		return `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"` + id + `"}]}`
	}
	requests := fk.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100"})
	koord := fk.WithSchedulerName("koord-scheduler")
	h.k.SetPods(
		fk.NewPod("t", "all", "uid-all", koord, requests, fk.WithAnnotation(koordKey, gpu("all"))),
		fk.NewPod("t", "escape", "uid-escape", koord, requests, fk.WithAnnotation(koordKey, gpu(`GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a\u001b[2J`))),
		fk.NewPod("t", "elsewhere", "uid-elsewhere", koord, requests, fk.WithAnnotation(koordKey, gpu(notHere))),
		fk.NewPod("t", "rdma-all", "uid-rdma-all", koord, fk.WithAnnotation(koordKey,
			`{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"`+pfAddr+`","extension":{"vfs":[{"minor":-1,"busID":"all"}]}}]}`),
			fk.WithContainer("app", map[string]string{"koordinator.sh/rdma": "1"})),
		fk.NewPod("hami", "all", "uid-hami-all", fk.WithSchedulerName("hami-scheduler"),
			fk.WithAnnotation("hami.io/vgpu-devices-allocated", "all,NVIDIA,1000,100:;"),
			fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"})),
		fk.NewPod("t", "good", "uid-good", koord, requests, fk.WithAnnotation(koordKey, gpu(gpuUUID))),
	)
	for _, p := range []struct{ ns, name string }{{"t", "all"}, {"t", "escape"}, {"t", "elsewhere"}, {"t", "rdma-all"}, {"hami", "all"}} {
		cdi, err := clients.KataCDIDevices(ctx(t), h.socket, p.ns, p.name)
		if err != nil {
			t.Fatal(err)
		}
		if len(cdi) != 0 {
			t.Errorf("Kata would cold-plug %q into %s/%s", cdi, p.ns, p.name)
		}
	}
	cdi, err := clients.KataCDIDevices(ctx(t), h.socket, "t", "good")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cdi, []string{"nvidia.com/gpu=" + gpuUUID}) {
		t.Errorf("the well-formed pod gets %q, want its GPU", cdi)
	}
	for uid, want := range map[string]string{
		"uid-all": trust.ReasonUnsafeID, "uid-escape": trust.ReasonUnsafeID, "uid-rdma-all": trust.ReasonUnsafeID,
		"uid-hami-all": trust.ReasonUnsafeID, "uid-elsewhere": trust.ReasonNotOnNode,
	} {
		rec, _ := h.store.Get(uid)
		if rec == nil || len(rec.Refused) != 1 || rec.Refused[0].Reason != want {
			t.Errorf("%s: refused %+v, want one device refused as %s", uid, refusedOf(rec), want)
			continue
		}
		if class := rec.Refused[0].Class; class != trust.ReasonClass(want) {
			t.Errorf("%s: class %q, want %q", uid, class, trust.ReasonClass(want))
		}
		if strings.ContainsRune(rec.Refused[0].Detail, '\x1b') {
			t.Errorf("%s: the detail carries the id's raw escape: %q", uid, rec.Refused[0].Detail)
		}
	}
	if got := h.counter("podres_proxy_allocations_refused_total", "allocator", "koordinator", "reason", trust.ReasonNotOnNode); got != 1 {
		t.Errorf("not-on-node refusals counted %v, want 1", got)
	}
}

func refusedOf(rec *record.Record) []model.Refused {
	if rec == nil {
		return nil
	}
	return rec.Refused
}

func TestAPodWhoseSpecWasNeverReadIsNotBelieved(t *testing.T) {
	h := newHarness(t, withNode())
	// NRI reported the sandbox with a copied annotation, and /pods has been
	// down since: nothing says which scheduler placed the pod or what it
	// requests.
	p := fk.NewPod("tenant", "copycat", "uid-copycat", fk.WithAnnotation(koordKey, gpuAndVF))
	h.k.SetPods(p)
	h.k.SetPodsDown(true)
	h.markLive(p, "sandbox-1")
	owners, err := clients.DCGMDeviceToPod(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if owner, ok := owners[gpuUUID]; ok {
		t.Errorf("DCGM labels %s with %+v, a pod that was never vetted", gpuUUID, owner)
	}
	if got := refusedReasons(h, "uid-copycat"); !slices.Equal(got, []string{trust.ReasonSpecUnknown, trust.ReasonSpecUnknown}) {
		t.Errorf("refused %v, want both devices refused as %s", got, trust.ReasonSpecUnknown)
	}
}

func TestAContestedWholeGPUStaysWithItsFirstHolder(t *testing.T) {
	h := newHarness(t, withNode())
	koord := fk.WithSchedulerName("koord-scheduler")
	wholeGPU := fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})
	// A default-scheduler copy seen first holds nothing: only a claim the
	// other rules believe can hold a device.
	copycat := fk.NewPod("tenant", "copycat", "uid-copycat", fk.WithAnnotation(koordKey, oneGPU), wholeGPU)
	first := fk.NewPod("ml", "first", "uid-zz-first", koord, fk.WithAnnotation(koordKey, oneGPU), wholeGPU)
	h.k.SetPods(copycat)
	h.markLive(copycat, "sandbox-0")
	h.list()
	h.k.SetPods(copycat, first)
	h.markLive(first, "sandbox-1")
	h.list()
	// The same GPU written on a second pod of the same scheduler (its owner
	// edited the annotation), started later.
	second := fk.NewPod("ml", "second", "uid-aa-second", koord, fk.WithAnnotation(koordKey, oneGPU), wholeGPU)
	h.k.SetPods(copycat, first, second)
	h.markLive(second, "sandbox-2")

	owners, err := clients.DCGMDeviceToPod(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if want := (clients.GPUOwner{Namespace: "ml", Pod: "first", Container: "train"}); owners[gpuUUID] != want {
		t.Errorf("DCGM labels the GPU with %+v, want its first holder %+v", owners[gpuUUID], want)
	}
	for _, p := range []fk.Pod{second, copycat} {
		cdi, err := clients.KataCDIDevices(ctx(t), h.socket, p.Namespace, p.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(cdi) != 0 {
			t.Errorf("Kata would cold-plug %v into %s, whose GPU another pod holds", cdi, p.Name)
		}
	}
	free, _, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if got := free[clients.NUMAKey{Resource: "nvidia.com/gpu", NUMA: 0}]; got != 0 {
		t.Errorf("NFD counts %d free GPUs on NUMA 0, want 0: one GPU, used once", got)
	}
	if got := refusedReasons(h, "uid-aa-second"); !slices.Equal(got, []string{trust.ReasonContested}) {
		t.Errorf("second claimant refused %v, want [%s]", got, trust.ReasonContested)
	}
}

func TestASharedGPUIsShownOnEverySharer(t *testing.T) {
	h := newHarness(t, withNode())
	half := `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"},"id":"` + gpuUUID + `"}]}`
	var pods []fk.Pod
	for _, name := range []string{"a", "b"} {
		pods = append(pods, fk.NewPod("ml", name, "uid-"+name, fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, half),
			fk.WithContainer("infer", map[string]string{"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"})))
	}
	h.k.SetPods(pods...)
	for _, p := range pods {
		h.markLive(p, "sandbox-"+p.Name)
	}
	// The first sharer is the GPU's anchor (its plain UUID), the other
	// its slot (trust/sharedgpu.go): both are shown, neither is contested.
	want := map[string]string{"a": gpuUUID, "b": gpuUUID + "::1"}
	for _, p := range pods {
		if got := devicesOf(h.get(p.Namespace, p.Name), "infer")["nvidia.com/gpu"]; !slices.Equal(got, []string{want[p.Name]}) {
			t.Errorf("sharer %s shows %v, want its share of %s as %s", p.Name, got, gpuUUID, want[p.Name])
		}
	}
}

// startInTurn brings up first, then second, each learned from /pods and
// then from NRI, so that first's claims are learned before second's.
func (h *harness) startInTurn(first, second fk.Pod) {
	h.k.SetPods(first)
	h.list()
	h.markLive(first, "sandbox-1")
	h.k.SetPods(first, second)
	h.list()
	h.markLive(second, "sandbox-2")
}

// runningTrainer starts a pod holding gpuUUID whole, learned from /pods and
// then from NRI, and returns it and the same pod with its annotation edited
// in the API to name gpuUUID2.
func runningTrainer(h *harness) (p, edited fk.Pod) {
	koord := fk.WithSchedulerName("koord-scheduler")
	wholeGPU := fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})
	p = fk.NewPod("ml", "trainer", "uid-trainer", koord, fk.WithAnnotation(koordKey, oneGPU), wholeGPU)
	h.k.SetPods(p)
	h.list()
	h.markLive(p, "sandbox-1")
	edited = fk.NewPod("ml", "trainer", "uid-trainer", koord,
		fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpuUUID2)), wholeGPU)
	return p, edited
}

func TestAnAnnotationEditedOnARunningPodChangesNothingAndIsCounted(t *testing.T) {
	// kubectl annotate --overwrite on a running pod: the API's copy now
	// names another GPU, the runtime's (NRI) still the one the sandbox
	// started with. The answer must stay, not follow the edit or flip
	// between the two as /pods reads and runtime events alternate.
	h := newHarness(t, withNode())
	p, edited := runningTrainer(h)

	gpus := func() []string {
		t.Helper()
		owners, err := clients.DCGMDeviceToPod(ctx(t), h.socket)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for id, o := range owners {
			if o.Pod == "trainer" {
				out = append(out, id)
			}
		}
		slices.Sort(out)
		return out
	}
	if got := gpus(); !slices.Equal(got, []string{gpuUUID}) {
		t.Fatalf("before the edit the pod shows %v, want [%s]", got, gpuUUID)
	}

	// A new pod's Get makes the proxy read /pods, which now has the edit.
	newcomer := fk.NewPod("ml", "newcomer", "uid-newcomer")
	h.k.SetPods(edited, newcomer)
	reads := h.counter("podres_proxy_kubelet_pods_reads_total", "result", "ok")
	if _, err := clients.KataCDIDevices(ctx(t), h.socket, "ml", "newcomer"); err != nil {
		t.Fatal(err)
	}
	if h.counter("podres_proxy_kubelet_pods_reads_total", "result", "ok") == reads {
		t.Fatal("the newcomer's Get did not read /pods: the test would show nothing")
	}
	for range 2 { // and again after the runtime confirms its copy
		if got := gpus(); !slices.Equal(got, []string{gpuUUID}) {
			t.Errorf("after the edit the pod shows %v, want still [%s]", got, gpuUUID)
		}
		h.markLive(p, "sandbox-1")
	}
	if got := refusedReasons(h, "uid-trainer"); !slices.Equal(got, []string{trust.ReasonEdited}) {
		t.Errorf("refused %v, want [%s]", got, trust.ReasonEdited)
	}
	if got := h.counter("podres_proxy_allocations_refused_total", "allocator", koordinator.Name, "reason", trust.ReasonEdited); got != 1 {
		t.Errorf("allocations_refused_total{koordinator,edited} = %v, want 1", got)
	}
}

func TestAnEditTakesNoEffectWhenThePodsSandboxIsRecreated(t *testing.T) {
	// The annotation is edited in the API (refused as edited), then the
	// pod's sandbox is recreated (the pause process killed, a node reboot):
	// the runtime starts the new sandbox from the pod as the API has it,
	// edit included. The allocation stays the one the pod UID's first
	// sandbox started with.
	h := newHarness(t, withNode())
	_, edited := runningTrainer(h)

	h.k.SetPods(edited)
	h.markLive(edited, "sandbox-2")
	for call, pod := range map[string]*v1.PodResources{"List": findPod(h.list(), "ml", "trainer"), "Get": h.get("ml", "trainer")} {
		if got := devicesOf(pod, "train")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID}) {
			t.Errorf("%s after the sandbox was recreated: %v, want still [%s], never the edited %s", call, got, gpuUUID, gpuUUID2)
		}
	}
	if got := refusedReasons(h, "uid-trainer"); !slices.Equal(got, []string{trust.ReasonEdited}) {
		t.Errorf("refused %v, want [%s]", got, trust.ReasonEdited)
	}
}

func TestWholeAndSharedClaimsOnOneGPUKeepTheFirstClaim(t *testing.T) {
	// One GPU is claimed whole by one pod and as a share by another. The
	// claim learned first stands: a sharer never rides on a GPU another pod
	// holds whole, and nobody takes whole a GPU that others share.
	half := `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"},"id":"` + gpuUUID + `"}]}`
	koord := fk.WithSchedulerName("koord-scheduler")
	whole := func(name string) fk.Pod {
		return fk.NewPod("ml", name, "uid-"+name, koord, fk.WithAnnotation(koordKey, oneGPU),
			fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
	}
	share := func(name string) fk.Pod {
		return fk.NewPod("ml", name, "uid-"+name, koord, fk.WithAnnotation(koordKey, half),
			fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}))
	}
	for _, c := range []struct {
		name          string
		first, second fk.Pod
	}{
		{"whole first, then a share", whole("holder"), share("rider")},
		{"a share first, then whole", share("sharer"), whole("taker")},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, withNode())
			h.startInTurn(c.first, c.second)
			if got := devicesOf(h.get("ml", c.first.Name), "train")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID}) {
				t.Errorf("first claimant %s shows %v, want %s", c.first.Name, got, gpuUUID)
			}
			if got := devicesOf(h.get("ml", c.second.Name), "train")["nvidia.com/gpu"]; len(got) != 0 {
				t.Errorf("later claimant %s shows %v, want nothing", c.second.Name, got)
			}
			if got := refusedReasons(h, "uid-"+c.second.Name); !slices.Equal(got, []string{trust.ReasonContested}) {
				t.Errorf("later claimant refused %v, want [%s]", got, trust.ReasonContested)
			}
		})
	}
}

func TestARefusedAllocationLeavesTheKubeletsOwnDevices(t *testing.T) {
	// A default-scheduler pod whose GPU comes from NVIDIA's device plugin
	// (the kubelet reports its real UUID) also carries a HAMi annotation,
	// refused as wrong-scheduler. The refusal adds nothing and removes
	// nothing: DCGM exporter still labels the pod's GPU, NFD and RTE still
	// count it used, on every method.
	h := newHarness(t, withNode())
	h.k.SetPods(fk.NewPod("tenant", "plugin-gpu", "uid-plugin-gpu",
		fk.WithAnnotation(hamiKey, gpuUUID2+",NVIDIA,3000,30:;"),
		fk.WithContainer("main", map[string]string{"nvidia.com/gpu": "1"}),
		fk.WithKubeletDevices("main", "nvidia.com/gpu", 0, gpuUUID)))
	for call, pod := range map[string]*v1.PodResources{"List": findPod(h.list(), "tenant", "plugin-gpu"), "Get": h.get("tenant", "plugin-gpu")} {
		if ids := devicesOf(pod, "main")["nvidia.com/gpu"]; !slices.Equal(ids, []string{gpuUUID}) {
			t.Errorf("%s: main's nvidia.com/gpu = %v, want the kubelet's own [%s], without the refused %s", call, ids, gpuUUID, gpuUUID2)
		}
	}
	alpha, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range alpha.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if p.GetName() == "plugin-gpu" && d.GetResourceName() == "nvidia.com/gpu" {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	if !slices.Equal(ids, []string{gpuUUID}) {
		t.Errorf("v1alpha1 List: nvidia.com/gpu = %v, want the kubelet's own [%s]", ids, gpuUUID)
	}
	if got := refusedReasons(h, "uid-plugin-gpu"); !slices.Equal(got, []string{trust.ReasonWrongScheduler}) {
		t.Errorf("refused %v, want [%s]", got, trust.ReasonWrongScheduler)
	}
}

// fourGPUs is a node with four GPUs, as the inventory finds them.
func fourGPUs() (ids []string, devs []inventory.Device) {
	for i := range int64(4) {
		n := i
		id := fmt.Sprintf("GPU-4a0c5e1d-77b2-4c1e-9d3a-0000000000%02d", i)
		ids = append(ids, id)
		devs = append(devs, inventory.Device{Type: inventory.TypeGPU, ID: id, Minor: &n, NUMANode: new(int64), Healthy: true, Source: inventory.SourceFile})
	}
	return ids, devs
}

func TestAWholeGPURequestIsShownOneGPUWhateverTheAnnotationNames(t *testing.T) {
	// A pod placed by koord-scheduler asks for one whole GPU, and quota
	// counted one; its annotation (edited before the sandbox started)
	// names all four free GPUs of the node. Kata would cold-plug four,
	// DCGM blame it for four, NFD count four used.
	ids, devs := fourGPUs()
	h := newHarness(t, withInventory(devs...))
	var entries []string
	for i, id := range ids {
		entries = append(entries, fmt.Sprintf(`{"minor":%d,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"},"id":"%s"}`, i, id))
	}
	greedy := fk.NewPod("tenant", "greedy", "uid-greedy", fk.WithSchedulerName("koord-scheduler"),
		fk.WithAnnotation(koordKey, `{"gpu":[`+strings.Join(entries, ",")+`]}`),
		fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100"}))
	h.k.SetPods(greedy)
	h.markLive(greedy, "sandbox-greedy")

	cdi, err := clients.KataCDIDevices(ctx(t), h.socket, "tenant", "greedy")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nvidia.com/gpu=" + ids[0]}; !slices.Equal(cdi, want) {
		t.Errorf("Kata would cold-plug %v, want %v: the pod asked for one GPU", cdi, want)
	}
	free, _, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if got := free[clients.NUMAKey{Resource: "nvidia.com/gpu", NUMA: 0}]; got != 3 {
		t.Errorf("NFD counts %d free GPUs, want 3", got)
	}
	want := []string{trust.ReasonOverRequest, trust.ReasonOverRequest, trust.ReasonOverRequest}
	if got := refusedReasons(h, "uid-greedy"); !slices.Equal(got, want) {
		t.Errorf("refused %v, want %v", got, want)
	}
	if got := h.counter("podres_proxy_allocations_refused_total", "allocator", "koordinator", "reason", trust.ReasonOverRequest); got != 3 {
		t.Errorf("podres_proxy_allocations_refused_total{reason=%q} = %v, want 3", trust.ReasonOverRequest, got)
	}
}

func TestAPFAndItsVFAreNeverShownOnTwoPods(t *testing.T) {
	// Whoever owns the PF sets its VFs' MAC, VLAN and trust: a pod given
	// the PF while another holds one of its VFs (or the other way round)
	// owns the other's network. Both orders: the first claim stands.
	koord := fk.WithSchedulerName("koord-scheduler")
	vfPod := func(name string) fk.Pod {
		return fk.NewPod("ml", name, "uid-"+name, koord,
			fk.WithAnnotation(koordKey, `{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"100"},"id":"`+pfAddr+`","extension":{"vfs":[{"minor":-1,"busID":"`+vfAddr+`"}]}}]}`),
			fk.WithContainer("app", map[string]string{"koordinator.sh/rdma": "100"}))
	}
	pfPod := func(name string) fk.Pod {
		return fk.NewPod("ml", name, "uid-"+name, koord,
			fk.WithAnnotation(koordKey, `{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"100"},"id":"`+pfAddr+`"}]}`),
			fk.WithContainer("app", map[string]string{"koordinator.sh/rdma": "100"}))
	}
	for _, c := range []struct {
		name          string
		first, second fk.Pod
		want          string
	}{
		{"the VF first, then the PF", vfPod("vf-holder"), pfPod("pf-taker"), vfAddr},
		{"the PF first, then a VF", pfPod("pf-holder"), vfPod("vf-taker"), pfAddr},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, withNode())
			h.startInTurn(c.first, c.second)
			ids, err := clients.MultusDeviceIDs(ctx(t), h.socket, "ml", c.first.Name, "koordinator.sh/rdma")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids, []string{c.want}) {
				t.Errorf("Multus hands the first claimant %v, want %s", ids, c.want)
			}
			ids, err = clients.MultusDeviceIDs(ctx(t), h.socket, "ml", c.second.Name, "koordinator.sh/rdma")
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != 0 {
				t.Errorf("Multus hands %v to %s, whose PF or VF another pod holds", ids, c.second.Name)
			}
			if got := refusedReasons(h, string(c.second.UID)); !slices.Equal(got, []string{trust.ReasonContested}) {
				t.Errorf("later claimant refused %v, want [%s]", got, trust.ReasonContested)
			}
		})
	}
}

func TestAMIGInstanceOfAGPUHeldWholeIsNotShown(t *testing.T) {
	// One pod holds the GPU whole; another's annotation names a MIG
	// instance of it (MIG-GPU-<uuid>/<gi>/<ci>), or of a GPU this node
	// does not have. Neither is cold-plugged.
	koord := fk.WithSchedulerName("koord-scheduler")
	oneWhole := fk.WithContainer("train", map[string]string{"nvidia.com/gpu": "1"})
	mig := func(uuid string) string {
		return `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"MIG-` + uuid + `/1/0"}]}`
	}
	holder := fk.NewPod("ml", "holder", "uid-holder", koord, fk.WithAnnotation(koordKey, oneGPU), oneWhole)
	slicer := fk.NewPod("tenant", "slicer", "uid-slicer", koord, fk.WithAnnotation(koordKey, mig(gpuUUID)), oneWhole)
	stranger := fk.NewPod("tenant", "stranger", "uid-stranger", koord,
		fk.WithAnnotation(koordKey, mig("GPU-0f0f0f0f-1111-4222-8333-444455556666")), oneWhole)
	h := newHarness(t, withNode())
	h.k.SetPods(holder)
	h.list()
	h.markLive(holder, "sandbox-holder")
	h.k.SetPods(holder, slicer, stranger)
	h.list()
	h.markLive(slicer, "sandbox-slicer")
	h.markLive(stranger, "sandbox-stranger")

	for _, p := range []fk.Pod{slicer, stranger} {
		cdi, err := clients.KataCDIDevices(ctx(t), h.socket, p.Namespace, p.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(cdi) != 0 {
			t.Errorf("Kata would cold-plug %v into %s", cdi, p.Name)
		}
	}
	if cdi, err := clients.KataCDIDevices(ctx(t), h.socket, "ml", "holder"); err != nil || !slices.Equal(cdi, []string{"nvidia.com/gpu=" + gpuUUID}) {
		t.Errorf("the holder shows %v (%v), want its GPU", cdi, err)
	}
	if got := refusedReasons(h, "uid-slicer"); !slices.Equal(got, []string{trust.ReasonContested}) {
		t.Errorf("a MIG instance of a held GPU refused %v, want [%s]", got, trust.ReasonContested)
	}
	if got := refusedReasons(h, "uid-stranger"); !slices.Equal(got, []string{trust.ReasonNotOnNode}) {
		t.Errorf("a MIG instance of a GPU not on the node refused %v, want [%s]", got, trust.ReasonNotOnNode)
	}
}
