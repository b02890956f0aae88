package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// The node's kubelet serves its Pods API (KEP-4188, the PodsAPI gate;
// PODRES_E2E_PODS_API=0 turns it off) and serve watches it: a pod being
// created is known from the watch before its CNI ADD, so answering Multus
// needs no read of the kubelet's /pods at all. These tests run before
// scenarios_test.go's (file order); their pods keep running.

// vfPods are created together, as a burst of pods the scheduler placed on
// the node, each with a VF of its own; vfPodAfterRestart once the kubelet
// was killed and restarted.
var (
	vfPods = []testPod{
		newVFPod("vf-1", "0000:3b:02.2"),
		newVFPod("vf-2", "0000:3b:02.3"),
		newVFPod("vf-3", "0000:3b:02.4"),
		newVFPod("vf-4", "0000:3b:02.5"),
	}
	vfPodAfterRestart = newVFPod("vf-5", "0000:3b:02.6")
)

// podsAPIResync is how soon after the kubelet is back serve's watch must
// have relisted: its reconnect backoff grows to 8 s and more while the
// kubelet is down.
const podsAPIResync = 45 * time.Second

func TestVFPodsAreAnsweredDuringCNIAddWithoutReadingPodsAcrossAKubeletKill(t *testing.T) {
	requireProxy(t)
	ensurePods(t)
	podsAPI := h.podsAPI()
	if podsAPI {
		// serve may have read /pods while its first watch was syncing;
		// from the first relist on, it must not.
		poll(t, 30*time.Second, "serve's watch of the kubelet's Pods API relists", func() error {
			n, err := h.metric("podres_proxy_pods_api_relists_total")
			if err == nil && n < 1 {
				err = fmt.Errorf("podres_proxy_pods_api_relists_total is %v", n)
			}
			return err
		})
		t.Logf("the kubelet serves its Pods API on %s; serve watches it", h.env["PODS_API_SOCK"])
	} else {
		t.Logf("the kubelet serves no Pods API (PodsAPI gate off, or serve without --kubelet-pods-api-socket): serve reads /pods")
	}

	// N pods with VFs at once: each CNI ADD must see its own VF.
	before := countReads(t)
	createAndAwait(t, vfPods...)
	reads := countReads(t).since(before)
	t.Logf("%d VF pods created: %s", len(vfPods), reads)
	checkVFAdds(t, vfPods)
	checkReadSources(t, reads, podsAPI)
	if podsAPI {
		events, err := h.metric("podres_proxy_pods_api_events_total")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("serve received %v Pods API watch events so far", events)
		if events == 0 {
			t.Errorf("podres_proxy_pods_api_events_total is 0: serve saw none of the kubelet's pods through its watch")
		}
	}
	pods := append(slices.DeleteFunc(basePods(), func(p testPod) bool { return refused(p) != nil }), vfPods...)
	poll(t, recoveryLimit, "the proxy's List gives every pod its devices", func() error { return everyPodRight(pods) })

	// Kill the kubelet: its Pods API goes away and serve's watch with it.
	// While it is down and after it is back, no answer may be wrong; once
	// it is back every pod is answered with its devices again, and the
	// watch relists.
	relists, err := h.metric("podres_proxy_pods_api_relists_total")
	if err != nil {
		t.Fatal(err)
	}
	w := startListWatch(h.proxySocket, func(resp *podresourcesv1.ListPodResourcesResponse) string { return wrongDevices(resp, pods) })
	defer w.stop()
	if err := h.script("restart-kubelet", "hack/node-restart.sh", h.root, "kubelet", "PODRES_RESTART_SIGNAL=KILL"); err != nil {
		t.Fatalf("kill and restart the kubelet: %v", err)
	}
	back := time.Now()
	poll(t, recoveryLimit, "the proxy's List gives every pod its devices after the kubelet is back", func() error { return everyPodRight(pods) })
	t.Logf("every pod answered right %v after the kubelet was back", time.Since(back).Round(time.Millisecond))
	w.stop()
	calls, errs, wrong, kinds := w.summary()
	t.Logf("while the kubelet restarted: %d List calls, %d errors %q", calls, errs, kinds)
	if len(wrong) > 0 {
		t.Errorf("%d wrong answers while the kubelet restarted, e.g. %s", len(wrong), strings.Join(wrong[:min(3, len(wrong))], " | "))
	}
	if podsAPI {
		poll(t, podsAPIResync, "serve's watch relists after the kubelet is back", func() error {
			n, err := h.metric("podres_proxy_pods_api_relists_total")
			if err == nil && n <= relists {
				err = fmt.Errorf("podres_proxy_pods_api_relists_total is still %v", n)
			}
			return err
		})
		reconnects, err := h.metric("podres_proxy_pods_api_reconnects_total")
		if err != nil {
			t.Fatal(err)
		}
		// A 1.37 kubelet answers "Kubelet is initializing" until its pod
		// sources are ready; serve retries within 2 s meanwhile, and counts
		// each such answer (0 on 1.36, and when the kubelet was ready first).
		initializing, err := h.metric("podres_proxy_pods_api_initializing_total")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("serve's watch relisted %v after the kubelet was back (%v reconnects so far, %v answered \"Kubelet is initializing\")",
			time.Since(back).Round(time.Millisecond), reconnects, initializing)
	}

	// A pod created after the restart: its ADD sees its VF, again with no
	// /pods read once the watch is back.
	before = countReads(t)
	createAndAwait(t, vfPodAfterRestart)
	reads = countReads(t).since(before)
	t.Logf("a VF pod created after the kubelet restart: %s", reads)
	checkVFAdds(t, []testPod{vfPodAfterRestart})
	checkReadSources(t, reads, podsAPI)
	pods = append(pods, vfPodAfterRestart)
	if err := everyPodRight(pods); err != nil {
		t.Error(err)
	}
	t.Logf("since serve started: %s", countReads(t))
}

