package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// The tests run in this order, after podsapi_test.go's, and share the base
// pods (ensurePods). TestRemovedPodIsPrunedFromAnswerAndStore comes last: it
// removes a pod.

func TestNodeRunsStaticPodsWithTheKubeletsOwnAnswer(t *testing.T) {
	ensurePods(t)
	var resp *podresourcesv1.ListPodResourcesResponse
	poll(t, 30*time.Second, "the kubelet's List has every pod", func() error {
		var err error
		if resp, err = list(h.env["POD_RESOURCES_SOCK"], multus); err != nil {
			return err
		}
		for _, p := range basePods() {
			if refused(p) != nil {
				continue
			}
			if findPod(resp, podNamespace, p.fullName()) == nil {
				return fmt.Errorf("no %s/%s", podNamespace, p.fullName())
			}
		}
		return nil
	})
	// The kubelet lists sidecars first, then app containers.
	if got, want := containerNames(findPod(resp, podNamespace, sidecarPod.fullName())), []string{"mesh-proxy", "app-a", "app-b"}; !slices.Equal(got, want) {
		t.Errorf("kubelet's containers of %s = %v, want %v", sidecarPod.fullName(), got, want)
	}
	// The kubelet itself knows nothing of the scheduler's devices: that is
	// the problem podres-proxy solves.
	for _, p := range []testPod{gpuPod, rdmaPod, sidecarPod} {
		if d := devicesOf(findPod(resp, podNamespace, p.fullName())); len(d) != 0 {
			t.Errorf("the kubelet reports devices %v for %s; the test expects none", d, p.fullName())
		}
	}
}

func TestCNIProbeSawVFDuringAddBeforeTheSandboxExisted(t *testing.T) {
	ensurePods(t)
	recs, err := probeRecords()
	if err != nil {
		t.Fatal(err)
	}
	var rdmaAdd *probeRecord
	for _, p := range basePods() {
		var adds []probeRecord
		for _, r := range recs {
			if r.Command == "ADD" && r.Namespace == podNamespace && r.Name == p.fullName() {
				adds = append(adds, r)
			}
		}
		if len(adds) == 0 {
			t.Errorf("the CNI probe recorded no ADD for %s", p.fullName())
			continue
		}
		for _, r := range adds {
			if r.Error != "" {
				t.Errorf("CNI ADD of %s failed at %s (the kubelet retried): %s", p.fullName(), r.Time.Format(time.RFC3339Nano), r.Error)
			}
		}
		last := adds[len(adds)-1]
		if !last.PodFound {
			t.Errorf("during ADD of %s, List had no such pod", p.fullName())
		}
		if last.SandboxListed {
			t.Errorf("during ADD of %s the runtime already listed the sandbox (%s); the probe must run before it exists", p.fullName(), last.SandboxState)
		}
		t.Logf("ADD %s: devices %v, List took %d ms", p.fullName(), last.DeviceIDs, last.ListMillis)
		if p.name == rdmaPod.name {
			rdmaAdd = &last
		} else if len(last.DeviceIDs) != 0 {
			t.Errorf("during ADD of %s the probe got %s devices %v, want none", p.fullName(), rdmaResource, last.DeviceIDs)
		}
	}
	if rdmaAdd == nil {
		return
	}
	if h.serveMissing != "" {
		if len(rdmaAdd.DeviceIDs) != 0 {
			t.Errorf("the kubelet alone reported %v for %s", rdmaAdd.DeviceIDs, rdmaPod.fullName())
		}
		t.Skipf("the probe asked the kubelet (no VF there, as expected); %s", h.serveMissing)
	}
	if !slices.Equal(rdmaAdd.DeviceIDs, []string{rdmaVF}) {
		t.Errorf("during ADD of %s the probe got %s devices %v, want the VF [%s]", rdmaPod.fullName(), rdmaResource, rdmaAdd.DeviceIDs, rdmaVF)
	}
	// Multus copies the VF's device-info file into the pod's network-status
	// during the same ADD: serve must have written it before answering.
	if !strings.Contains(h.serveHelp, "-device-info-dir") {
		t.Skip("serve writes no device-info files (no --device-info-dir)")
	}
	var info struct {
		Type string `json:"type"`
		PCI  struct {
			PCIAddress string `json:"pci-address"`
		} `json:"pci"`
	}
	if len(rdmaAdd.DeviceInfo) == 0 {
		t.Fatalf("during ADD of %s the probe found no device-info for %s (%s): Multus would show none in network-status",
			rdmaPod.fullName(), rdmaVF, rdmaAdd.DeviceInfoError)
	}
	if err := json.Unmarshal(rdmaAdd.DeviceInfo, &info); err != nil || info.Type != "pci" || info.PCI.PCIAddress != rdmaVF {
		t.Errorf("during ADD of %s the VF's device-info was %s (%v), want type pci with pci-address %s", rdmaPod.fullName(), rdmaAdd.DeviceInfo, err, rdmaVF)
	}
}

