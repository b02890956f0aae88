package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/test/deviceplugin"
	"github.com/podres-proxy/podres-proxy/test/e2eutil"
)

// Names the suite's node and pods use.
const (
	nodeName     = "e2e-node"
	podNamespace = "podres-e2e"
	rdmaResource = "koordinator.sh/rdma"
	gpuResource  = "nvidia.com/gpu"
	devResource  = "example.com/dev"
	cniBridge    = "podrese2e0"

	// hamiResource is the resource HAMi's device plugin advertises on this
	// node, with fake ids (hamiDeviceIDs), and the one serve reports HAMi's
	// NVIDIA vGPUs as (--hami-resources vgpu=hamiResource). It is not
	// HAMi's default nvidia.com/gpu on purpose: the Koordinator pods request
	// nvidia.com/gpu as a scheduler-managed extended resource, which the
	// kubelet admits only while no device plugin advertises it. Were HAMi's
	// plugin to advertise nvidia.com/gpu, the kubelet would hand those pods
	// fake ids too, which no real node mixing the two schedulers does, and
	// their scenarios would test something else. So HAMi is configured as its
	// chart allows (resourceName), as when its vGPUs share a node with GPUs
	// handed out otherwise. That also proves serve's mapping reaches the
	// replacement: were --hami-resources ignored, the kubelet's fake ids
	// would stay and the real GPUs would appear under nvidia.com/gpu.
	hamiResource = "nvidia.com/vgpu"
)

// devDeviceIDs are the test device plugin's devices.
var devDeviceIDs = []string{"dev-0", "dev-1"}

// hamiDeviceIDs are the HAMi-style device plugin's devices: each of the
// node's two GPUs split four ways, as HAMi's deviceSplitCount does. The
// kubelet picks any of them; HAMi's annotation names the GPUs themselves.
var hamiDeviceIDs = deviceplugin.HAMiDeviceIDs([]string{hamiSidecarGPU, hamiAppGPU}, 4)

// h is the running harness; nil when the suite is not enabled.
var h *harness

// harness is the node, the proxy and the device plugin of one run.
type harness struct {
	repo      string
	artifacts string
	root      string
	env       map[string]string // ROOT/node.env

	proxyBin    string
	proxySocket string
	// viewSockets are the sockets of the views serve is asked to serve
	// besides proxySocket's, by view (empty when serve has no --view);
	// inventoryFile lists the suite's GPUs with their NUMA nodes, for them.
	viewSockets   map[string]string
	inventoryFile string
	stateDir      string
	metricsAddr   string
	probeRecords  string
	// readsBefore are the reads of every pod counted by the serve
	// processes restartProxy stopped (readSummary adds the running one's).
	readsBefore readCounts
	// deviceInfoDir is where serve writes device-info files and the CNI
	// probe, like Multus, reads them.
	deviceInfoDir string
	// serveMissing says why the proxy's tests skip; empty when serve runs.
	serveMissing string
	// serveHelp is `podres-proxy serve -h`, to use flags only where known.
	serveHelp string

	mu    sync.Mutex
	proxy *process

	// dp advertises devResource, hamiDP hamiResource (HAMi's fake ids).
	dp, hamiDP *deviceplugin.Plugin
	dpCancel   context.CancelFunc
	dpDone     sync.WaitGroup
	dpLog      *os.File

	failed       atomic.Bool
	teardownOnce sync.Once
	// armTimer, closed once the builds are done, starts the watchdog's
	// time limit.
	armTimer chan struct{}
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if run, err := e2eutil.Enabled("e2e", "it starts containerd and a kubelet"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	} else if !run {
		return m.Run()
	}
	var err error
	h, err = newHarness()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer h.teardown()
	defer h.watchdog()()

	if err := h.setup(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: setup: %v\n", err)
		h.failed.Store(true)
		return 1
	}
	code := m.Run()
	if code != 0 {
		h.failed.Store(true)
	}
	if h.serveMissing == "" {
		fmt.Println(h.readSummary())
	}
	return code
}

