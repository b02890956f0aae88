package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/trust"
)

// The report runs each proxy it measures (podres-proxy, the pass-throughs,
// koordlet's) in a process of its own, as each runs on a node: a proxy's
// garbage collector then scans its own heap, not the fake kubelets' and the
// clients' too, and its memory is its own. startBenchChild starts this
// test binary again as one of them (TestBenchChildProcess), or, for the
// floor from a program of its own, test/passthrough.

const benchChildEnv = "PODRES_BENCH_CHILD"

// The kinds of child: podres-proxy as serve wires it, a pass-through that
// forwards the kubelet's answer as bytes, koordlet's per-call work.
const (
	childProxy       = "proxy"
	childPassthrough = "passthrough"
	// childPassthroughOwn is the pass-through as a program of its own
	// (test/passthrough, passthroughBinary).
	childPassthroughOwn = "passthrough-own"
	childKoordlet       = "koordlet"
)

// benchChild is a proxy process.
type benchChild struct {
	socket string
	pid    int
	stop   func()
}

// startBenchChild starts a proxy of the given kind in front of kubelet k
// (n of whose pods are benchPods(n), for the proxy's steady state) and
// returns once it serves. stop ends it; so does the test's end.
func startBenchChild(t testing.TB, kind string, k *fk.Kubelet, n int) benchChild {
	dir := shortDir(t)
	socket := filepath.Join(dir, kind+".sock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchChildProcess$")
	if kind == childPassthroughOwn {
		bin, err := passthroughBinary()
		if err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(bin, "--socket", socket, "--upstream", k.Socket)
	}
	cmd.Env = append(os.Environ(),
		benchChildEnv+"="+kind,
		"PODRES_BENCH_CHILD_PODS="+strconv.Itoa(n),
		"PODRES_BENCH_CHILD_SOCKET="+socket,
		"PODRES_BENCH_CHILD_KUBELET="+k.Socket,
		"PODRES_BENCH_CHILD_PODS_URL="+k.PodsURL,
		"PODRES_BENCH_CHILD_TOKEN="+k.TokenFile,
		"PODRES_BENCH_CHILD_CA="+k.CAFile,
	)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stdin.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("%s process: %v\n%s", kind, err, stderr.String())
			}
		})
	}
	t.Cleanup(stop)
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "podres-bench-ready" {
				ready <- nil
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
		ready <- fmt.Errorf("%s process ended before it was ready", kind)
	}()
	select {
	case err := <-ready:
		if err != nil {
			stop()
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("%s process not ready after a minute", kind)
	}
	return benchChild{socket: socket, pid: cmd.Process.Pid, stop: stop}
}

// passthroughBinary builds test/passthrough once per report: the
// pass-through as a program of its own, which shares no code pages with the
// report's process, as a proxy on a node shares none with its clients and
// kubelet.
var passthroughBinary = benchBinary("../test/passthrough")

// benchBinary returns a function that builds the command pkg (a path from
// this package's directory) once per test process, into a directory that
// TestMain removes, and returns the binary's path.
func benchBinary(pkg string) func() (string, error) {
	return sync.OnceValues(func() (string, error) {
		dir, err := benchTempDir("podres-bench-bin")
		if err != nil {
			return "", err
		}
		bin := filepath.Join(dir, filepath.Base(pkg))
		out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
		return bin, nil
	})
}

// benchTempDirs are the directories of the binaries the report builds
// once per test process (serveBinary, passthroughBinary); TestMain removes
// them.
var benchTempDirs struct {
	sync.Mutex
	dirs []string
}

// benchTempDir makes such a directory.
func benchTempDir(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	benchTempDirs.Lock()
	benchTempDirs.dirs = append(benchTempDirs.dirs, dir)
	benchTempDirs.Unlock()
	return dir, nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	benchTempDirs.Lock()
	for _, dir := range benchTempDirs.dirs {
		os.RemoveAll(dir)
	}
	benchTempDirs.Unlock()
	os.Exit(code)
}

// proxyProcessMemory starts podres-proxy in a process of its own in front
// of a fake kubelet with n pods, drives Lists through it (steady, one pod
// changed per call, 64 clients at once) and reads its peak RSS from /proc.
func proxyProcessMemory(t *testing.T, n int) string {
	k := startBenchKubelet(t)
	pods := benchPods(n)
	k.SetPods(pods...)
	child := startBenchChild(t, childProxy, k, n)
	defer child.stop()

	c := v1.NewPodResourcesListerClient(dialBench(t, child.socket))
	change := changeOne(k, pods)
	for i := range 1000 {
		if i >= 500 {
			change(i)
		}
		if _, err := c.List(context.Background(), &v1.ListPodResourcesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	shared := concurrentLists(t, child.socket, k, benchClients, benchClientCalls)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", child.pid))
	if err != nil {
		t.Fatal(err)
	}
	field := func(name string) string {
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, name+":"); ok {
				return strings.TrimSpace(v)
			}
		}
		return "?"
	}
	return fmt.Sprintf("proxy process at %d pods, after 500 steady Lists, 500 with one pod changed each and %d clients x %d Lists at once (%.3f kubelet calls per List): peak RSS %s, RSS now %s",
		n, benchClients, benchClientCalls, shared, field("VmHWM"), field("VmRSS"))
}