func TestNRIRecordedTheSandboxAndInspectShowsItsDevices(t *testing.T) {
	requireProxy(t)
	ensurePods(t)
	var recs []storeRecord
	poll(t, 30*time.Second, "the store has every pod's sandbox from NRI, with its devices", func() error {
		var err error
		if recs, err = inspect(); err != nil {
			return err
		}
		for _, p := range basePods() {
			if refused(p) != nil {
				continue
			}
			if err := checkRecord(recs, p, "nri"); err != nil {
				return err
			}
		}
		return nil
	})
	// The sandbox the store knows is the one the probe saw being created,
	// and NRI told of it after the probe's List.
	probe, err := probeRecords()
	if err != nil {
		t.Fatal(err)
	}
	rec := findRecords(recs, podNamespace, rdmaPod.fullName())[0]
	var add *probeRecord
	for i := range probe {
		if probe[i].Command == "ADD" && probe[i].ContainerID == rec.SandboxID && probe[i].Error == "" {
			add = &probe[i]
		}
	}
	if add == nil {
		t.Fatalf("no successful CNI ADD for the store's sandbox %s of %s", rec.SandboxID, rdmaPod.fullName())
	}
	if !rec.Sources.Sandbox.At.After(add.Time) {
		t.Errorf("the store learned the sandbox at %v, not after the CNI ADD at %v", rec.Sources.Sandbox.At, add.Time)
	}
}

// checkRecord checks that the store holds one live record of p, from
// source, with p's devices.
func checkRecord(recs []storeRecord, p testPod, source string) error {
	rs := findRecords(recs, podNamespace, p.fullName())
	if len(rs) != 1 {
		return fmt.Errorf("%d records of %s, want 1", len(rs), p.fullName())
	}
	r := rs[0]
	if r.State != "ready" || r.SandboxID == "" || r.Sources.Sandbox == nil {
		return fmt.Errorf("record of %s: state %q, sandbox %q, sandbox source %+v; want a ready sandbox", p.fullName(), r.State, r.SandboxID, r.Sources.Sandbox)
	}
	if source != "" && r.Sources.Sandbox.Source != source {
		return fmt.Errorf("record of %s: sandbox learned from %q, want %q", p.fullName(), r.Sources.Sandbox.Source, source)
	}
	want := map[string][]string{}
	for _, byRes := range p.want {
		for res, ids := range byRes {
			want[res] = append(want[res], ids...)
		}
	}
	for res, ids := range want {
		slices.Sort(ids)
		if got := r.deviceIDs(res); !slices.Equal(got, ids) {
			return fmt.Errorf("record of %s: %s devices %v, want %v", p.fullName(), res, got, ids)
		}
	}
	return nil
}

