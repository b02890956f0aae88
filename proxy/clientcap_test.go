package proxy_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/proxy/limits"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// listChildSocket, set in its environment, makes this test binary the
// other client process of TestOneProcessHoldingEveryConnectionStarvesNoOne:
// TestListFromAnotherProcess then lists the pods on that socket, as
// `podres-proxy query list` or Multus would, and fails if it cannot.
const listChildSocket = "PODRES_TEST_LIST_SOCKET"

// A client process that leaks connections (a poller that never closes
// them) and holds as many as the whole cap allows must not lock another
// process out: it gets its own share of places, and Multus, DCGM or
// `podres-proxy query list` in another process are still served.
func TestOneProcessHoldingEveryConnectionStarvesNoOne(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("default", "trainer", "uid-1",
		fk.WithAnnotation(koordKey, gpuAndVF),
		fk.WithContainer("main", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "1"})))
	// This process is the hog: it opens as many connections as the
	// server serves in all, and keeps them.
	for range limits.DefaultMaxConnections {
		c, err := net.Dial("unix", h.socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	// Another process, which connects after all of them, lists the pods.
	cmd := exec.Command(os.Args[0], "-test.run=^TestListFromAnotherProcess$", "-test.v")
	cmd.Env = append(os.Environ(), listChildSocket+"="+h.socket)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a List from another process while this one holds %d connections: %v\n%s",
			limits.DefaultMaxConnections, err, out)
	}
	// The hog kept only its share: the rest of its connections were closed.
	if got, want := h.counter("podres_proxy_connections_rejected_total"), float64(limits.DefaultMaxConnections-limits.DefaultMaxConnectionsPerClient); got < want {
		t.Errorf("connections_rejected_total = %v, want at least %v (one process's connections beyond its %d)",
			got, want, limits.DefaultMaxConnectionsPerClient)
	}
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
