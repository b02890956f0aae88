package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The watch scenario's names: a driver of its own whose ResourceSlice the
// test writes itself (as a driver publishes one), the extended resource its
// DeviceClass names, and Koordinator's Device objects.
const (
	watchDriver   = "watch.podres-proxy.test"
	watchResource = "example.com/watch-gpu"
	watchClass    = "podres-proxy-test-watch-gpu"
	watchSlice    = "podres-proxy-test-watch"
	deviceCRD     = "devices.scheduling.koordinator.sh"
	// watchWithin is how soon after a write serve must show it: the
	// informers' watch brings it at once (the polls took up to 60 s).
	watchWithin = 2 * time.Second
	// steadyWindow is the window the API server's request counters are
	// read over: issue 42's 5 minutes, five times the 60 s the old polls
	// took between reads.
	steadyWindow = 5 * time.Minute
)

// deviceCRDManifest is the part of Koordinator's Device CRD the API server
// needs to serve the objects (cluster-scoped, schema left open).
const deviceCRDManifest = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: devices.scheduling.koordinator.sh
spec:
  group: scheduling.koordinator.sh
  scope: Cluster
  names: {plural: devices, singular: device, kind: Device, listKind: DeviceList}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// watchGPU is the Device object's GPU: its NUMA node is what the test
// moves.
const watchGPU = "GPU-7e57a7c4-0000-4000-8000-000000000042"