func TestAForgedAllocationGetsNothingAndInspectSaysWhy(t *testing.T) {
	// forgerPod carries a copy of gpuPod's allocation and requests a GPU,
	// but default-scheduler placed it. Multus, DCGM and Kata must not see
	// gpuPod's GPU on it, gpuPod keeps it, and the store says why.
	requireProxy(t)
	ensurePods(t)
	if err := refused(forgerPod); err != nil {
		t.Skipf("the kubelet did not run %s: %v", forgerPod.fullName(), err)
	}
	poll(t, 30*time.Second, "inspect shows the forger's copy refused as wrong-scheduler", func() error {
		recs, err := inspect()
		if err != nil {
			return err
		}
		rs := findRecords(recs, podNamespace, forgerPod.fullName())
		if len(rs) != 1 {
			return fmt.Errorf("%d records of %s", len(rs), forgerPod.fullName())
		}
		for _, r := range rs[0].Refused {
			if r.Reason == "wrong-scheduler" && r.Class == "forged" && slices.Contains(r.IDs, gpuUUID) {
				return nil
			}
		}
		return fmt.Errorf("record of %s refuses %+v, want %s refused as wrong-scheduler (forged)", forgerPod.fullName(), rs[0].Refused, gpuUUID)
	})
	resp, err := list(h.proxySocket, multus)
	if err != nil {
		t.Fatalf("List on the proxy: %v", err)
	}
	if pr := findPod(resp, podNamespace, forgerPod.fullName()); pr == nil {
		t.Errorf("the proxy's List has no %s", forgerPod.fullName())
	} else if d := devicesOf(pr); len(d) != 0 {
		t.Errorf("List gives the forger %s devices %v, want none", forgerPod.fullName(), d)
	}
	if got := devicesOf(findPod(resp, podNamespace, gpuPod.fullName())); !got.equal(gpuPod.want) {
		t.Errorf("List gives %s %v, want %v: the victim must keep its GPU", gpuPod.fullName(), got, gpuPod.want)
	}
	g, err := get(h.proxySocket, podNamespace, forgerPod.fullName())
	if err != nil {
		t.Fatalf("Get of %s: %v", forgerPod.fullName(), err)
	}
	if d := devicesOf(g.GetPodResources()); len(d) != 0 {
		t.Errorf("Get (Kata, nri-plugins) gives the forger devices %v, want none", d)
	}
}

func TestDCGMListShowsTheGPUOnTheRequestingContainer(t *testing.T) {
	requireProxy(t)
	ensurePods(t)
	resp, err := list(h.proxySocket, dcgm)
	if err != nil {
		t.Fatalf("DCGM-like List on the proxy: %v", err)
	}
	for _, p := range []testPod{gpuPod, sidecarPod, rdmaPod, plainPod} {
		pr := findPod(resp, podNamespace, p.fullName())
		if pr == nil {
			t.Errorf("the proxy's List has no %s", p.fullName())
			continue
		}
		if got := devicesOf(pr); !got.equal(p.want) {
			t.Errorf("devices of %s = %v, want %v", p.fullName(), got, p.want)
		}
	}
	if pr := findPod(resp, podNamespace, sidecarPod.fullName()); pr != nil {
		if got, want := containerNames(pr), []string{"mesh-proxy", "app-a", "app-b"}; !slices.Equal(got, want) {
			t.Errorf("the proxy's containers of %s = %v, want the kubelet's %v", sidecarPod.fullName(), got, want)
		}
	}

	// dcgm-exporter up to 4.1.x asks v1alpha1, which lists no sidecars.
	old, err := listV1alpha1(h.proxySocket, dcgm)
	if err != nil {
		t.Fatalf("v1alpha1 List on the proxy: %v", err)
	}
	for _, pr := range old.GetPodResources() {
		if pr.GetNamespace() != podNamespace || pr.GetName() != sidecarPod.fullName() {
			continue
		}
		var gpuOn []string
		var names []string
		for _, c := range pr.GetContainers() {
			names = append(names, c.GetName())
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == gpuResource && slices.Contains(d.GetDeviceIds(), sidecarGPUUUID) {
					gpuOn = append(gpuOn, c.GetName())
				}
			}
		}
		if !slices.Equal(names, []string{"app-a", "app-b"}) || !slices.Equal(gpuOn, []string{"app-b"}) {
			t.Errorf("v1alpha1 %s: containers %v with the GPU on %v; want [app-a app-b] with the GPU on [app-b]", pr.GetName(), names, gpuOn)
		}
		return
	}
	t.Errorf("the proxy's v1alpha1 List has no %s", sidecarPod.fullName())
}

