package devicecr

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
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

// fakeAPIServer is an API server over TLS that serves one Device object,
// records the tokens it is sent, and answers what the test sets.
type fakeAPIServer struct {
	*httptest.Server
	caFile, tokenFile string

	mu     sync.Mutex
	status int
	body   string
	tokens []string
	paths  []string
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	f := &fakeAPIServer{status: http.StatusOK, body: deviceObjectJSON}
	f.Server = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	dir := t.TempDir()
	f.caFile = filepath.Join(dir, "ca.crt")
	f.tokenFile = filepath.Join(dir, "token")
	tlstest.ServerCA(t, f.caFile, f.Server)
	inventorytest.WriteFile(t, f.tokenFile, "token-1\n")
	return f
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = append(f.tokens, r.Header.Get("Authorization"))
	f.paths = append(f.paths, r.URL.Path)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(f.status)
	_, _ = w.Write([]byte(f.body))
}

func (f *fakeAPIServer) answer(status int, body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status, f.body = status, body
}

func (f *fakeAPIServer) requests() (tokens, paths []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tokens...), append([]string(nil), f.paths...)
}

func (f *fakeAPIServer) source(t *testing.T) *Source {
	t.Helper()
	src, err := New(Options{APIServer: f.URL, TokenFile: f.tokenFile, CAFile: f.caFile, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// statusJSON is an API server error answer.
func statusJSON(code int, reason, message string) string {
	return `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"` + reason + `","message":"` + message + `","code":` + strconv.Itoa(code) + `}`
}

func TestDeviceCRReadsTheNodesDeviceWithTheServiceAccountTokenOverVerifiedTLS(t *testing.T) {
	api := newFakeAPIServer(t)
	devices := inventorytest.Load(t, api.source(t))

	tokens, paths := api.requests()
	if len(tokens) != 1 || tokens[0] != "Bearer token-1" {
		t.Errorf("Authorization headers = %q, want [Bearer token-1]", tokens)
	}
	if len(paths) != 1 || paths[0] != "/apis/scheduling.koordinator.sh/v1alpha1/devices/node-1" {
		t.Errorf("paths = %q, want the cluster-scoped Device named after the node", paths)
	}
	// The FPGA has neither id nor address: nothing can refer to it.
	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(devices), []string{
		"gpu id=" + inventorytest.GPU0 + " vendor=nvidia minor=2 index=? bus=0000:3b:00.0 numa=0 healthy=true vfs=[] source=",
		"gpu id=" + inventorytest.GPU1 + " vendor=nvidia minor=0 index=? bus= numa=? healthy=false vfs=[] source=",
		"rdma id=0000:d8:00.0 vendor= minor=0 index=? bus=0000:d8:00.0 numa=1 healthy=true vfs=[0000:d8:00.2@? 0000:d8:00.3@?] source=",
	})
}

func TestDeviceCRSendsTheRotatedToken(t *testing.T) {
	api := newFakeAPIServer(t)
	src := api.source(t)
	inventorytest.Load(t, src)
	inventorytest.WriteFile(t, api.tokenFile, "token-2")
	inventorytest.Load(t, src)
	if tokens, _ := api.requests(); len(tokens) != 2 || tokens[1] != "Bearer token-2" {
		t.Errorf("Authorization headers = %q, want the rotated token second", tokens)
	}
}

func TestDeviceCRRefusesAServerTheCADoesNotVouchFor(t *testing.T) {
	api := newFakeAPIServer(t)
	src, err := New(Options{APIServer: api.URL, TokenFile: api.tokenFile, CAFile: tlstest.OtherCA(t, filepath.Join(t.TempDir(), "other-ca.crt")), NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = src.Load(context.Background())
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("Load() error = %v, want a certificate error", err)
	}
	if tokens, _ := api.requests(); len(tokens) != 0 {
		t.Errorf("the token was sent to an unverified server: %q", tokens)
	}
}

func TestDeviceCRNotFoundMeansNoDevicesAndAnInfoLine(t *testing.T) {
	api := newFakeAPIServer(t)
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{api.source(t)}, Logger: log})
	inv.Refresh(context.Background())
	if n := len(inv.Snapshot().Devices()); n != 3 {
		t.Fatalf("%d devices, want 3", n)
	}

	api.answer(http.StatusNotFound, statusJSON(404, "NotFound", `devices.scheduling.koordinator.sh \"node-1\" not found`))
	inv.Refresh(context.Background())
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

func TestDeviceCRForbiddenLogsTheMissingRBACRuleAndTheOtherSourcesKeepServing(t *testing.T) {
	api := newFakeAPIServer(t)
	api.answer(http.StatusForbidden, statusJSON(403, "Forbidden",
		`devices.scheduling.koordinator.sh \"node-1\" is forbidden: User \"system:serviceaccount:kube-system:podres-proxy\" cannot get resource \"devices\"`))
	file := inventorytest.NewFakeSource(inventory.SourceFile, 0)
	file.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1", NUMANode: new(int64(0)), Healthy: true}}}
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{api.source(t), file}, Logger: log})
	inv.Refresh(context.Background())

	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(inv.Snapshot().Devices()), []string{
		"gpu id=GPU-1 vendor= minor=? index=? bus= numa=0 healthy=true vfs=[] source=file",
	})
	errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel)
	if len(errs) != 1 {
		t.Fatalf("errors logged = %q, want one", errs)
	}
	for _, want := range []string{"403", "get devices.scheduling.koordinator.sh", `verbs: ["get"]`, "cannot get resource", "other sources"} {
		if !strings.Contains(errs[0], want) {
			t.Errorf("error line %q does not contain %q", errs[0], want)
		}
	}
}