// TestAPIServerChangesAreSeenWithinSecondsAndNeverPolled is issue 42's
// check with the real API server: serve (deploy/base with the legacy
// view) keeps the node's ResourceSlices, the DeviceClasses and the node's
// Koordinator Device object by watches. A device added to a ResourceSlice of
// a driver on the node is listed by the legacy view's
// GetAllocatableResources, and a GPU's NUMA node moved in the Device object
// is in `inspect --inventory`, each within 2 s of the write (the polls took
// up to 60 s). Then, over 5 minutes of a steady node (five times the old
// poll interval), the API server's own request counters (apiserver_request_total,
// which has no user agent: no other client lists or gets these resources
// meanwhile, the control plane's informers only watch) count no LIST and no
// GET of resourceslices, deviceclasses or devices: the polls made 3 a
// minute.
func TestAPIServerChangesAreSeenWithinSecondsAndNeverPolled(t *testing.T) {
	requireCluster(t)
	ctx := context.Background()
	node := h.env["NODE_NAME"]

	// Koordinator's CRD and the node's Device object, before serve starts:
	// its watch then lists the object at once.
	crd := filepath.Join(t.TempDir(), "device-crd.yaml")
	writeFile(t, crd, deviceCRDManifest)
	if _, err := kubectl("apply", "-f", crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := kubectl("delete", "crd", deviceCRD, "--wait", "--timeout=60s"); err != nil {
			t.Errorf("delete the Device CRD: %v", err)
		}
	})
	if _, err := kubectl("wait", "--for=condition=Established", "crd/"+deviceCRD, "--timeout=60s"); err != nil {
		t.Fatal(err)
	}
	deviceObject := func(numa int) string {
		return fmt.Sprintf(`{"apiVersion":"scheduling.koordinator.sh/v1alpha1","kind":"Device","metadata":{"name":%q,"labels":{"node.koordinator.sh/gpu-vendor":"nvidia"}},`+
			`"spec":{"devices":[{"type":"gpu","id":%q,"minor":0,"health":true,"topology":{"busID":"0000:af:00.0","nodeID":%d}}]}}`, node, watchGPU, numa)
	}
	obj := filepath.Join(t.TempDir(), "device.json")
	writeFile(t, obj, deviceObject(0))
	if _, err := kubectl("apply", "-f", obj); err != nil {
		t.Fatal(err)
	}

	// A driver's class and its slice on the node, with one device.
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: watchClass},
		Spec: resourcev1.DeviceClassSpec{
			ExtendedResourceName: ptr.To(watchResource),
			Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", watchDriver)}}},
		},
	}
	if _, err := h.client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass %s: %v", watchClass, err)
	}
	t.Cleanup(func() {
		if err := h.client.ResourceV1().DeviceClasses().Delete(context.Background(), watchClass, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete DeviceClass %s: %v", watchClass, err)
		}
	})
	watchDevice := func(i int) resourcev1.Device {
		return resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			pciBusAttribute: {StringValue: ptr.To(fmt.Sprintf("0000:5e:%02x.0", i))},
			"numaNode":      {IntValue: ptr.To(int64(i % 2))},
		}}
	}
	slice := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: watchSlice},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   watchDriver,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
			Devices:  []resourcev1.Device{watchDevice(0)},
		},
	}
	slice, err := h.client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create ResourceSlice %s: %v", watchSlice, err)
	}
	t.Cleanup(func() {
		if err := h.client.ResourceV1().ResourceSlices().Delete(context.Background(), watchSlice, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete ResourceSlice %s: %v", watchSlice, err)
		}
	})

	// serve with the legacy view, as the DRA scenario installs it.
	installed := apiRequests(t)
	if _, err := kubectl("apply", "-k", draOverlay); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		retireDaemon()
		if _, err := kubectl("delete", "-k", draOverlay, "--wait", "--timeout=180s"); err != nil {
			t.Errorf("uninstall podres-proxy: %v", err)
		}
	})
	if _, err := kubectl("-n", "podres-proxy", "rollout", "status", "daemonset/podres-proxy", "--timeout=180s"); err != nil {
		out, _ := kubectl("-n", "podres-proxy", "describe", "pods")
		t.Fatalf("%v\n%s", err, out)
	}
	useSource(t, "podres-proxy", viaPodsAPI)
	poll(t, time.Minute, "the slice's device allocatable through the legacy view", func() error {
		if got := allocatableNUMA(t, legacySocket, watchResource); len(got) != 1 {
			return fmt.Errorf("allocatable %s: %v", watchResource, got)
		}
		return nil
	})
	poll(t, time.Minute, "the Device object's GPU in the inventory", func() error {
		return inventoryNUMA(watchGPU, 0)
	})

	// A device the driver adds: allocatable on the legacy view within 2 s.
	slice.Spec.Devices = append(slice.Spec.Devices, watchDevice(1))
	if _, err := h.client.ResourceV1().ResourceSlices().Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("add a device to ResourceSlice %s: %v", watchSlice, err)
	}
	wrote := time.Now()
	seen := within(t, watchWithin, "the added device allocatable through the legacy view", func() error {
		got := allocatableNUMA(t, legacySocket, watchResource)
		if n, ok := got["0000:5e:01.0"]; !ok || n != 1 || len(got) != 2 {
			return fmt.Errorf("allocatable %s: %v", watchResource, got)
		}
		return nil
	})
	t.Logf("cluster: watch: a ResourceSlice's new device folded %s after the write (polled: up to 60 s)", seen.Sub(wrote).Round(time.Millisecond))

	// The GPU's NUMA node moves: in inspect's inventory within 2 s.
	writeFile(t, obj, deviceObject(1))
	if _, err := kubectl("apply", "-f", obj); err != nil {
		t.Fatal(err)
	}
	wrote = time.Now()
	seen = within(t, watchWithin, "the GPU's new NUMA node in inspect's inventory", func() error {
		return inventoryNUMA(watchGPU, 1)
	})
	t.Logf("cluster: watch: a Device object's NUMA change in the inventory %s after the write (polled: up to 60 s)", seen.Sub(wrote).Round(time.Millisecond))

	// A steady node: the API server's counters over the window.
	before := apiRequests(t)
	time.Sleep(steadyWindow) // the window itself is what is measured
	after := apiRequests(t)
	var polls []string
	for key, n := range after {
		if d := n - before[key]; d != 0 && key.verb != "open WATCH" {
			t.Logf("cluster: watch: %s: %v in %s", key, d, steadyWindow)
			if key.verb == "LIST" || key.verb == "GET" {
				polls = append(polls, fmt.Sprintf("%s %s: %v", key.verb, key.resource, d))
			}
		}
	}
	// The counters are the right ones: serve's watches are open among the
	// API server's long-running requests (apiserver_request_total counts a
	// watch when it ends, after 5 to 10 min).
	for _, res := range []string{"resourceslices", "deviceclasses", "devices"} {
		open := requestKey{"open WATCH", res}
		t.Logf("cluster: watch: %s since serve was installed: %v LIST, %v GET; open watches %v (%v before serve)",
			res, after[requestKey{"LIST", res}]-installed[requestKey{"LIST", res}], after[requestKey{"GET", res}]-installed[requestKey{"GET", res}], after[open], installed[open])
		if after[open] <= installed[open] {
			t.Errorf("the API server has no more watches of %s open than before serve was installed: not the API server serve speaks to?", res)
		}
	}
	if len(polls) > 0 {
		t.Errorf("the API server counted %v in %s of a steady node; serve's watches make none (the polls made 3 a minute)", polls, steadyWindow)
	} else {
		t.Logf("cluster: watch: 0 LIST or GET of resourceslices, deviceclasses, devices in %s of a steady node (polled: 3 a minute)", steadyWindow)
	}
}