func TestGetAgreesWithList(t *testing.T) {
	requireProxy(t)
	ensurePods(t)
	resp, err := list(h.proxySocket, multus)
	if err != nil {
		t.Fatalf("List on the proxy: %v", err)
	}
	for _, p := range basePods() {
		lp := findPod(resp, podNamespace, p.fullName())
		if lp == nil {
			continue
		}
		g, err := get(h.proxySocket, podNamespace, p.fullName())
		if err != nil {
			t.Errorf("Get %s on the proxy: %v", p.fullName(), err)
			continue
		}
		if !proto.Equal(g.GetPodResources(), lp) {
			t.Errorf("Get %s = %v\nList has %v", p.fullName(), g.GetPodResources(), lp)
		}
	}
	// An unknown pod: the kubelet's error, unchanged. A kubelet before 1.34
	// has Get behind its KubeletPodResourcesGet gate (alpha, off): the proxy,
	// which answers Get from the kubelet's List, still answers it, with the
	// error the kubelet gives when Get is on.
	_, kerr := get(h.env["POD_RESOURCES_SOCK"], podNamespace, "nope")
	_, perr := get(h.proxySocket, podNamespace, "nope")
	ks, ps := status.Convert(kerr), status.Convert(perr)
	if ks.Message() == "PodResources API Get method disabled" {
		t.Logf("the kubelet's Get is disabled (%v %q); the proxy's answers", ks.Code(), ks.Message())
		ks = status.New(codes.Unknown, "pod nope in namespace "+podNamespace+" not found")
	}
	if kerr == nil || ks.Code() != ps.Code() || ks.Message() != ps.Message() {
		t.Errorf("Get of an unknown pod: proxy says %v %q, kubelet says %v %q", ps.Code(), ps.Message(), ks.Code(), ks.Message())
	}
}