func TestDeviceCRFailuresKeepTheLastGoodAnswer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(api *fakeAPIServer)
		error string
	}{
		{"server down", func(api *fakeAPIServer) { api.Close() }, "getting Device node-1"},
		{"RBAC removed", func(api *fakeAPIServer) { api.answer(http.StatusForbidden, "") }, "403 Forbidden"},
		{"token rejected", func(api *fakeAPIServer) { api.answer(http.StatusUnauthorized, "") }, "401 Unauthorized"},
		{"server error", func(api *fakeAPIServer) { api.answer(http.StatusInternalServerError, "") }, "500"},
		{"garbage", func(api *fakeAPIServer) { api.answer(http.StatusOK, "<html>") }, "decoding Device node-1"},
		{"another node's object", func(api *fakeAPIServer) {
			api.answer(http.StatusOK, strings.Replace(deviceObjectJSON, `"name": "node-1"`, `"name": "node-2"`, 1))
		}, `not "node-1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newFakeAPIServer(t)
			log, hook := inventorytest.QuietLogger()
			inv := inventory.New(inventory.Options{Sources: []inventory.Source{api.source(t)}, Logger: log})
			inv.Refresh(context.Background())
			good := inv.Snapshot()

			tc.fail(api)
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

func TestNewDeviceCRSourceFindsTheAPIServerInThePodsEnvironment(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	src, err := New(Options{NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "https://[fd00::1]:443/apis/scheduling.koordinator.sh/v1alpha1/devices/node-1"; src.url != want {
		t.Errorf("url = %s, want %s", src.url, want)
	}
	if src.opts.TokenFile != DefaultTokenFile || src.opts.CAFile != DefaultCAFile {
		t.Errorf("token %s, CA %s: want the service account's", src.opts.TokenFile, src.opts.CAFile)
	}
}

func TestNewDeviceCRSourceRejectsIncompleteOptions(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for name, opts := range map[string]Options{
		"no node name":   {APIServer: "https://10.0.0.1:443"},
		"not in a pod":   {NodeName: "node-1"},
		"not a URL":      {APIServer: "10.0.0.1:443", NodeName: "node-1"},
		"not https/http": {APIServer: "ftp://10.0.0.1", NodeName: "node-1"},
	} {
		if _, err := New(opts); err == nil {
			t.Errorf("%s: New(%+v) succeeded", name, opts)
		}
	}
}