// createAndAwait creates the pods and waits until they run.
func createAndAwait(t *testing.T, pods ...testPod) {
	t.Helper()
	var names []string
	for _, p := range pods {
		if err := p.create(); err != nil {
			t.Fatal(err)
		}
		names = append(names, p.fullName())
	}
	if err := waitRunning(2*time.Minute, names...); err != nil {
		t.Fatalf("the pods did not start: %v", err)
	}
}

// readCounts are serve's counts of its reads of every pod, made for queries.
type readCounts struct {
	// shared are the reads from either source that queries shared
	// (podres_proxy_kubelet_pods_reads_total), failed those that failed.
	shared, failed float64
	// pods and podsAPI split the successful ones by the source that
	// answered (podres_proxy_pod_source_reads_total{source}).
	pods, podsAPI float64
}

func countReads(t *testing.T) readCounts {
	t.Helper()
	c, err := h.readCounts()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readCounts reads serve's counts from its metrics.
func (h *harness) readCounts() (readCounts, error) {
	var c readCounts
	for _, m := range []struct {
		prefix string
		dst    *float64
	}{
		{"podres_proxy_kubelet_pods_reads_total{", &c.shared},
		{`podres_proxy_kubelet_pods_reads_total{result="error"}`, &c.failed},
		{`podres_proxy_pod_source_reads_total{source="pods"}`, &c.pods},
		{`podres_proxy_pod_source_reads_total{source="pods-api"}`, &c.podsAPI},
	} {
		v, err := h.metric(m.prefix)
		if err != nil {
			return c, err
		}
		*m.dst = v
	}
	return c, nil
}

// readSummary is the run's last word on what serve read, one line that
// hack/test.sh prints for the runs with the kubelet's PodsAPI gate on and
// off, side by side.
func (h *harness) readSummary() string {
	gate := "off"
	if h.env["KUBELET_PODS_API"] == "1" {
		gate = "on"
	}
	source := "/pods"
	if h.podsAPI() {
		source = "the Pods API watch, /pods as the fallback"
	}
	c, err := h.readCounts()
	if err != nil {
		return fmt.Sprintf("e2e: pod source reads, PodsAPI gate %s (%s): %v", gate, source, err)
	}
	return fmt.Sprintf("e2e: pod source reads, PodsAPI gate %s (%s), by every serve of the suite: %s", gate, source, h.readsBefore.plus(c))
}

func (c readCounts) since(b readCounts) readCounts {
	return readCounts{c.shared - b.shared, c.failed - b.failed, c.pods - b.pods, c.podsAPI - b.podsAPI}
}

func (c readCounts) plus(b readCounts) readCounts {
	return readCounts{c.shared + b.shared, c.failed + b.failed, c.pods + b.pods, c.podsAPI + b.podsAPI}
}

func (c readCounts) String() string {
	return fmt.Sprintf("%v shared reads of every pod (%v failed): %v from /pods, %v from the Pods API", c.shared, c.failed, c.pods, c.podsAPI)
}

// checkReadSources checks serve's reads while pods were created: none
// failed, and none of /pods while it watches the Pods API (an operator who
// turned the gate on sees no more /pods traffic). Without the Pods API a new
// pod needs a /pods read, which is the fresh answer the ADDs were checked
// for.
func checkReadSources(t *testing.T, reads readCounts, podsAPI bool) {
	t.Helper()
	if reads.failed != 0 {
		t.Errorf("%v reads of the kubelet's pods failed while the pods were created", reads.failed)
	}
	if podsAPI && reads.pods != 0 {
		t.Errorf("serve read the kubelet's /pods %v times while it watched the Pods API", reads.pods)
	}
}

// checkVFAdds checks each pod's CNI ADD: it succeeded, ran before the
// sandbox existed, and saw the pod's own VF with its device-info file.
func checkVFAdds(t *testing.T, pods []testPod) {
	t.Helper()
	recs, err := probeRecords()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		vf := p.want["app"][rdmaResource]
		var last *probeRecord
		for i, r := range recs {
			if r.Command != "ADD" || r.Namespace != podNamespace || r.Name != p.fullName() {
				continue
			}
			if r.Error != "" {
				t.Errorf("CNI ADD of %s failed at %s (the kubelet retried): %s", p.fullName(), r.Time.Format(time.RFC3339Nano), r.Error)
			}
			last = &recs[i]
		}
		if last == nil {
			t.Errorf("the CNI probe recorded no ADD for %s", p.fullName())
			continue
		}
		t.Logf("ADD %s: devices %v, List took %d ms", p.fullName(), last.DeviceIDs, last.ListMillis)
		if last.SandboxListed {
			t.Errorf("during ADD of %s the runtime already listed the sandbox (%s); the probe must run before it exists", p.fullName(), last.SandboxState)
		}
		if !slices.Equal(last.DeviceIDs, vf) {
			t.Errorf("during ADD of %s the probe got %s devices %v, want its VF %v", p.fullName(), rdmaResource, last.DeviceIDs, vf)
			continue
		}
		if !strings.Contains(h.serveHelp, "-device-info-dir") {
			continue
		}
		var info struct {
			Type string `json:"type"`
			PCI  struct {
				PCIAddress string `json:"pci-address"`
			} `json:"pci"`
		}
		if err := json.Unmarshal(last.DeviceInfo, &info); err != nil || info.Type != "pci" || info.PCI.PCIAddress != vf[0] {
			t.Errorf("during ADD of %s the VF's device-info was %s (%v %s), want type pci with pci-address %s", p.fullName(), last.DeviceInfo, err, last.DeviceInfoError, vf[0])
		}
	}
}