func TestKubeletsOwnDevicesSurviveTheMerge(t *testing.T) {
	ensurePods(t)
	if err := refused(devPluginPod); err != nil {
		t.Fatalf("the standalone kubelet did not run %s, which asks for %s from the test device plugin: %v", devPluginPod.fullName(), devResource, err)
	}
	kubeletIDs := kubeletDevIDs(t)
	if len(kubeletIDs) != 1 || !slices.Contains(devDeviceIDs, kubeletIDs[0]) {
		t.Fatalf("the kubelet gave %s the %s devices %v; want one of %v", devPluginPod.fullName(), devResource, kubeletIDs, devDeviceIDs)
	}
	if allocs := h.dp.Allocations(); !slices.ContainsFunc(allocs, func(ids []string) bool { return slices.Equal(ids, kubeletIDs) }) {
		t.Errorf("the device plugin saw allocations %v, not %v", allocs, kubeletIDs)
	}
	requireProxy(t)
	resp, err := list(h.proxySocket, multus)
	if err != nil {
		t.Fatalf("List on the proxy: %v", err)
	}
	pr := findPod(resp, podNamespace, devPluginPod.fullName())
	if pr == nil {
		t.Fatalf("the proxy's List has no %s", devPluginPod.fullName())
	}
	want := devPluginPod.want.with(devices{"app": {devResource: kubeletIDs}})
	if got := devicesOf(pr); !got.equal(want) {
		t.Errorf("the proxy's devices of %s = %v, want the kubelet's and the scheduler's %v", devPluginPod.fullName(), got, want)
	}
	alloc, err := allocatable(h.proxySocket)
	if err != nil {
		t.Fatalf("GetAllocatableResources on the proxy: %v", err)
	}
	var ids []string
	for _, d := range alloc.GetDevices() {
		if d.GetResourceName() == devResource {
			ids = append(ids, d.GetDeviceIds()...)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, devDeviceIDs) {
		t.Errorf("the proxy's allocatable %s = %v, want the kubelet's %v", devResource, ids, devDeviceIDs)
	}
}

// TestHAMiGPUsReplaceTheKubeletsFakeIDs: HAMi's device plugin gives the
// kubelet ids of vGPU slots (GPU-<uuid>-<n>) that name no GPU, and HAMi's
// scheduler records the real GPUs in the pod's annotation, one entry per
// container, init containers first. The kubelet must really hold fake ids
// for the pod, or there is nothing to replace; the proxy must answer each
// container's real GPU in their place, under the resource HAMi advertises,
// in every method and version, so that DCGM exporter finds the GPU's pod.
func TestHAMiGPUsReplaceTheKubeletsFakeIDs(t *testing.T) {
	ensurePods(t)
	if err := refused(hamiPod); err != nil {
		t.Fatalf("the standalone kubelet did not run %s, which asks for %s from the HAMi-style device plugin: %v", hamiPod.fullName(), hamiResource, err)
	}
	name := hamiPod.fullName()
	kresp, err := list(h.env["POD_RESOURCES_SOCK"], multus)
	if err != nil {
		t.Fatalf("List on the kubelet: %v", err)
	}
	kpod := findPod(kresp, podNamespace, name)
	if kpod == nil {
		t.Fatalf("the kubelet's List has no %s", name)
	}
	// The kubelet lists the sidecar and the app container (never the plain
	// init container), each with one fake id it allocated through the
	// plugin, and nothing else.
	if got, want := containerNames(kpod), []string{"monitor", "app"}; !slices.Equal(got, want) {
		t.Fatalf("the kubelet's containers of %s = %v, want %v", name, got, want)
	}
	kubeletDevs := devicesOf(kpod)
	fake := map[string]string{} // container -> the fake id the kubelet gave it
	for _, c := range []string{"monitor", "app"} {
		ids := kubeletDevs[c][hamiResource]
		if len(ids) != 1 || !slices.Contains(hamiDeviceIDs, ids[0]) {
			t.Fatalf("the kubelet gave %s's %s the %s devices %v; want one of the plugin's %v", name, c, hamiResource, ids, hamiDeviceIDs)
		}
		fake[c] = ids[0]
		if allocs := h.hamiDP.Allocations(); !slices.ContainsFunc(allocs, func(a []string) bool { return slices.Equal(a, ids) }) {
			t.Errorf("the HAMi-style plugin saw allocations %v, not %v for %s", allocs, ids, c)
		}
	}
	if want := (devices{"monitor": {hamiResource: {fake["monitor"]}}, "app": {hamiResource: {fake["app"]}}}); !kubeletDevs.equal(want) || fake["monitor"] == fake["app"] {
		t.Fatalf("the kubelet's devices of %s = %v, want one distinct fake id per container", name, kubeletDevs)
	}
	t.Logf("the kubelet gave %s's monitor %s and app %s", name, fake["monitor"], fake["app"])
	isFake := func(id string) bool { return id == fake["monitor"] || id == fake["app"] }
	hamiGPUs := []string{hamiSidecarGPU, hamiAppGPU}

	requireProxy(t)
	// v1 List: the real GPUs in place of the fake ids, on the containers
	// HAMi's list names; no other pod gets anything of HAMi's.
	resp, err := list(h.proxySocket, multus)
	if err != nil {
		t.Fatalf("List on the proxy: %v", err)
	}
	pr := findPod(resp, podNamespace, name)
	if pr == nil {
		t.Fatalf("the proxy's List has no %s", name)
	}
	if got := devicesOf(pr); !got.equal(hamiPod.want) {
		t.Errorf("the proxy's List: devices of %s = %v, want %v in place of the kubelet's %v", name, got, hamiPod.want, kubeletDevs)
	}
	if got, want := containerNames(pr), containerNames(kpod); !slices.Equal(got, want) {
		t.Errorf("the proxy's containers of %s = %v, want the kubelet's %v", name, got, want)
	}
	for _, p := range resp.GetPodResources() {
		for c, byRes := range devicesOf(p) {
			for res, ids := range byRes {
				for _, id := range ids {
					switch {
					case isFake(id):
						t.Errorf("the proxy's List reports the kubelet's fake id %s (%s on %s/%s)", id, res, p.GetName(), c)
					case p.GetName() != name && (res == hamiResource || slices.Contains(hamiGPUs, id)):
						t.Errorf("the proxy's List reports HAMi's %s %s on %s/%s, another pod", res, id, p.GetName(), c)
					}
				}
			}
		}
	}
	// v1 Get (nri-plugins, Kata).
	g, err := get(h.proxySocket, podNamespace, name)
	if err != nil {
		t.Fatalf("Get %s on the proxy: %v", name, err)
	}
	if got := devicesOf(g.GetPodResources()); !got.equal(hamiPod.want) {
		t.Errorf("the proxy's Get: devices of %s = %v, want %v", name, got, hamiPod.want)
	}
	// v1alpha1 List lists app containers only.
	old, err := listV1alpha1(h.proxySocket, dcgm)
	if err != nil {
		t.Fatalf("v1alpha1 List on the proxy: %v", err)
	}
	found := false
	for _, p := range old.GetPodResources() {
		if p.GetNamespace() != podNamespace || p.GetName() != name {
			continue
		}
		found = true
		got := devices{}
		var names []string
		for _, c := range p.GetContainers() {
			names = append(names, c.GetName())
			for _, d := range c.GetDevices() {
				got = got.with(devices{c.GetName(): {d.GetResourceName(): d.GetDeviceIds()}})
			}
		}
		if want := (devices{"app": {hamiResource: {hamiAppGPU}}}); !slices.Equal(names, []string{"app"}) || !got.equal(want) {
			t.Errorf("the proxy's v1alpha1 List: %s has containers %v with devices %v; want [app] with %v", name, names, got, want)
		}
	}
	if !found {
		t.Errorf("the proxy's v1alpha1 List has no %s", name)
	}
	// DCGM exporter told HAMi's resource name (--nvidia-resource-names)
	// labels each GPU with its container; the fake ids match no GPU.
	owners, err := dcgmDeviceToPod(h.proxySocket, hamiResource)
	if err != nil {
		t.Fatalf("DCGM-like List on the proxy: %v", err)
	}
	for gpu, c := range map[string]string{hamiSidecarGPU: "monitor", hamiAppGPU: "app"} {
		if got, want := owners[gpu], (gpuOwner{podNamespace, name, c}); got != want {
			t.Errorf("DCGM exporter labels %s with %+v, want %+v", gpu, got, want)
		}
	}
	for id, o := range owners {
		if isFake(id) {
			t.Errorf("DCGM exporter maps the fake id %s to %+v", id, o)
		}
	}
}

// kubeletDevIDs returns the device plugin devices the kubelet itself
// reports for devPluginPod.
func kubeletDevIDs(t *testing.T) []string {
	t.Helper()
	resp, err := list(h.env["POD_RESOURCES_SOCK"], multus)
	if err != nil {
		t.Fatalf("List on the kubelet: %v", err)
	}
	pr := findPod(resp, podNamespace, devPluginPod.fullName())
	if pr == nil {
		t.Fatalf("the kubelet's List has no %s", devPluginPod.fullName())
	}
	return devicesOf(pr)["app"][devResource]
}

// recoveryLimit is how soon after a restarted component answers again the
// proxy must answer right again.
const recoveryLimit = 10 * time.Second

func TestRestartsKeepAnswersRightAndStateConverges(t *testing.T) {
	requireProxy(t)
	ensurePods(t)
	pods := slices.DeleteFunc(basePods(), func(p testPod) bool { return refused(p) != nil })
	var kubeletIDs []string
	if refused(devPluginPod) == nil {
		kubeletIDs = kubeletDevIDs(t)
	}
	want := map[string]devices{}
	for _, p := range pods {
		want[p.fullName()] = p.want
	}
	// check says what is wrong with a List answer: a pod present with
	// other devices than its own. A pod may be absent (the kubelet lists
	// pods again after it restarts), and the kubelet's own devices may be
	// absent while it restarts, but never different.
	check := func(resp *podresourcesv1.ListPodResourcesResponse) string {
		var wrong []string
		for _, pr := range resp.GetPodResources() {
			if pr.GetNamespace() != podNamespace {
				continue
			}
			w, ok := want[pr.GetName()]
			if !ok {
				continue
			}
			got := devicesOf(pr)
			if ids, ok := got["app"][devResource]; ok {
				if !slices.Equal(ids, kubeletIDs) {
					wrong = append(wrong, fmt.Sprintf("%s: %s %v, the kubelet gave %v", pr.GetName(), devResource, ids, kubeletIDs))
				}
				delete(got["app"], devResource)
				if len(got["app"]) == 0 {
					delete(got, "app")
				}
			}
			if !got.equal(w) {
				wrong = append(wrong, fmt.Sprintf("%s: %v, want %v", pr.GetName(), got, w))
			}
		}
		return strings.Join(wrong, "; ")
	}
	before, err := inspect()
	if err != nil {
		t.Fatal(err)
	}

	restarts := []struct {
		name    string
		restart func() error
		after   func(t *testing.T)
	}{
		{"kubelet", func() error { return h.script("restart-kubelet", "hack/node-restart.sh", h.root, "kubelet") }, nil},
		{"containerd", func() error { return h.script("restart-containerd", "hack/node-restart.sh", h.root, "containerd") }, func(t *testing.T) {
			// A pod created now must reach the store.
			if err := latePod.create(); err != nil {
				t.Fatal(err)
			}
			if err := waitRunning(2*time.Minute, latePod.fullName()); err != nil {
				t.Fatalf("a pod created after containerd restarted: %v", err)
			}
			// NRI tells of it (RunPodSandbox, or Synchronize if the plugin
			// reconnected later), so the plugin is connected again.
			poll(t, 30*time.Second, "the store records the pod created after the restart, from NRI", func() error {
				recs, err := inspect()
				if err != nil {
					return err
				}
				return checkRecord(recs, latePod, "nri")
			})
			want[latePod.fullName()] = latePod.want
		}},
		{"podres-proxy", func() error { return h.restartProxy(false) }, nil},
		// Crashes: no clean shutdown, sockets and files left behind.
		{"kubelet-SIGKILL", func() error {
			return h.script("restart-kubelet", "hack/node-restart.sh", h.root, "kubelet", "PODRES_RESTART_SIGNAL=KILL")
		}, nil},
		{"containerd-SIGKILL", func() error {
			return h.script("restart-containerd", "hack/node-restart.sh", h.root, "containerd", "PODRES_RESTART_SIGNAL=KILL")
		}, nil},
		{"podres-proxy-SIGKILL", func() error { return h.restartProxy(true) }, nil},
	}
	for _, r := range restarts {
		t.Run(r.name, func(t *testing.T) {
			w := startListWatch(h.proxySocket, check)
			defer w.stop()
			start := time.Now()
			poll(t, recoveryLimit, "a right answer before the restart", func() error {
				if _, ok := w.firstRightAfter(start); !ok {
					return errNotRight
				}
				return nil
			})
			if err := r.restart(); err != nil {
				t.Fatalf("restart %s: %v", r.name, err)
			}
			back := time.Now()
			poll(t, recoveryLimit, "a right answer after "+r.name+" is back", func() error {
				if _, ok := w.firstRightAfter(back); !ok {
					return errNotRight
				}
				return nil
			})
			at, _ := w.firstRightAfter(back)
			if r.after != nil {
				r.after(t)
			}
			w.stop()
			calls, errs, wrong, kinds := w.summary()
			t.Logf("%s restart: %d List calls, %d errors %q, right again %v after it was back", r.name, calls, errs, kinds, at.Sub(back).Round(time.Millisecond))
			if len(wrong) > 0 {
				t.Errorf("%d wrong answers while %s restarted, e.g. %s", len(wrong), r.name, strings.Join(wrong[:min(3, len(wrong))], " | "))
			}
		})
	}

	// The state converges: the same sandboxes, ready, with their devices,
	// and the proxy answers each pod right.
	poll(t, 60*time.Second, "the store and the answers converge after the restarts", func() error {
		recs, err := inspect()
		if err != nil {
			return err
		}
		for _, p := range pods {
			if err := checkRecord(recs, p, ""); err != nil {
				return err
			}
			old := findRecords(before, podNamespace, p.fullName())
			now := findRecords(recs, podNamespace, p.fullName())
			if len(old) == 1 && (old[0].UID != now[0].UID || old[0].SandboxID != now[0].SandboxID) {
				return fmt.Errorf("%s: record %s/%s before the restarts, %s/%s after", p.fullName(), old[0].UID, old[0].SandboxID, now[0].UID, now[0].SandboxID)
			}
		}
		resp, err := list(h.proxySocket, multus)
		if err != nil {
			return err
		}
		if wrong := check(resp); wrong != "" {
			return fmt.Errorf("wrong answer: %s", wrong)
		}
		for name := range want {
			if findPod(resp, podNamespace, name) == nil {
				return fmt.Errorf("the proxy's List has no %s", name)
			}
		}
		return nil
	})
}

var errNotRight = fmt.Errorf("no right answer yet")

// pruneWait is how long a removed pod may stay in the store.
func pruneWait() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("PODRES_E2E_PRUNE_WAIT")); err == nil {
		return d
	}
	return 3 * time.Minute
}

