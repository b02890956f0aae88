package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/test/critest"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// The report measures the podres-proxy binary itself (unless
// PODRES_BENCH_PROXY=wired), started as `serve` in front of the fake kubelet (trust
// gate, metrics, /pods over HTTPS with a token, the persisted store, the
// CRI reconciler against a fake runtime that lists every pod's sandbox and
// containers), instead of the test binary wired as serve wires it. Its
// rate limit is off and its per-client connection cap is the total's: the
// report plays every client from one process.

// serveBinary builds cmd/podres-proxy once per report.
var serveBinary = benchBinary("../cmd/podres-proxy")

// startServeChild starts `podres-proxy serve` in front of kubelet k, whose
// pods are benchPods(n), and returns once it answers every pod with its
// GPUs.
func startServeChild(t testing.TB, k *fk.Kubelet, n int) benchChild {
	bin, err := serveBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	var sandboxes []*criv1.PodSandbox
	var ctrs []*criv1.Container
	for i, p := range benchPods(n) {
		sb := &criv1.PodSandbox{
			Id:          fmt.Sprintf("sandbox-%d", i),
			Metadata:    &criv1.PodSandboxMetadata{Name: p.Name, Uid: string(p.UID), Namespace: p.Namespace},
			State:       criv1.PodSandboxState_SANDBOX_READY,
			Annotations: p.Annotations,
		}
		sandboxes = append(sandboxes, sb)
		for _, c := range p.Spec.Containers {
			ctrs = append(ctrs, critest.Ctr(sb, c.Name, criv1.ContainerState_CONTAINER_RUNNING))
		}
	}
	runtime := &critest.Runtime{}
	runtime.Set(sandboxes, ctrs)
	criSocket := filepath.Join(dir, "cri.sock")
	critest.Serve(t, criSocket, runtime)

	socket := filepath.Join(dir, "serve", "kubelet.sock")
	cmd := exec.Command(bin, "serve",
		"--socket="+socket,
		"--kubelet-socket="+k.Socket,
		"--kubelet-pods-url="+k.PodsURL,
		"--kubelet-token-file="+k.TokenFile,
		"--kubelet-ca-file="+k.CAFile,
		"--kubelet-pods-api-socket=",
		"--state-dir="+filepath.Join(dir, "state"),
		"--nri-socket=",
		"--cri-socket=unix://"+criSocket,
		"--metrics-addr=127.0.0.1:0",
		"--rate-limit-qps=0",
		"--max-connections-per-client=128",
		"--device-cr=false",
		"--sysfs-root=",
		"--log-level=warn",
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
		})
	}
	t.Cleanup(stop)
	want := n * len(benchContainers())
	for deadline := time.Now().Add(time.Minute); ; {
		if gpus, err := listGPUs(socket); err == nil && gpus == want {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("podres-proxy serve did not answer the %d GPUs within a minute:\n%s", want, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // setup, not measured
	}
	return benchChild{socket: socket, pid: cmd.Process.Pid, stop: stop}
}

// listGPUs is how many GPUs a List through socket answers.
func listGPUs(socket string) (int, error) {
	if _, err := os.Stat(socket); err != nil {
		return 0, err
	}
	conn, err := dialSocket(socket)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := v1.NewPodResourcesListerClient(conn).List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		return 0, err
	}
	gpus := 0
	for _, p := range resp.PodResources {
		for _, c := range p.Containers {
			for _, d := range c.Devices {
				if strings.HasPrefix(d.ResourceName, "nvidia.com/gpu") {
					gpus++
				}
			}
		}
	}
	return gpus, nil
}