func newHarness() (*harness, error) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		return nil, fmt.Errorf("find the repo: %w", err)
	}
	if _, err := os.Stat(filepath.Join(repo, "hack", "node-up.sh")); err != nil {
		return nil, fmt.Errorf("find the repo's hack/ scripts: %w", err)
	}
	artifacts := os.Getenv("PODRES_E2E_ARTIFACTS")
	if artifacts == "" {
		artifacts = filepath.Join(repo, "_output", "e2e")
	}
	artifacts = filepath.Join(artifacts, time.Now().Format("20060102-150405"))
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		return nil, fmt.Errorf("create the artifacts directory: %w", err)
	}
	// A short root under /tmp: unix socket paths must stay under 108 bytes.
	root, err := os.MkdirTemp("", "podres-e2e-")
	if err != nil {
		return nil, fmt.Errorf("create the node root: %w", err)
	}
	if err := os.WriteFile(filepath.Join(artifacts, "node-root"), []byte(root+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("record the node root: %w", err)
	}
	fmt.Printf("e2e: node root %s, logs in %s\n", root, artifacts)
	return &harness{
		repo:        repo,
		artifacts:   artifacts,
		root:        root,
		proxyBin:    filepath.Join(root, "proxy-bin", "podres-proxy"),
		proxySocket: filepath.Join(root, "proxy", "kubelet.sock"),
		viewSockets: map[string]string{
			"dcgm":  filepath.Join(root, "dcgm", "kubelet.sock"),
			"plain": filepath.Join(root, "plain", "kubelet.sock"),
			"kata":  filepath.Join(root, "kata", "kubelet.sock"),
		},
		inventoryFile: filepath.Join(root, "inventory.json"),
		stateDir:      filepath.Join(root, "state"),
		probeRecords:  filepath.Join(root, "cniprobe.jsonl"),

		deviceInfoDir: filepath.Join(root, "devinfo", "dp"),
	}, nil
}

// setup builds what is needed and starts the node, the proxy and the device
// plugin.
func (h *harness) setup() error {
	if os.Getenv("PODRES_E2E_SKIP_BUILD") != "1" {
		if err := h.script("build-node", "hack/build-node.sh"); err != nil {
			return err
		}
	}
	if err := h.runner().GoBuild(h.proxyBin, "./cmd/podres-proxy"); err != nil {
		return err
	}
	probeBin := filepath.Join(h.root, "cni", "bin", "podres-cniprobe")
	if err := h.runner().GoBuild(probeBin, "./test/cniprobe"); err != nil {
		return err
	}
	// The builds are done: from now on the watchdog's time limit counts.
	close(h.armTimer)
	h.serveMissing = h.checkServe()
	if os.Getenv("PODRES_E2E_PROXY") == "0" {
		h.serveMissing = "PODRES_E2E_PROXY=0"
	}
	if h.serveMissing != "" {
		if os.Getenv("PODRES_E2E_REQUIRE_SERVE") == "1" {
			return fmt.Errorf("podres-proxy serve is required: %s", h.serveMissing)
		}
		fmt.Printf("e2e: %s: the proxy's tests skip; the node, the CNI probe and the device plugin run against the kubelet alone\n", h.serveMissing)
	}

	ports, err := freePorts(4)
	if err != nil {
		return err
	}
	h.metricsAddr = fmt.Sprintf("127.0.0.1:%d", ports[3])
	kubeletRoot := filepath.Join(h.root, "kubelet")
	probeSocket := h.proxySocket
	if h.serveMissing != "" {
		probeSocket = filepath.Join(kubeletRoot, "pod-resources", "kubelet.sock")
	}
	probe, err := json.Marshal(map[string]any{
		"type":         "podres-cniprobe",
		"socket":       probeSocket,
		"resourceName": rdmaResource,
		"recordFile":   h.probeRecords,
		"criSocket":    filepath.Join(h.root, "containerd", "containerd.sock"),
		// Not the host's directory: the node is a test node on a shared
		// machine.
		"deviceInfoDir": h.deviceInfoDir,
	})
	if err != nil {
		return fmt.Errorf("encode the CNI probe's config: %w", err)
	}
	if err := h.script("node-up", "hack/node-up.sh", h.root,
		"PODRES_NODE_NAME="+nodeName,
		"PODRES_KUBELET_ROOT="+kubeletRoot,
		fmt.Sprintf("PODRES_KUBELET_PORT=%d", ports[0]),
		fmt.Sprintf("PODRES_KUBELET_READONLY_PORT=%d", ports[1]),
		fmt.Sprintf("PODRES_KUBELET_HEALTHZ_PORT=%d", ports[2]),
		"PODRES_CNI_BRIDGE="+envOr("PODRES_E2E_BRIDGE", cniBridge),
		"PODRES_CNI_META_PLUGIN="+string(probe),
		"PODRES_KUBELET_PODS_API="+envOr("PODRES_E2E_PODS_API", "1"),
	); err != nil {
		return err
	}
	if h.env, err = readNodeEnv(filepath.Join(h.root, "node.env")); err != nil {
		return err
	}
	podsAPI := "serves no Pods API"
	if h.env["KUBELET_PODS_API"] == "1" {
		podsAPI = "serves its Pods API"
	}
	fmt.Printf("e2e: kubelet %s (%s), containerd %s\n", h.env["KUBELET_VERSION"], podsAPI, h.env["CONTAINERD_BUILD"])

	if err := h.startDevicePlugins(); err != nil {
		return err
	}
	if h.serveMissing == "" {
		if err := writeInventory(h.inventoryFile); err != nil {
			return err
		}
		if err := h.startProxy(); err != nil {
			return err
		}
	}
	return nil
}