func TestRemovedPodIsPrunedFromAnswerAndStore(t *testing.T) {
	requireProxy(t)
	ensurePods(t)
	recs, err := inspect()
	if err != nil {
		t.Fatal(err)
	}
	old := findRecords(recs, podNamespace, gpuPod.fullName())
	if len(old) != 1 {
		t.Fatalf("%d records of %s before removal, want 1", len(old), gpuPod.fullName())
	}
	if err := gpuPod.remove(); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	poll(t, 60*time.Second, "the proxy's List drops the removed pod", func() error {
		resp, err := list(h.proxySocket, multus)
		if err != nil {
			return err
		}
		if findPod(resp, podNamespace, gpuPod.fullName()) != nil {
			return fmt.Errorf("%s is still listed", gpuPod.fullName())
		}
		return nil
	})
	t.Logf("gone from List %v after its manifest was removed", time.Since(removed).Round(time.Millisecond))
	_, kerr := get(h.env["POD_RESOURCES_SOCK"], podNamespace, gpuPod.fullName())
	_, perr := get(h.proxySocket, podNamespace, gpuPod.fullName())
	if ks, ps := status.Convert(kerr), status.Convert(perr); perr == nil || ks.Code() != ps.Code() || ks.Message() != ps.Message() {
		t.Errorf("Get of the removed pod: proxy says %v %q, kubelet says %v %q", ps.Code(), ps.Message(), ks.Code(), ks.Message())
	}
	poll(t, pruneWait(), "the store prunes the removed pod's record", func() error {
		recs, err := inspect()
		if err != nil {
			return err
		}
		for _, r := range recs {
			if r.UID == old[0].UID {
				return fmt.Errorf("record %s of %s is still there, state %q", r.UID, gpuPod.fullName(), r.State)
			}
		}
		return nil
	})
	t.Logf("pruned from the store %v after its manifest was removed", time.Since(removed).Round(time.Second))
}
