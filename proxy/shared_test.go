package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// Clients that poll List (DCGM exporter, RTE, NFD) often poll at once, and
// share kubelet calls (package upstream's Shared, whose tests check how many
// calls they cost). These tests check what each client gets when calls
// overlap: they hold the fake kubelet's calls at a gate and await a call
// reaching it instead of sleeping. Whether a later client shares the next
// call or, arriving after it, makes its own, its answer must be the same.

// events collects the fake kubelet's calls.
type events struct {
	kubelet chan string // a call reached the kubelet
}

func watch(t *testing.T, h *harness) *events {
	e := &events{kubelet: make(chan string, 256)}
	h.k.OnGRPC(func(m string) { e.kubelet <- m })
	t.Cleanup(func() { h.k.OnGRPC(nil) })
	return e
}

func (e *events) await(t *testing.T, c chan string, want string, n int) {
	t.Helper()
	ctx := ctx(t)
	for range n {
		select {
		case got := <-c:
			if got != want {
				t.Fatalf("got event %q, want %q", got, want)
			}
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %d %q event(s)", n, want)
		}
	}
}

type listResult struct {
	resp *v1.ListPodResourcesResponse
	err  error
}

func TestListsThatArriveDuringAKubeletCallGetOneThatStartedAfterThem(t *testing.T) {
	h := newHarness(t)
	p := fk.NewPod("default", "trainer", "uid-1", byKoord, fk.WithAnnotation(koordKey, oneGPU),
		fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"}))
	h.k.SetPods(p)
	h.list()
	h.markLive(p, "sb-1")
	e := watch(t, h)
	c := h.v1()
	release := h.k.HoldGRPC()
	defer release()

	// A's List reaches the kubelet, which answers what it knew then.
	first := make(chan listResult, 1)
	go func() {
		resp, err := c.List(ctx(t), &v1.ListPodResourcesRequest{})
		first <- listResult{resp, err}
	}()
	e.await(t, e.kubelet, "List", 1)

	// A pod is created while A's call is in flight; then eight more clients
	// ask. The call in flight started before they arrived, so they must
	// not be given its answer.
	h.k.AddPod(fk.NewPod("default", "created", "uid-2", byKoord, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpuUUID2)),
		fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"})))
	const n = 8
	later := make(chan listResult, n)
	for range n {
		// Each its own client, as polling agents are: one connection
		// carries at most a few calls at once (the server's stream limit).
		c := h.v1()
		go func() {
			resp, err := c.List(ctx(t), &v1.ListPodResourcesRequest{})
			later <- listResult{resp, err}
		}()
	}
	release()

	a := <-first
	if a.err != nil {
		t.Fatalf("first List: %v", a.err)
	}
	if findPod(a.resp, "default", "created") != nil {
		t.Errorf("the List in flight before the pod was created lists it")
	}
	for range n {
		r := <-later
		if r.err != nil {
			t.Fatalf("later List: %v", r.err)
		}
		pod := findPod(r.resp, "default", "created")
		if pod == nil {
			t.Fatalf("a List that arrived after the pod was created does not list it: %v", r.resp)
		}
		if got := devicesOf(pod, "app")["nvidia.com/gpu"]; len(got) != 1 || got[0] != gpuUUID2 {
			t.Errorf("created pod's GPUs = %v, want %s", got, gpuUUID2)
		}
	}
}

func TestASharedCallsErrorGoesToEveryCallerAndACallerMayLeave(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("default", "web", "uid-1"))
	e := watch(t, h)
	c := h.v1()
	release := h.k.HoldGRPC()
	defer release()

	first := make(chan error, 1)
	go func() {
		_, err := c.List(ctx(t), &v1.ListPodResourcesRequest{})
		first <- err
	}()
	e.await(t, e.kubelet, "List", 1)

	// The kubelet starts refusing calls; three clients wait for the next
	// call, and a fourth gives up while waiting.
	h.k.SetGRPCError(status.Error(codes.ResourceExhausted, "rejected by rate limit"))
	const n = 3
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.List(ctx(t), &v1.ListPodResourcesRequest{})
			errs <- err
		}()
	}
	leaving, leave := context.WithCancel(ctx(t))
	left := make(chan error, 1)
	go func() {
		_, err := c.List(leaving, &v1.ListPodResourcesRequest{})
		left <- err
	}()
	leave()
	if err := <-left; status.Code(err) != codes.Canceled {
		t.Errorf("a caller that cancelled its List got %v, want Canceled", err)
	}
	release()

	if err := <-first; err != nil {
		t.Errorf("the List in flight before the kubelet failed: %v", err)
	}
	for range n {
		err := <-errs
		if s, _ := status.FromError(err); s.Code() != codes.ResourceExhausted || s.Message() != "rejected by rate limit" {
			t.Errorf("a caller of the shared call got %v, want the kubelet's ResourceExhausted: rejected by rate limit", err)
		}
	}
}

func TestConcurrentV1alpha1ListsAndAllocatableEachGetTheKubeletsAnswer(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("default", "web", "uid-1"))
	h.k.SetAllocatable(&v1.AllocatableResourcesResponse{CpuIds: []int64{0, 1}})
	// Nine clients, each on its own connection (one connection carries at
	// most a few calls at once: the server's stream limit).
	conns := make(chan *grpc.ClientConn, 18)
	for range cap(conns) {
		conns <- h.conn()
	}
	for _, m := range []struct {
		method string
		call   func() error
	}{
		{"v1alpha1.List", func() error {
			_, err := v1alpha1.NewPodResourcesListerClient(<-conns).List(ctx(t), &v1alpha1.ListPodResourcesRequest{})
			return err
		}},
		{"GetAllocatableResources", func() error {
			resp, err := v1.NewPodResourcesListerClient(<-conns).GetAllocatableResources(ctx(t), &v1.AllocatableResourcesRequest{})
			if err == nil && len(resp.GetCpuIds()) != 2 {
				err = fmt.Errorf("allocatable cpus %v, want the kubelet's [0 1]", resp.GetCpuIds())
			}
			return err
		}},
	} {
		e := watch(t, h)
		release := h.k.HoldGRPC()
		errs := make(chan error, 9)
		go func() { errs <- m.call() }()
		e.await(t, e.kubelet, m.method, 1)
		for range 8 {
			go func() { errs <- m.call() }()
		}
		release()
		for range 9 {
			if err := <-errs; err != nil {
				t.Errorf("%s: %v", m.method, err)
			}
		}
	}
}