// TestBenchChildProcess is a proxy process of startBenchChild; it runs
// only when started by it, and serves until its stdin closes.
func TestBenchChildProcess(t *testing.T) {
	kind := os.Getenv(benchChildEnv)
	if kind == "" {
		t.Skip("started by the benchmark report only")
	}
	env := func(name string) string { return os.Getenv("PODRES_BENCH_CHILD_" + name) }
	if dir := os.Getenv("PODRES_BENCH_CPUPROFILE"); dir != "" { // e.g. /tmp: /tmp/proxy-<pid>.prof
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.prof", kind, os.Getpid())))
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	switch kind {
	case childProxy:
		n, err := strconv.Atoi(env("PODS"))
		if err != nil {
			t.Fatal(err)
		}
		stop := serveProxyChild(t, n, env)
		defer stop()
	case childPassthrough:
		serveBench(t, env("SOCKET"), &rawPassthrough{up: dialBench(t, env("KUBELET"))})
	case childKoordlet:
		ca, err := os.ReadFile(env("CA"))
		if err != nil {
			t.Fatal(err)
		}
		token, err := os.ReadFile(env("TOKEN"))
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		serveKoordletStyle(t, env("SOCKET"), env("KUBELET"), env("PODS_URL"), strings.TrimSpace(string(token)),
			&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	default:
		t.Fatalf("unknown child %q", kind)
	}
	fmt.Println("podres-bench-ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the report is done
}

// serveProxyChild serves podres-proxy as serve wires it (metrics, the
// trust gate, the default limits) in steady state: one /pods read has
// learned the specs, NRI has recorded the sandboxes.
func serveProxyChild(t *testing.T, n int, env func(string) string) (stop func()) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	m := metrics.New(prometheus.NewRegistry())
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set := allocator.NewSet(log, m, decoders...)
	store := state.New(state.Options{Decoder: set})
	client, err := kubeletpods.NewClient(kubeletpods.Config{URL: env("PODS_URL"), TokenFile: env("TOKEN"), CAFile: env("CA")})
	if err != nil {
		t.Fatal(err)
	}
	gate := trust.NewGate(set, trust.GateOptions{Log: log, Metrics: m})
	// The report plays its benchClients clients from one process.
	srv, err := proxy.New(proxy.Config{Socket: env("SOCKET"), KubeletSocket: env("KUBELET"), MaxConnectionsPerClient: limits.DefaultMaxConnections, Log: log},
		proxy.Providers{Store: store, Pods: client.Pods, Allocators: set, Trust: gate, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	for !srv.Ready() {
		select {
		case err := <-served:
			t.Fatal(err)
		case <-time.After(time.Millisecond):
		}
	}
	c := v1.NewPodResourcesListerClient(dialBench(t, env("SOCKET")))
	list := func() (gpus int) {
		resp, err := c.List(ctx, &v1.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.PodResources {
			for _, c := range p.Containers {
				for _, d := range c.Devices {
					if d.ResourceName == "nvidia.com/gpu" {
						gpus++
					}
				}
			}
		}
		return gpus
	}
	sandbox := func(i int, p fk.Pod) model.Sandbox {
		return model.Sandbox{
			ID: fmt.Sprintf("sandbox-%d", i), UID: string(p.UID), Namespace: p.Namespace, Name: p.Name,
			Annotations: p.Annotations, Ready: true,
		}
	}
	if benchOption("NRI") == "sync" {
		// As serve starts: NRI's Synchronize reports every sandbox and
		// container first, then a /pods read learns the specs.
		var sandboxes []model.Sandbox
		var containers []model.RuntimeContainer
		for i, p := range benchPods(n) {
			sb := sandbox(i, p)
			sandboxes = append(sandboxes, sb)
			for _, c := range p.Spec.Containers {
				containers = append(containers, model.RuntimeContainer{
					ID: sb.ID + "-" + c.Name, SandboxID: sb.ID, Name: c.Name, State: model.ContainerRunning,
				})
			}
		}
		store.Reconcile(record.OriginNRI, time.Now(), sandboxes, containers, false)
		// The proxy reads the specs in the background; serve's readiness
		// is not the report's to measure, so wait for it to end.
		for deadline := time.Now().Add(time.Minute); list() < n*len(benchContainers()); {
			if time.Now().After(deadline) {
				t.Fatal("the proxy never learned the pods' specs")
			}
			time.Sleep(10 * time.Millisecond)
		}
	} else {
		list()
		for i, p := range benchPods(n) {
			store.ObserveSandbox(record.OriginNRI, sandbox(i, p))
		}
	}
	return func() {
		cancel()
		<-served
	}
}

// koordletHTTP is koordlet's /pods client: TLS verified against the
// kubelet's CA.
func koordletHTTP(conf *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 3 * time.Second}
}
