package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// The daemon's memory is measured in a process of its own: the report's
// process also holds the fake kubelets, the other proxies and the clients.
// proxyProcessMemory starts this test binary again as a proxy alone
// (TestBenchProxyProcess), in front of a fake kubelet with n pods, drives
// Lists through it (steady, one pod changed per call, 64 clients at once)
// and reads the child's peak RSS from /proc.

const benchChildEnv = "PODRES_BENCH_CHILD"

func proxyProcessMemory(t *testing.T, n int) string {
	dir := shortDir(t)
	k := fk.Start(t, dir)
	pods := benchPods(n)
	k.SetPods(pods...)
	socket := filepath.Join(dir, "child", "proxy.sock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchProxyProcess$")
	cmd.Env = append(os.Environ(),
		benchChildEnv+"=1",
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
	defer func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("proxy process: %v\n%s", err, stderr.String())
		}
	}()
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
		ready <- fmt.Errorf("proxy process ended before it was ready: %s", stderr.String())
	}()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("proxy process not ready after a minute")
	}

	c := v1.NewPodResourcesListerClient(dialBench(t, socket))
	change := changeOne(k, pods)
	for i := range 1000 {
		if i >= 500 {
			change(i)
		}
		if _, err := c.List(context.Background(), &v1.ListPodResourcesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	shared := concurrentLists(t, socket, k, benchClients, benchClientCalls)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
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

// TestBenchProxyProcess is the proxy process of proxyProcessMemory; it runs
// only when started by it.
func TestBenchProxyProcess(t *testing.T) {
	if os.Getenv(benchChildEnv) == "" {
		t.Skip("started by the benchmark report only")
	}
	env := func(name string) string { return os.Getenv("PODRES_BENCH_CHILD_" + name) }
	n, err := strconv.Atoi(env("PODS"))
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set := allocator.NewSet(log, func(string) {}, decoders...)
	store := state.New(state.Options{Decoder: set})
	client, err := kubeletpods.NewClient(kubeletpods.Config{URL: env("PODS_URL"), TokenFile: env("TOKEN"), CAFile: env("CA")})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Config{Socket: env("SOCKET"), KubeletSocket: env("KUBELET"), Log: log},
		proxy.Providers{Store: store, Pods: client.Pods, Allocators: set})
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
	// Steady state: one read learns the specs, NRI has recorded the sandboxes.
	if _, err := v1.NewPodResourcesListerClient(dialBench(t, env("SOCKET"))).List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
		t.Fatal(err)
	}
	for i, p := range benchPods(n) {
		store.ObserveSandbox(record.OriginNRI, model.Sandbox{
			ID: fmt.Sprintf("sandbox-%d", i), UID: string(p.UID), Namespace: p.Namespace, Name: p.Name,
			Annotations: p.Annotations, Ready: true,
		})
	}
	fmt.Println("podres-bench-ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // until the report is done
	cancel()
	<-served
}
