package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/tabletest"
	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

const gpuUUID = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"

// runCmd runs podres-proxy with args and returns its exit status and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// freePort returns a loopback address nothing listens on.
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// served is a `podres-proxy serve` started by startServe.
type served struct {
	socket, stateDir, metrics string
	logs                      *syncWriter // warnings and errors serve logged
}

// startServe runs `podres-proxy serve` in-process against a fake kubelet
// and waits for /readyz.
func startServe(t *testing.T, k *fakekubelet.Kubelet, dir string, extra ...string) served {
	t.Helper()
	socket := filepath.Join(dir, "proxy", "kubelet.sock")
	stateDir := filepath.Join(dir, "state")
	metrics := freePort(t)
	args := append([]string{
		"--socket", socket,
		"--kubelet-socket", k.Socket,
		"--kubelet-pods-url", k.PodsURL,
		"--kubelet-token-file", k.TokenFile,
		"--kubelet-ca-file", k.CAFile,
		"--kubelet-pods-api-socket", "",
		"--kubelet-pod-logs-dir", k.PodLogsDir,
		"--state-dir", stateDir,
		"--device-info-dir", filepath.Join(dir, "devinfo"),
		"--nri-socket", "",
		"--cri-socket", "",
		"--metrics-addr", metrics,
		"--log-level", "warn",
	}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	logs := &syncWriter{}
	go func() { done <- run(ctx, append([]string{"serve"}, args...), io.Discard, logs) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("serve exited %d after a clean stop", code)
		}
		if _, err := os.Lstat(socket); !os.IsNotExist(err) {
			t.Errorf("the socket is still there after a clean stop: %v", err)
		}
	})
	poll.Until(t, "serve to be ready", func() bool {
		select {
		case code := <-done:
			t.Fatalf("serve exited %d at start: %s", code, logs.String())
		default:
		}
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return served{socket: socket, stateDir: stateDir, metrics: metrics, logs: logs}
}

func TestServeAnswersQueryAndInspect(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := fakekubelet.Start(t, dir)
	k.SetPods(fakekubelet.NewPod("ml", "trainer", "uid-1",
		fakekubelet.WithSchedulerName("koord-scheduler"),
		fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
			`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+gpuUUID+`"}]}`),
		fakekubelet.WithSidecar("logs", nil),
		fakekubelet.WithContainer("train", map[string]string{"nvidia.com/gpu": "1"})))
	srv := startServe(t, k, dir)
	socket, stateDir, metrics := srv.socket, srv.stateDir, srv.metrics

	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"query", "list", "--socket", socket}, &out, &errOut); code != 0 {
		t.Fatalf("query list exited %d: %s", code, errOut.String())
	}
	if !tabletest.HasLine(out.String(), "ml", "trainer", "train", "nvidia.com/gpu", gpuUUID) {
		t.Errorf("query list does not show the GPU on the train container:\n%s", out.String())
	}
	if tabletest.HasLine(out.String(), "logs", "nvidia.com/gpu") {
		t.Errorf("query list shows the GPU on the sidecar:\n%s", out.String())
	}

	out.Reset()
	if code := run(context.Background(), []string{"query", "get", "ml/trainer", "--socket", socket, "-o", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("query get exited %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), gpuUUID) {
		t.Errorf("query get -o json misses the GPU:\n%s", out.String())
	}

	// The kubelet's own socket answers without the GPU: that is the point.
	out.Reset()
	if code := run(context.Background(), []string{"query", "--socket", k.Socket, "list"}, &out, &errOut); code != 0 {
		t.Fatalf("query of the kubelet exited %d: %s", code, errOut.String())
	}
	if strings.Contains(out.String(), gpuUUID) {
		t.Errorf("the kubelet's own answer has the GPU?\n%s", out.String())
	}

	// The read that answered the query recorded the pod; inspect shows it
	// once it is durable, while serve runs.
	var records []map[string]any
	poll.Until(t, "the pod's record to be on disk", func() bool {
		out.Reset()
		if run(context.Background(), []string{"inspect", "--state-dir", stateDir, "-o", "json"}, &out, io.Discard) != 0 {
			return false
		}
		records = nil
		return json.Unmarshal(out.Bytes(), &records) == nil && len(records) == 1
	})
	if records[0]["uid"] != "uid-1" || records[0]["namespace"] != "ml" || !strings.Contains(out.String(), gpuUUID) {
		t.Errorf("inspect -o json = %s", out.String())
	}

	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{
		`podres_proxy_pod_resources_endpoint_requests_list{server_api_version="v1"} 1`,
		`podres_proxy_pod_resources_endpoint_requests_get{server_api_version="v1"} 1`,
		`podres_proxy_kubelet_pods_reads_total{result="ok"}`,
		`podres_proxy_state_records 1`,
	} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	// Without the Pods API every read is /pods's, and the per-source count
	// says so as it does on a node with the watch configured.
	reads, bySource := metricValue(string(body), `podres_proxy_kubelet_pods_reads_total{result="ok"}`),
		metricValue(string(body), `podres_proxy_pod_source_reads_total{source="pods"}`)
	if reads < 1 || bySource != reads {
		t.Errorf("pod_source_reads_total{source=\"pods\"} = %v, want the %v reads of /pods made for queries", bySource, reads)
	}
}

// metricValue returns the value of the sample named series (its name and
// labels as /metrics writes them) in a Prometheus text body, -1 without it.
func metricValue(body, series string) float64 {
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// A second serve on the same state directory and socket (the surge pod of
// a rolling update, or a mistake by hand) serves at once, on the metrics
// port it shares, and through a probe socket of its own that says it is
// ready; it writes nothing in the state directory until the first lets go,
// then becomes its writer, and the first leaves the socket to it.
func TestASecondServeWaitsToBecomeTheWriterAndServesMeanwhile(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := fakekubelet.Start(t, dir)
	socket := filepath.Join(dir, "proxy", "kubelet.sock")
	stateDir := filepath.Join(dir, "state")
	metrics := freePort(t)
	start := func(name string) (stop func() int, probe string, logs *syncWriter) {
		probe = filepath.Join(dir, name, "probe.sock")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		logs = &syncWriter{}
		go func() {
			done <- run(ctx, []string{"serve", "--socket", socket, "--kubelet-socket", k.Socket,
				"--kubelet-pods-url", k.PodsURL, "--kubelet-token-file", k.TokenFile, "--kubelet-ca-file", k.CAFile,
				"--kubelet-pods-api-socket", "", "--kubelet-pod-logs-dir", k.PodLogsDir, "--state-dir", stateDir,
				"--device-info-dir", filepath.Join(dir, "devinfo"), "--nri-socket", "", "--cri-socket", "",
				"--metrics-addr", metrics, "--probe-socket", probe, "--sysfs-root", "", "--log-level", "info"}, io.Discard, logs)
		}()
		t.Cleanup(cancel)
		poll.Until(t, name+" to be ready on its probe socket", func() bool {
			select {
			case code := <-done:
				t.Fatalf("%s exited %d at start: %s", name, code, logs.String())
			default:
			}
			code, _, _ := runCmd(t, "probe", "--socket", probe, "readyz")
			return code == 0
		})
		return func() int { cancel(); return <-done }, probe, logs
	}
	stopFirst, _, _ := start("first")
	if code, _, errOut := runCmd(t, "query", "list", "--socket", socket); code != 0 {
		t.Fatalf("query list through the first serve: exit %d: %s", code, errOut)
	}
	if err := os.Remove(filepath.Join(stateDir, "inventory.json")); err != nil {
		t.Fatalf("the first serve published no inventory: %v", err)
	}

	stopSecond, probe, logs := start("second")
	if code, _, errOut := runCmd(t, "query", "list", "--socket", socket); code != 0 {
		t.Fatalf("query list once the second serve took the socket: exit %d: %s", code, errOut)
	}
	if !strings.Contains(logs.String(), "waiting to become the writer") {
		t.Errorf("the second serve did not say it waits to become the writer:\n%s", logs.String())
	}
	if _, err := os.Stat(filepath.Join(stateDir, "inventory.json")); !os.IsNotExist(err) {
		t.Errorf("the second serve wrote in the state directory before it became its writer (inventory.json: %v)", err)
	}

	if code := stopFirst(); code != 0 {
		t.Fatalf("the first serve exited %d", code)
	}
	poll.Until(t, "the second serve to become the writer", func() bool {
		return strings.Contains(logs.String(), "became the writer")
	})
	poll.Until(t, "the second serve to publish the inventory", func() bool {
		_, err := os.Stat(filepath.Join(stateDir, "inventory.json"))
		return err == nil
	})
	if code, _, errOut := runCmd(t, "query", "list", "--socket", socket); code != 0 {
		t.Fatalf("query list after the first serve stopped: exit %d: %s (the first serve removed the socket it no longer owned?)", code, errOut)
	}
	if code, _, errOut := runCmd(t, "probe", "--socket", probe, "readyz"); code != 0 {
		t.Errorf("the second serve's readiness after the first stopped: exit %d: %s", code, errOut)
	}
	if code := stopSecond(); code != 0 {
		t.Fatalf("the second serve exited %d", code)
	}
	if _, err := os.Lstat(socket); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after both stopped: %v", err)
	}
}

func TestServeFlagMistakesAreUsageErrors(t *testing.T) {
	t.Setenv("NODE_IP", "")
	for _, args := range [][]string{
		{"serve", "--no-such-flag"},
		{"serve", "--state-dir", "/x", "extra"},
		{"serve", "--rate-limit-qps", "-1", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"},
		{"serve", "--max-devices-per-pod", "0", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"},
		{"serve", "--koordinator-scheduler-names", " , ", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"},
		{"serve", "--tensorfusion-scheduler-names", "", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"},
		{"serve"}, // neither --kubelet-pods-url nor NODE_IP
		{"serve", "--view", "legacy=/run/legacy.sock", "--node-name", "", "--api-server", "https://127.0.0.1:6443", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"},
		{"serve", "--view", "legacy=/run/legacy.sock", "--node-name", "n", "--api-server", "https://127.0.0.1:6443", "--dra-resources", "gpu.example.com", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"},
		{"serve", "--view", "legacy=/run/same.sock", "--socket", "/run/same.sock", "--node-name", "n", "--api-server", "https://127.0.0.1:6443", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"},
	} {
		var errOut bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &errOut); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errOut.String())
		}
	}
}

// A --view that names no view, shares a socket or takes the kubelet's is a
// usage error that says which.
func TestServeViewMistakesAreUsageErrors(t *testing.T) {
	t.Setenv("NODE_IP", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--view", "nfd=/run/p/nfd/kubelet.sock"}, `unknown view "nfd"`},
		{[]string{"--view", "dcgm"}, "want NAME=PATH"},
		{[]string{"--view", "dcgm=/run/p/dcgm/kubelet.sock", "--view", "plain=/run/p/dcgm/kubelet.sock"}, "already served by --view dcgm"},
		{[]string{"--socket", "/run/p/a/kubelet.sock", "--view", "plain=/run/p/a/kubelet.sock"}, "already served by --socket"},
		{[]string{"--view", "kata=/var/lib/kubelet/pod-resources/kubelet.sock"}, "the kubelet's own socket"},
		{[]string{"--kubelet-socket", "unix:///k/kubelet.sock", "--view", "plain=/k/kubelet.sock"}, "the kubelet's own socket"},
	} {
		args := append([]string{"serve", "--kubelet-pods-url", "http://127.0.0.1:10255/pods"}, tc.args...)
		var errOut bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &errOut); code != 2 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%v: exit %d (%s), want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

// regexpLine reports whether some line contains all the words in order.

// syncWriter is a buffer the serve goroutine writes logs to while the test reads them.
type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// A cluster without the RBAC rule for Koordinator's Device object: the API
// server answers 403. serve logs which rule is missing and keeps serving
// the PodResources API, with the kubelet's answer and the annotations'
// devices, only without NUMA nodes from the Device object.
func TestServeKeepsServingWhenTheDeviceObjectIsForbidden(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var asked atomic.Int64
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403,`+
			`"message":"devices.scheduling.koordinator.sh \"node-1\" is forbidden: User \"system:serviceaccount:podres-proxy:podres-proxy\" cannot get resource \"devices\""}`)
	}))
	t.Cleanup(api.Close)
	caFile, tokenFile := filepath.Join(dir, "api-ca.crt"), filepath.Join(dir, "api-token")
	tlstest.ServerCA(t, caFile, api)
	if err := os.WriteFile(tokenFile, []byte("sa-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := fakekubelet.Start(t, dir)
	k.SetPods(fakekubelet.NewPod("ml", "trainer", "uid-1",
		fakekubelet.WithSchedulerName("koord-scheduler"),
		fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
			`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+gpuUUID+`"}]}`),
		fakekubelet.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100"})))

	srv := startServe(t, k, dir, "--device-cr", "--node-name", "node-1", "--api-server", api.URL,
		"--api-token-file", tokenFile, "--api-ca-file", caFile, "--sysfs-root", "")

	if asked.Load() == 0 {
		t.Fatal("serve never asked the API server for the Device object")
	}
	logged := srv.logs.String()
	for _, want := range []string{"403", "devices.scheduling.koordinator.sh"} {
		if !strings.Contains(logged, want) {
			t.Errorf("serve's log does not name %q:\n%s", want, logged)
		}
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"query", "get", "ml/trainer", "--socket", srv.socket}, &out, &errOut); code != 0 {
		t.Fatalf("query after the 403 exited %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), gpuUUID) {
		t.Errorf("serve answers without the pod's GPU after the 403:\n%s", out.String())
	}
}

// --max-devices-per-pod: a pod whose annotation names more devices is
// answered without them, and serve logs why, naming the pod; the other
// pods keep theirs.
func TestServeRefusesAPodOverTheDeviceLimit(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	const gpu2 = "GPU-2c1b5e0f-0000-4a4a-9b9b-123456789abc"
	k := fakekubelet.Start(t, dir)
	k.SetPods(
		fakekubelet.NewPod("ml", "greedy", "uid-1",
			fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
				`{"gpu":[{"minor":0,"id":"`+gpuUUID+`"},{"minor":1,"id":"`+gpu2+`"}]}`),
			fakekubelet.WithContainer("train", map[string]string{"nvidia.com/gpu": "2"})),
		fakekubelet.NewPod("ml", "modest", "uid-2",
			fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated", `{"gpu":[{"minor":0,"id":"`+gpuUUID+`"}]}`),
			fakekubelet.WithContainer("train", map[string]string{"nvidia.com/gpu": "1"})))
	srv := startServe(t, k, dir, "--max-devices-per-pod", "1", "--sysfs-root", "", "--device-cr=false")

	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"query", "list", "--socket", srv.socket}, &out, &errOut); code != 0 {
		t.Fatalf("query list exited %d: %s", code, errOut.String())
	}
	if tabletest.HasLine(out.String(), "greedy", "GPU-") {
		t.Errorf("the pod over the limit is shown with devices:\n%s", out.String())
	}
	if !tabletest.HasLine(out.String(), "modest", "train", "nvidia.com/gpu", gpuUUID) {
		t.Errorf("the pod within the limit lost its GPU:\n%s", out.String())
	}
	if logs := srv.logs.String(); !strings.Contains(logs, "pod ml/greedy: 2 devices, 1 allowed per pod (--max-devices-per-pod)") {
		t.Errorf("serve did not log the refusal naming the pod:\n%s", logs)
	}
}

// tokenFile returns a service account token file.
func tokenFile(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("sa-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serve's inventory asks its sources in their order of precedence: the
// Device object, the operator's file, sysfs (package inventory's doc).
func TestServeOrdersTheInventorySourcesByPrecedence(t *testing.T) {
	c := &serveConfig{deviceCR: true, nodeName: "node-1", apiServer: "https://127.0.0.1:6443",
		apiCAFile: tlstest.OtherCA(t, filepath.Join(t.TempDir(), "ca.crt")), apiTokenFile: tokenFile(t),
		inventoryFile: filepath.Join(t.TempDir(), "inventory.json"), sysfsRoot: t.TempDir(), procfsRoot: t.TempDir()}
	inv, _, err := c.inventory(logrus.New())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := inv.Sources(), []string{inventory.SourceDeviceCR, inventory.SourceFile, inventory.SourceSysfs}; !slices.Equal(got, want) {
		t.Errorf("sources %q, want %q", got, want)
	}
}

// --view serves each named view on a socket of its own, beside --socket's
// topology view: two pods sharing a GPU are told apart as each view says.
func TestServeServesEachViewOnItsOwnSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := fakekubelet.Start(t, dir)
	share := map[string]string{"koordinator.sh/gpu-core": "50", "koordinator.sh/gpu-memory-ratio": "50"}
	sharer := func(name, uid string) fakekubelet.Pod {
		return fakekubelet.NewPod("ml", name, uid, fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
				`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"},"id":"`+gpuUUID+`"}]}`),
			fakekubelet.WithContainer("infer", share))
	}
	k.SetPods(sharer("a", "uid-a"), sharer("b", "uid-b"))
	dcgm, plain := filepath.Join(dir, "dcgm", "kubelet.sock"), filepath.Join(dir, "plain", "kubelet.sock")
	srv := startServe(t, k, dir, "--sysfs-root", "", "--device-cr=false", "--view", "dcgm="+dcgm, "--view", "plain="+plain)

	for socket, want := range map[string][2]string{
		srv.socket: {gpuUUID, gpuUUID + "::1"},
		dcgm:       {gpuUUID + "::0", gpuUUID + "::1"},
		plain:      {gpuUUID, gpuUUID},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), []string{"query", "list", "--socket", socket}, &out, &errOut); code != 0 {
			t.Fatalf("query list on %s exited %d: %s", socket, code, errOut.String())
		}
		for i, pod := range []string{"a", "b"} {
			if !hasFields(out.String(), "ml", pod, "infer", "nvidia.com/gpu", want[i]) {
				t.Errorf("%s: pod %s is not shown with %s:\n%s", socket, pod, want[i], out.String())
			}
		}
	}
}

// hasFields reports whether some line of a table has all these fields,
// each whole.
func hasFields(table string, fields ...string) bool {
	for _, line := range strings.Split(table, "\n") {
		if got := strings.Fields(line); !slices.ContainsFunc(fields, func(f string) bool { return !slices.Contains(got, f) }) {
			return true
		}
	}
	return false
}

// The kubelet's exec probe fails (exit 1, saying why) while nothing serves
// the probe socket, and a wrong command line is a usage error.
func TestProbeFailsWithoutAServeAndRefusesMistakes(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "probe.sock")
	if code, _, errOut := runCmd(t, "probe", "--socket", sock, "readyz"); code != 1 || !strings.Contains(errOut, "readyz") {
		t.Errorf("probe with nothing serving: exit %d, %q; want 1 and why", code, errOut)
	}
	for _, args := range [][]string{{"probe"}, {"probe", "metrics"}, {"probe", "readyz", "healthz"}, {"probe", "--timeout", "0", "readyz"}} {
		if code, _, _ := runCmd(t, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
