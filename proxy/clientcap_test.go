package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/proxy/limits"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// listChildSocket, set in its environment, makes this test binary the
// other client process of TestOneProcessHoldingEveryConnectionStarvesNoOne
// and TestProcessesOutsideTheDaemonsPIDNamespaceAreToldApart:
// TestListFromAnotherProcess then lists the pods on that socket, as
// `podres-proxy query list` or Multus would, and fails if it cannot.
const listChildSocket = "PODRES_TEST_LIST_SOCKET"

// A client process that leaks connections (a poller that never closes
// them) and holds as many as the whole cap allows must not lock another
// process out: it gets its own share of places, and Multus, DCGM or
// `podres-proxy query list` in another process are still served.
func TestOneProcessHoldingEveryConnectionStarvesNoOne(t *testing.T) {
	h := newHarness(t, withMaxConnectionsPerClient(limits.DefaultMaxConnectionsPerClient))
	h.k.SetPods(trainer())
	hogAndListFromAnotherProcess(t, h.socket)
	// The hog kept only its share: the rest of its connections were closed.
	if got, want := h.counter("podres_proxy_connections_rejected_total"), float64(limits.DefaultMaxConnections-limits.DefaultMaxConnectionsPerClient); got < want {
		t.Errorf("connections_rejected_total = %v, want at least %v (one process's connections beyond its %d)",
			got, want, limits.DefaultMaxConnectionsPerClient)
	}
}

// hogAndListFromAnotherProcess makes this process the hog: it opens as many
// connections to socket as the server serves in all, and keeps them; then
// another process, which connects after all of them, lists the pods.
func hogAndListFromAnotherProcess(t *testing.T, socket string) {
	t.Helper()
	for range limits.DefaultMaxConnections {
		c, err := net.Dial("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestListFromAnotherProcess$", "-test.v")
	cmd.Env = append(os.Environ(), listChildSocket+"="+socket)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a List from another process while this one holds %d connections: %v\n%s",
			limits.DefaultMaxConnections, err, out)
	}
}

// serveChildDir, set in its environment, makes this test binary the
// daemon of TestProcessesOutsideTheDaemonsPIDNamespaceAreToldApart:
// TestServeInAPIDNamespace then serves a proxy with its socket in that
// directory until its stdin ends.
const serveChildDir = "PODRES_TEST_SERVE_DIR"

// As deployed (no hostPID), the daemon has a PID namespace of its own and
// the kernel gives it pid 0 for every client in another pod or on the
// host. Those processes must still be told apart, or the per-process cap
// would put every client of the node in one share: a hog outside the
// daemon's namespace must not lock out another process outside it.
func TestProcessesOutsideTheDaemonsPIDNamespaceAreToldApart(t *testing.T) {
	if !pidfdsInPidfs() {
		t.Skip("pidfds are not in pidfs (Linux before 6.9): processes outside the daemon's PID namespace cannot be told apart")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeInAPIDNamespace$", "-test.v")
	cmd.Env = append(os.Environ(), serveChildDir+"="+shortDir(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skipf("a PID namespace cannot be made here (CAP_SYS_ADMIN): %v", err)
		}
		t.Fatal(err)
	}
	var out strings.Builder
	socket := make(chan string, 1)
	go func() {
		defer close(socket)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			fmt.Fprintln(&out, sc.Text())
			if s, ok := strings.CutPrefix(sc.Text(), "serving "); ok {
				socket <- s
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("the daemon's process: %v", err)
		}
	})
	select {
	case s, ok := <-socket:
		if !ok {
			t.Fatalf("the daemon's process ended before it served:\n%s", out.String())
		}
		hogAndListFromAnotherProcess(t, s)
	case <-time.After(hangGuard):
		t.Fatal("the daemon's process did not serve")
	}
}

// TestServeInAPIDNamespace is the daemon of
// TestProcessesOutsideTheDaemonsPIDNamespaceAreToldApart; run alone, it
// skips.
func TestServeInAPIDNamespace(t *testing.T) {
	if os.Getenv(serveChildDir) == "" {
		t.Skip("the daemon of TestProcessesOutsideTheDaemonsPIDNamespaceAreToldApart")
	}
	h := newHarness(t, withMaxConnectionsPerClient(limits.DefaultMaxConnectionsPerClient))
	h.k.SetPods(trainer())
	fmt.Println("serving", h.socket)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// pidfdsInPidfs reports whether this kernel's pidfds live in pidfs, whose
// inodes name processes.
func pidfdsInPidfs() bool {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var fs unix.Statfs_t
	return unix.Fstatfs(fd, &fs) == nil && fs.Type == unix.PID_FS_MAGIC
}

// trainer is a pod with a GPU and an RDMA VF that koord-scheduler
// allocated.
func trainer() fk.Pod {
	return fk.NewPod("default", "trainer", "uid-1", byKoord,
		fk.WithAnnotation(koordKey, gpuAndVF),
		fk.WithContainer("main", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "1"}))
}

// TestListFromAnotherProcess is the other process of
// TestOneProcessHoldingEveryConnectionStarvesNoOne; run alone, it skips.
func TestListFromAnotherProcess(t *testing.T) {
	socket := os.Getenv(listChildSocket)
	if socket == "" {
		t.Skip("the other client process of TestOneProcessHoldingEveryConnectionStarvesNoOne")
	}
	c, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	resp, err := v1.NewPodResourcesListerClient(c).List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	pod := findPod(resp, "default", "trainer")
	if pod == nil {
		t.Fatal("the trainer pod is missing from List")
	}
	if got := devicesOf(pod, "main")["nvidia.com/gpu"]; len(got) != 1 || got[0] != gpuUUID {
		t.Fatalf("the trainer's GPUs = %v, want [%s]", got, gpuUUID)
	}
}