// checkServe tells why `podres-proxy serve` cannot run, or "" when it can.
func (h *harness) checkServe() string {
	out, err := exec.Command(h.proxyBin, "serve", "-h").CombinedOutput()
	h.serveHelp = string(out)
	if err != nil || !strings.Contains(string(out), "kubelet-pods-url") {
		return fmt.Sprintf("podres-proxy serve is not implemented yet (serve -h: %s)", firstLine(out))
	}
	return ""
}

// teardown stops everything, keeps the logs and, if something failed,
// prints their tails. It runs once.
func (h *harness) teardown() {
	h.teardownOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		h.mu.Lock()
		if h.proxy != nil {
			h.proxy.stop(10 * time.Second)
			h.proxy = nil
		}
		h.mu.Unlock()
		h.stopDevicePlugins()
		if h.stateDir != "" {
			h.saveInspect()
		}
		if err := h.scriptCtx(ctx, "node-down", "hack/node-down.sh", h.root); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: teardown: %v\n", err)
			h.failed.Store(true)
		}
		h.saveArtifacts()
		if os.Getenv("PODRES_E2E_KEEP_ROOT") != "1" {
			if err := os.RemoveAll(h.root); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: remove %s: %v\n", h.root, err)
			}
		}
		if h.failed.Load() {
			h.printTails()
		}
		fmt.Printf("e2e: logs kept in %s\n", h.artifacts)
	})
}