// within polls fn every 50 ms until it succeeds, failing the test if that
// takes longer than limit from now; it returns when fn succeeded.
func within(t *testing.T, limit time.Duration, what string, fn func() error) time.Time {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := fn()
		if err == nil {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the daemon's answers, not the API server
	}
}

// inventoryNUMA checks that `podres-proxy inspect --inventory -o json` on
// the daemon's state directory has the GPU id on NUMA node numa.
func inventoryNUMA(id string, numa int64) error {
	cmd := exec.Command(filepath.Join(h.root, "images", "podres-proxy"), "inspect", "--inventory", "--state-dir", h.env["PROXY_STATE_DIR"], "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("podres-proxy inspect --inventory: %v: %s", err, stderr.String())
	}
	var inv struct {
		Devices []struct {
			ID       string `json:"id"`
			NUMANode *int64 `json:"numaNode"`
			Source   string `json:"source"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(out, &inv); err != nil {
		return fmt.Errorf("decode inspect --inventory -o json: %v", err)
	}
	for _, d := range inv.Devices {
		if d.ID == id {
			if d.NUMANode == nil || *d.NUMANode != numa || d.Source != "device-cr" {
				return fmt.Errorf("GPU %s: NUMA %v from %s, want %d from device-cr", id, d.NUMANode, d.Source, numa)
			}
			return nil
		}
	}
	return fmt.Errorf("GPU %s is not in the inventory", id)
}

// requestKey is one apiserver_request_total series, summed over codes.
type requestKey struct{ verb, resource string }

// apiRequests reads the kube-apiserver's apiserver_request_total for the
// resources serve watches, by verb, and its watches of them open now
// (apiserver_longrunning_requests, as verb "open WATCH").
func apiRequests(t *testing.T) map[requestKey]float64 {
	t.Helper()
	out, err := kubectlOut("get", "--raw", "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(out))
	if err != nil {
		t.Fatalf("parse the API server's metrics: %v", err)
	}
	counts := map[requestKey]float64{}
	for _, name := range []string{"apiserver_request_total", "apiserver_longrunning_requests"} {
		fam := families[name]
		if fam == nil {
			t.Fatalf("the API server exports no %s", name)
		}
		for _, m := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch labels["group"] + "/" + labels["resource"] {
			case "resource.k8s.io/resourceslices", "resource.k8s.io/deviceclasses", "scheduling.koordinator.sh/devices":
			default:
				continue
			}
			if labels["subresource"] != "" {
				continue
			}
			if name == "apiserver_longrunning_requests" {
				if labels["verb"] == "WATCH" {
					counts[requestKey{"open WATCH", labels["resource"]}] += value(m)
				}
				continue
			}
			counts[requestKey{labels["verb"], labels["resource"]}] += value(m)
		}
	}
	return counts
}

func value(m *dto.Metric) float64 { return m.GetCounter().GetValue() + m.GetGauge().GetValue() }

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