// everyPodRight says which of pods the proxy's List lacks or answers with
// other devices than the pod's own.
func everyPodRight(pods []testPod) error {
	resp, err := list(h.proxySocket, multus)
	if err != nil {
		return err
	}
	if wrong := wrongDevices(resp, pods); wrong != "" {
		return fmt.Errorf("wrong answer: %s", wrong)
	}
	for _, p := range pods {
		if findPod(resp, podNamespace, p.fullName()) == nil {
			return fmt.Errorf("the proxy's List has no %s", p.fullName())
		}
	}
	return nil
}

// wrongDevices says which of pods a List answer gives other devices than
// its own (the kubelet's own devResource device aside); a pod may be absent.
func wrongDevices(resp *podresourcesv1.ListPodResourcesResponse, pods []testPod) string {
	var wrong []string
	for _, p := range pods {
		pr := findPod(resp, podNamespace, p.fullName())
		if pr == nil {
			continue
		}
		got := devicesOf(pr)
		for c := range got {
			delete(got[c], devResource)
			if len(got[c]) == 0 {
				delete(got, c)
			}
		}
		if !got.equal(p.want) {
			wrong = append(wrong, fmt.Sprintf("%s: %v, want %v", p.fullName(), got, p.want))
		}
	}
	return strings.Join(wrong, "; ")
}
