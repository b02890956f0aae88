package devicecr

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/apitest"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

// deviceObjectJSON is a Device object as koordlet writes it (trimmed), with
// the bus address of the first GPU in NVML's spelling and a VF minor of -1.
const deviceObjectJSON = `{
  "apiVersion": "scheduling.koordinator.sh/v1alpha1",
  "kind": "Device",
  "metadata": {"name": "node-1", "labels": {"node.koordinator.sh/gpu-vendor": "nvidia", "node.koordinator.sh/gpu-model": "A100-SXM4-80GB"},
               "resourceVersion": "42", "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "u"}]},
  "spec": {"devices": [
    {"type": "gpu", "id": "GPU-5f1d6b3c-8a2e-4f0b-9c1d-2e3f4a5b6c7d", "minor": 2, "health": true,
     "resources": {"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory": "81920Mi", "koordinator.sh/gpu-memory-ratio": "100"},
     "topology": {"busID": "00000000:3B:00.0", "nodeID": 0, "pcieID": "pci0000:3a", "socketID": -1},
     "conditions": [{"type": "Healthy", "status": "True", "reason": "", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    {"type": "gpu", "id": "GPU-a0b1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c4d", "minor": 0, "health": false,
     "resources": {"koordinator.sh/gpu-core": "100"}},
    {"type": "rdma", "id": "0000:d8:00.0", "minor": 0, "health": true, "resources": {"koordinator.sh/rdma": "100"},
     "topology": {"busID": "0000:d8:00.0", "nodeID": 1, "pcieID": "pci0000:d7", "socketID": -1},
     "vfGroups": [{"vfs": [{"minor": -1, "busID": "0000:d8:00.2"}, {"minor": -1, "busID": "0000:d8:00.3"}]}]},
    {"type": "fpga", "minor": 0, "health": true}
  ]},
  "status": {"allocations": [{"type": "gpu", "entries": [{"name": "p", "namespace": "ns", "uuid": "x", "minors": [2]}]}]}
}`

const devicesPath = "/apis/scheduling.koordinator.sh/v1alpha1/devices"

// newAPIServer is an API server serving Koordinator's Device objects, with
// node-1's.
func newAPIServer(t *testing.T) *apitest.Server {
	api := apitest.New(t, map[string]string{devicesPath: "DeviceList"})
	api.Put(devicesPath, deviceObjectJSON)
	return api
}

// source returns a running source of node-1's Device object.
func source(t *testing.T, api *apitest.Server) *Source {
	t.Helper()
	cfg, err := apiclient.Config(apiclient.Options{Server: api.URL, TokenFile: api.TokenFile, CAFile: api.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	src, err := New(Options{Config: cfg, NodeName: "node-1", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = src.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return src
}

// waitFor loads src at each change until ok says its answer is the one
// awaited, failing after 10 s.
func waitFor(t *testing.T, src *Source, ok func([]inventory.Device, error) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		changed := src.Changed()
		if ok(src.Load(context.Background())) {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			d, err := src.Load(context.Background())
			t.Fatalf("no awaited answer within 10 s; the last: %q, %v", inventorytest.DescribeAll(d), err)
		}
	}
}

func TestDeviceCRReadsTheNodesDeviceWithTheServiceAccountTokenOverVerifiedTLS(t *testing.T) {
	api := newAPIServer(t)
	devices := inventorytest.Load(t, source(t, api))

	// The server answers 401 to any other token: the list was made with it.
	if n := api.Count("list", devicesPath); n != 1 {
		t.Errorf("%d lists of the Device objects, want 1", n)
	}
	// The FPGA has neither id nor address: nothing can refer to it.
	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(devices), []string{
		"gpu id=" + inventorytest.GPU0 + " vendor=nvidia minor=2 index=? bus=0000:3b:00.0 numa=0 healthy=true vfs=[] source=",
		"gpu id=" + inventorytest.GPU1 + " vendor=nvidia minor=0 index=? bus= numa=? healthy=false vfs=[] source=",
		"rdma id=0000:d8:00.0 vendor= minor=0 index=? bus=0000:d8:00.0 numa=1 healthy=true vfs=[0000:d8:00.2@? 0000:d8:00.3@?] source=",
	})
}

func TestDeviceCRSeesAChangedDeviceObjectWithoutAskingAgain(t *testing.T) {
	api := newAPIServer(t)
	src := source(t, api)
	inventorytest.Load(t, src)

	api.Put(devicesPath, strings.Replace(deviceObjectJSON, `"nodeID": 0`, `"nodeID": 1`, 1))
	waitFor(t, src, func(d []inventory.Device, err error) bool {
		return err == nil && len(d) == 3 && d[0].NUMANode != nil && *d[0].NUMANode == 1
	})
	if lists, gets := api.Count("list", devicesPath), api.Count("get", devicesPath+"/node-1"); lists != 1 || gets != 0 {
		t.Errorf("%d lists and %d gets: the change did not come by the watch", lists, gets)
	}
}

func TestDeviceCRIgnoresOtherNodesDeviceObjects(t *testing.T) {
	api := newAPIServer(t)
	api.Put(devicesPath, strings.Replace(deviceObjectJSON, `"name": "node-1"`, `"name": "node-2"`, 1))
	devices := inventorytest.Load(t, source(t, api))
	if len(devices) != 3 {
		t.Errorf("%d devices, want node-1's 3", len(devices))
	}
}

func TestDeviceCRRefusesAServerTheCADoesNotVouchFor(t *testing.T) {
	api := newAPIServer(t)
	cfg, err := apiclient.Config(apiclient.Options{Server: api.URL, TokenFile: api.TokenFile, CAFile: tlstest.OtherCA(t, filepath.Join(t.TempDir(), "other-ca.crt"))})
	if err != nil {
		t.Fatal(err)
	}
	src, err := New(Options{Config: cfg, NodeName: "node-1", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = src.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	_, err = src.Load(context.Background())
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Load() error = %v, want a certificate error", err)
	}
	if reqs := api.Requests(); len(reqs) != 0 {
		t.Errorf("requests reached an unverified server: %v", reqs)
	}
}

func TestDeviceCRDeletedMeansNoDevicesAndAnInfoLine(t *testing.T) {
	api := newAPIServer(t)
	src := source(t, api)
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{src}, Logger: log})
	inv.Refresh(context.Background())
	if n := len(inv.Snapshot().Devices()); n != 3 {
		t.Fatalf("%d devices, want 3", n)
	}
	changed := inv.Changed()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = inv.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	api.Delete(devicesPath, "node-1")
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("the inventory did not change within 10 s of the deletion")
	}
	if n := len(inv.Snapshot().Devices()); n != 0 {
		t.Errorf("%d devices after the Device object was deleted, want 0", n)
	}
	if errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel); len(errs) != 0 {
		t.Errorf("a missing Device object was logged as an error: %q", errs)
	}
	infos := strings.Join(inventorytest.EntriesAt(hook, logrus.InfoLevel), "\n")
	if !strings.Contains(infos, "node-1") || !strings.Contains(infos, "not found") {
		t.Errorf("info lines %q do not say the node's Device was not found", infos)
	}
}