// watchdog tears down and exits when the run is interrupted, or takes too
// long once the node builds are done (armTimer), so no node is left
// running: go test's own -timeout would exit without a teardown. It returns
// a stop function.
func (h *harness) watchdog() func() {
	limit := 30 * time.Minute
	if v := os.Getenv("PODRES_E2E_TIMEOUT"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			limit = d
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	h.armTimer = make(chan struct{})
	arm := h.armTimer
	done := make(chan struct{})
	go func() {
		var expired <-chan time.Time
		for {
			select {
			case <-done:
				return
			case <-arm:
				timer := time.NewTimer(limit)
				defer timer.Stop()
				expired, arm = timer.C, nil
				continue
			case s := <-sigs:
				fmt.Fprintf(os.Stderr, "e2e: %v: tearing down\n", s)
			case <-expired:
				fmt.Fprintf(os.Stderr, "e2e: watchdog: the run took over %v after the builds: tearing down\n", limit)
			}
			h.failed.Store(true)
			h.teardown()
			os.Exit(1)
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(done)
	}
}

// script runs a hack/ script with extra environment, logging its output to
// the console and to the artifacts.
func (h *harness) script(name, path string, argsAndEnv ...string) error {
	return h.scriptCtx(context.Background(), name, path, argsAndEnv...)
}

func (h *harness) scriptCtx(ctx context.Context, name, path string, argsAndEnv ...string) error {
	return h.runner().Script(ctx, name, path, argsAndEnv...)
}

func (h *harness) runner() e2eutil.Runner {
	return e2eutil.Runner{Repo: h.repo, Artifacts: h.artifacts, Suite: "e2e"}
}

// readNodeEnv reads the KEY=VALUE lines node-up.sh wrote.
func readNodeEnv(path string) (map[string]string, error) {
	return e2eutil.ReadEnvFile(path, "POD_RESOURCES_SOCK", "CONTAINERD_SOCK", "NRI_SOCK", "MANIFESTS", "KUBELET_READONLY_PORT", "KUBELET_ROOT", "LOGS",
		"KUBELET_PODS_API", "PODS_API_SOCK")
}

// freePorts asks the kernel for n free loopback ports.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// process is a child process the harness started (podres-proxy serve).
type process struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

// startProcess starts a command in its own process group, appending its
// output to artifacts/NAME.log, and records its PID in ROOT/pids so
// node-down.sh ends it too if the harness could not.
func (h *harness) startProcess(name string, args ...string) (*process, error) {
	f, err := os.OpenFile(filepath.Join(h.artifacts, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s's log: %w", name, err)
	}
	fmt.Fprintf(f, "=== %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan error, 1), log: f}
	go func() { p.done <- cmd.Wait() }()
	pids, err := os.OpenFile(filepath.Join(h.root, "pids"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		fmt.Fprintf(pids, "%s %d\n", name, cmd.Process.Pid)
		pids.Close()
	}
	return p, nil
}

// exited tells whether the process has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case err := <-p.done:
		p.done <- err
		return true, err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, then SIGKILL after grace, and waits for the exit.
func (p *process) stop(grace time.Duration) {
	defer p.log.Close()
	if done, _ := p.exited(); done {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	fmt.Fprintf(os.Stderr, "e2e: %s ignored SIGTERM for %v: SIGKILL\n", p.name, grace)
	_ = p.cmd.Process.Kill()
	<-p.done
}

// serveArgs are the flags of `podres-proxy serve` against the node.
func (h *harness) serveArgs() []string {
	args := []string{
		h.proxyBin, "serve",
		"--socket", h.proxySocket,
		"--kubelet-socket", h.env["POD_RESOURCES_SOCK"],
		"--kubelet-pods-url", "http://127.0.0.1:" + h.env["KUBELET_READONLY_PORT"] + "/pods",
		"--state-dir", h.stateDir,
		"--nri-socket", h.env["NRI_SOCK"],
		"--cri-socket", "unix://" + h.env["CONTAINERD_SOCK"],
		"--metrics-addr", h.metricsAddr,
		"--log-level", "debug",
		// See hamiResource.
		"--hami-resources", "vgpu=" + hamiResource,
	}
	if strings.Contains(h.serveHelp, "-device-info-dir") {
		args = append(args, "--device-info-dir", h.deviceInfoDir)
	}
	if h.servesPodsAPIFlag() {
		// The kubelet's Pods API under the node's kubelet root, whether
		// the kubelet serves it (PODRES_E2E_PODS_API, default 1) or not:
		// serve then reads /pods, as on a kubelet without the gate.
		args = append(args, "--kubelet-pods-api-socket", h.env["PODS_API_SOCK"])
	}
	if strings.Contains(h.serveHelp, "-kubelet-pod-logs-dir") {
		// The node's kubelet keeps pod logs under LOGS (its podLogsDir).
		args = append(args, "--kubelet-pod-logs-dir", filepath.Join(h.env["LOGS"], "pods"))
	}
	if h.servesViews() {
		for _, v := range []string{"dcgm", "plain", "kata"} {
			args = append(args, "--view", v+"="+h.viewSockets[v])
		}
		args = append(args, "--inventory-file", h.inventoryFile)
	}
	if strings.Contains(h.serveHelp, "-prune-after") {
		// A short grace period, so the removal test sees the prune.
		args = append(args, "--prune-after", "20s")
	}
	return append(args, strings.Fields(os.Getenv("PODRES_E2E_SERVE_ARGS"))...)
}

// servesViews tells whether serve has --view (docs/views.md).
func (h *harness) servesViews() bool { return strings.Contains(h.serveHelp, "--view") }

// servesPodsAPIFlag tells whether serve has --kubelet-pods-api-socket.
func (h *harness) servesPodsAPIFlag() bool {
	return strings.Contains(h.serveHelp, "-kubelet-pods-api-socket")
}

// podsAPI tells whether the node's kubelet serves its Pods API (the
// PodsAPI gate) and serve watches it.
func (h *harness) podsAPI() bool {
	return h.env["KUBELET_PODS_API"] == "1" && h.servesPodsAPIFlag()
}

// metric returns the sum of serve's metric samples whose line starts with
// prefix (a name, or a name and labels), from its /metrics; 0 when none.
func (h *harness) metric(prefix string) (float64, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + h.metricsAddr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("read podres-proxy's /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("read podres-proxy's /metrics: %s", resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("read podres-proxy's /metrics: %w", err)
	}
	var sum float64
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", l, err)
		}
		sum += v
	}
	return sum, nil
}

// startProxy starts podres-proxy serve and waits until /readyz answers 200.
func (h *harness) startProxy() error {
	p, err := h.startProcess("podres-proxy", h.serveArgs()...)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.proxy = p
	h.mu.Unlock()
	start := time.Now()
	deadline := start.Add(60 * time.Second)
	url := "http://" + h.metricsAddr + "/readyz"
	client := &http.Client{Timeout: time.Second}
	for {
		if done, err := p.exited(); done {
			return fmt.Errorf("podres-proxy serve exited before it was ready (%v); see %s", err, p.log.Name())
		}
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				fmt.Fprintf(os.Stderr, "e2e: podres-proxy ready after %v\n", time.Since(start).Round(10*time.Millisecond))
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("podres-proxy not ready after 60s (last: %v); see %s", err, p.log.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restartProxy stops podres-proxy serve (SIGTERM, or SIGKILL as a crash
// would) and starts it again.
func (h *harness) restartProxy(kill bool) error {
	h.mu.Lock()
	p := h.proxy
	h.proxy = nil
	h.mu.Unlock()
	if p != nil {
		if c, err := h.readCounts(); err == nil {
			h.readsBefore = h.readsBefore.plus(c)
		}
		if kill {
			_ = p.cmd.Process.Kill()
		}
		p.stop(10 * time.Second)
	}
	return h.startProxy()
}

// startDevicePlugins runs the test device plugins (devResource and, with
// HAMi's fake ids, hamiResource) through the kubelet's plugin watcher and
// waits until the kubelet can allocate their devices: a static pod the
// kubelet admits before then is rejected for good, as out of the resource.
func (h *harness) startDevicePlugins() error {
	logf, err := os.OpenFile(filepath.Join(h.artifacts, "deviceplugin.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open the device plugins' log: %w", err)
	}
	var logMu sync.Mutex
	logFn := func(format string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		fmt.Fprintf(logf, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.dpCancel, h.dpLog = cancel, logf
	want := map[string][]string{devResource: devDeviceIDs, hamiResource: hamiDeviceIDs}
	for _, p := range []struct {
		resource string
		dst      **deviceplugin.Plugin
	}{{devResource, &h.dp}, {hamiResource, &h.hamiDP}} {
		dp, err := deviceplugin.New(deviceplugin.Options{
			ResourceName:    p.resource,
			DeviceIDs:       want[p.resource],
			RegistrationDir: filepath.Join(h.env["KUBELET_ROOT"], "plugins_registry"),
			Logf:            logFn,
		})
		if err != nil {
			return fmt.Errorf("device plugin %s: %w", p.resource, err)
		}
		*p.dst = dp
		h.dpDone.Go(func() { _ = dp.Run(ctx) })
	}
	err = pollErr(60*time.Second, func() error {
		for _, dp := range []*deviceplugin.Plugin{h.dp, h.hamiDP} {
			if dp.Registrations() == 0 {
				return fmt.Errorf("the kubelet has not registered a device plugin (last error: %v)", dp.LastError())
			}
		}
		alloc, err := allocatable(h.env["POD_RESOURCES_SOCK"])
		if err != nil {
			return fmt.Errorf("the kubelet's GetAllocatableResources: %w", err)
		}
		got := map[string][]string{}
		for _, d := range alloc.GetDevices() {
			got[d.GetResourceName()] = append(got[d.GetResourceName()], d.GetDeviceIds()...)
		}
		for resource, ids := range want {
			slices.Sort(got[resource])
			if !slices.Equal(got[resource], slices.Sorted(slices.Values(ids))) {
				return fmt.Errorf("the kubelet's allocatable %s = %v, want the device plugin's %v", resource, got[resource], ids)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("the device plugins' devices are not allocatable within 60s: %w", err)
	}
	return nil
}

// stopDevicePlugins stops the device plugins and waits until they are.
func (h *harness) stopDevicePlugins() {
	if h.dpCancel == nil {
		return
	}
	h.dpCancel()
	h.dpDone.Wait()
	h.dpLog.Close()
	h.dpCancel = nil
}

// saveInspect keeps `podres-proxy inspect -o json` of the store.
func (h *harness) saveInspect() {
	if _, err := os.Stat(h.stateDir); err != nil {
		return
	}
	out, err := exec.Command(h.proxyBin, "inspect", "--state-dir", h.stateDir, "-o", "json").CombinedOutput()
	if err != nil {
		out = append(out, []byte("\ninspect: "+err.Error()+"\n")...)
	}
	_ = os.WriteFile(filepath.Join(h.artifacts, "inspect.json"), out, 0o644)
}

// saveArtifacts copies the node's logs, settings, manifests, probe records
// and store into the artifacts directory.
func (h *harness) saveArtifacts() {
	for _, rel := range []string{"logs", "node.env", "pids", "kubelet-config.yaml", "containerd/config.toml", "cni/net.d", "manifests", "cniprobe.jsonl", "state"} {
		src := filepath.Join(h.root, rel)
		if _, err := os.Stat(src); err != nil {
			continue
		}
		dst := filepath.Join(h.artifacts, "node", rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			continue
		}
		if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: keep %s: %v: %s\n", rel, err, out)
		}
	}
}

// printTails prints the last lines of the main logs, for CI's output.
func (h *harness) printTails() {
	for _, rel := range []string{"podres-proxy.log", "deviceplugin.log", "node/cniprobe.jsonl", "node/logs/containerd.log", "node/logs/kubelet.log"} {
		path := filepath.Join(h.artifacts, rel)
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		if len(lines) > 60 {
			lines = lines[len(lines)-60:]
		}
		fmt.Printf("\n===== e2e: last lines of %s =====\n%s\n", path, strings.Join(lines, "\n"))
	}
}

// requireNode skips the test unless the suite runs.
func requireNode(t *testing.T) {
	t.Helper()
	if h == nil {
		t.Skip("e2e disabled: set PODRES_E2E=1 and run as root (see doc.go)")
	}
}

// requireProxy skips the test unless podres-proxy serve runs.
func requireProxy(t *testing.T) {
	t.Helper()
	requireNode(t)
	if h.serveMissing != "" {
		t.Skip(h.serveMissing)
	}
}

// envOr, poll, pollErr and permanentf are test/e2eutil's.
var (
	envOr      = e2eutil.EnvOr
	pollErr    = e2eutil.PollErr
	permanentf = e2eutil.Permanentf
)

func poll(t *testing.T, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	e2eutil.Poll(t, timeout, what, fn)
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}