func TestDeviceCRWithoutKoordinatorAnswersNoDevicesAtOnce(t *testing.T) {
	api := apitest.New(t, map[string]string{}) // no Device resource
	src := source(t, api)
	start := time.Now()
	_, err := src.Load(context.Background())
	if !errors.Is(err, inventory.ErrAbsent) || !strings.Contains(err.Error(), "not installed") {
		t.Errorf("Load() error = %v, want absent: Koordinator is not installed", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Load waited %s for a resource the API server does not serve", d)
	}
}

func TestDeviceCRForbiddenLogsTheMissingRBACRuleAndTheOtherSourcesKeepServing(t *testing.T) {
	api := newAPIServer(t)
	api.Refuse(http.StatusForbidden)
	file := inventorytest.NewFakeSource(inventory.SourceFile, 0)
	file.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1", NUMANode: new(int64(0)), Healthy: true}}}
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{source(t, api), file}, Logger: log})
	inv.Refresh(context.Background())

	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(inv.Snapshot().Devices()), []string{
		"gpu id=GPU-1 vendor= minor=? index=? bus= numa=0 healthy=true vfs=[] source=file",
	})
	errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel)
	if len(errs) != 1 {
		t.Fatalf("errors logged = %q, want one", errs)
	}
	for _, want := range []string{"403", "list and watch devices.scheduling.koordinator.sh", `verbs: ["list", "watch"]`, "refused by the test", "other sources"} {
		if !strings.Contains(errs[0], want) {
			t.Errorf("error line %q does not contain %q", errs[0], want)
		}
	}
}

func TestDeviceCRFailuresKeepTheLastGoodAnswer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(api *apitest.Server)
		error string
	}{
		{"RBAC removed", func(api *apitest.Server) { api.Refuse(http.StatusForbidden); api.DropWatches() }, "403 Forbidden"},
		{"token rejected", func(api *apitest.Server) { api.Refuse(http.StatusUnauthorized); api.DropWatches() }, "401 Unauthorized"},
		{"server error", func(api *apitest.Server) { api.Refuse(http.StatusInternalServerError); api.DropWatches() }, "refused by the test"},
		{"garbage", func(api *apitest.Server) {
			api.Put(devicesPath, `{"apiVersion":"scheduling.koordinator.sh/v1alpha1","kind":"Device","metadata":{"name":"node-1"},"spec":{"devices":"many"}}`)
		}, "decoding Device node-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newAPIServer(t)
			src := source(t, api)
			log, hook := inventorytest.QuietLogger()
			inv := inventory.New(inventory.Options{Sources: []inventory.Source{src}, Logger: log})
			inv.Refresh(context.Background())
			good := inv.Snapshot()

			tc.fail(api)
			waitFor(t, src, func(_ []inventory.Device, err error) bool { return err != nil })
			inv.Refresh(context.Background())
			if inv.Snapshot() != good {
				t.Errorf("the inventory changed: %q", inventorytest.DescribeAll(inv.Snapshot().Devices()))
			}
			if errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel); len(errs) != 1 || !strings.Contains(errs[0], tc.error) {
				t.Errorf("errors logged = %q, want one containing %q", errs, tc.error)
			}
		})
	}
}

func TestNewDeviceCRSourceRejectsIncompleteOptions(t *testing.T) {
	cfg, err := apiclient.Config(apiclient.Options{Server: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string]Options{
		"no node name":  {Config: cfg},
		"no API server": {NodeName: "node-1"},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("%s: New(%+v) succeeded", name, opts)
		}
	}
}
