package proxy_test

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/proxy/limits"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// Kata shims and Multus ask Get for each pod being created, and a node
// creates many at once (a Job's pods, a node coming back). Gets share the
// kubelet's List, so such a burst costs one or two kubelet calls, and the
// rate limit, which protects the kubelet, refuses none of it.

// burstGPU is pod i's own GPU, so that each Get shows it got its own pod.
func burstGPU(i int) string { return fmt.Sprintf("GPU-989aa251-1dfe-5bbc-7c12-%012d", i) }

// inShared is how many goroutines wait in, or make, a shared call
// (upstream.Shared.Do): the callers lined up behind a held kubelet call.
func inShared() int { return inStacks("proxy/upstream.(*Shared[...]).Do(") }

// inRead is how many goroutines wait for a /pods read (kubeletpods.Reader).
func inRead() int { return inStacks("kubeletpods.(*Reader).ReadAfter(") }

// inStacks counts the goroutines whose stack has frame.
func inStacks(frame string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte(frame))
		}
		buf = make([]byte, 2*len(buf))
	}
}

func TestABurstOfGetsOfNewPodsCostsOneOrTwoKubeletCallsAndNoneIsRefused(t *testing.T) {
	h := newHarness(t, withRateLimit(limits.DefaultRateLimitQPS, limits.DefaultRateLimitBurst))
	const n = 64
	var pods []fk.Pod
	for i := range n {
		pods = append(pods, fk.NewPod("default", fmt.Sprintf("p%d", i), fmt.Sprintf("uid-%d", i),
			byKoord, koordApp, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, burstGPU(i)))))
	}
	h.k.SetPods(pods...)
	e := watch(t, h)
	release := h.k.HoldGRPC()
	defer release()
	// Eight connections of one client process (a thick Multus runs each
	// CNI ADD on a connection of its own), eight calls on each.
	var clients []v1.PodResourcesListerClient
	for range 8 {
		clients = append(clients, h.v1())
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	var done atomic.Int64
	get := func(i int) {
		defer wg.Done()
		defer done.Add(1)
		resp, err := clients[i%len(clients)].Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "default", PodName: fmt.Sprintf("p%d", i)})
		if err == nil && !slices.Equal(devicesOf(resp.GetPodResources(), "app")["nvidia.com/gpu"], []string{burstGPU(i)}) {
			err = fmt.Errorf("p%d got %v, want its own GPU %s", i, devicesOf(resp.GetPodResources(), "app"), burstGPU(i))
		}
		errs[i] = err
	}
	// The first reaches the kubelet, which holds it; the others line up.
	wg.Add(n)
	go get(0)
	select {
	case <-e.kubelet:
	case <-ctx(t).Done():
		t.Fatal("the first Get never reached the kubelet")
	}
	for i := 1; i < n; i++ {
		go get(i)
	}
	poll.Until(t, "every Get to wait for a shared call, or to end", func() bool {
		return inShared()+int(done.Load()) >= n || h.k.GRPCCalls() > 2
	})
	release()
	wg.Wait()

	for i, err := range errs {
		if status.Code(err) == codes.ResourceExhausted {
			t.Errorf("p%d: refused by the rate limit (%v) although one kubelet call answers the burst", i, err)
		} else if err != nil {
			t.Errorf("p%d: %v", i, err)
		}
	}
	if calls := h.k.GRPCCalls(); calls > 2 {
		t.Errorf("a burst of %d Gets cost %d kubelet PodResources calls, want at most 2", n, calls)
	}
	if got := h.counter("podres_proxy_upstream_shared_calls_total", "method", "Get"); got < n-2 {
		t.Errorf("upstream_shared_calls_total{method=Get} = %v, want at least %d", got, n-2)
	}
	if got := h.counter("podres_proxy_rate_limited_total"); got != 0 {
		t.Errorf("rate_limited_total = %v, want 0", got)
	}
}

// The Gets of a burst arrive over a while, not at one instant: sandboxes
// are created by many pod workers, and a /pods read on a node with large
// annotations takes hundreds of milliseconds. Gets that arrive while the
// first read runs wait for the second, and each read's Gets share the
// kubelet call made when it ends: two calls however the burst is spread.
// (Asking the kubelet first, each wave of Gets arriving during the read
// cost at least one kubelet call of its own: six in all here.)
//
// No rate limit here: what it does with a burst is the test above's.
func TestABurstOfGetsSpreadOverASlowReadCostsTwoKubeletCalls(t *testing.T) {
	h := newHarness(t)
	const waves, perWave = 4, 16
	const n = 1 + waves*perWave
	var pods []fk.Pod
	for i := range n {
		pods = append(pods, fk.NewPod("default", fmt.Sprintf("p%d", i), fmt.Sprintf("uid-%d", i),
			byKoord, koordApp, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, burstGPU(i)))))
	}
	h.k.SetPods(pods...)
	release := h.k.HoldPods()
	defer release()
	client := h.v1()
	errs := make([]error, n)
	var wg sync.WaitGroup
	get := func(i int) {
		defer wg.Done()
		resp, err := client.Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "default", PodName: fmt.Sprintf("p%d", i)})
		if err == nil && !slices.Equal(devicesOf(resp.GetPodResources(), "app")["nvidia.com/gpu"], []string{burstGPU(i)}) {
			err = fmt.Errorf("p%d got %v, want its own GPU %s", i, devicesOf(resp.GetPodResources(), "app"), burstGPU(i))
		}
		errs[i] = err
	}
	// The first Get's read reaches the kubelet, which holds it.
	wg.Add(1)
	go get(0)
	poll.Until(t, "the first Get to read /pods", func() bool { return h.k.PodsReads() == 1 && inRead() == 1 })
	// Waves of Gets arrive while it is held, each once the one before
	// waits for a read.
	for w := range waves {
		wg.Add(perWave)
		for i := range perWave {
			go get(1 + w*perWave + i)
		}
		poll.Until(t, fmt.Sprintf("wave %d to wait for a /pods read", w), func() bool { return inRead() == 1+(w+1)*perWave })
	}
	release()
	wg.Wait()

	for i, err := range errs {
		if err != nil {
			t.Errorf("p%d: %v", i, err)
		}
	}
	if reads := h.k.PodsReads(); reads != 2 {
		t.Errorf("the burst cost %d /pods reads, want 2 (the held one, and one for the Gets that arrived during it)", reads)
	}
	if calls := h.k.GRPCCalls(); calls > 2 {
		t.Errorf("a burst of %d Gets spread over a /pods read cost %d kubelet calls, want at most 2", n, calls)
	}
}

// A Get beyond the rate limit costs the kubelet nothing: not a PodResources
// call of its own, and not a /pods read either, even for a pod the daemon
// does not know (which a Get within the limit reads before asking).
func TestAGetBeyondTheRateLimitCostsNoPodsRead(t *testing.T) {
	h := newHarness(t, withRateLimit(1, limits.DefaultRateLimitBurst))
	answered := 0
	for range 50 {
		_, err := h.v1().Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "default", PodName: "nope"})
		if status.Code(err) != codes.ResourceExhausted {
			answered++ // the kubelet's "not found"
		}
	}
	if answered == 50 {
		t.Fatal("no Get was refused: the test needs calls beyond the limit")
	}
	if reads := h.k.PodsReads(); reads > int64(answered) {
		t.Errorf("%d Gets within the limit, %d refused, cost %d /pods reads: the refused ones read too", answered, 50-answered, reads)
	}
}

// A client that floods Get, one call after another, is refused as the
// kubelet would refuse it: a call beyond the limit with no kubelet call to
// join costs the kubelet a call.
func TestAClientFloodingGetIsStillRateLimited(t *testing.T) {
	// One call a second after the burst: back-to-back calls outrun it
	// however slow the machine is (under hack/test.sh's CPU hog with -race,
	// a Get can take longer than the 10 ms a token takes at 100/s).
	h := newHarness(t, withRateLimit(1, limits.DefaultRateLimitBurst))
	h.k.SetPods(fk.NewPod("default", "web", "uid-1"))
	c := h.v1()
	var limited error
	for i := 0; i < 200 && limited == nil; i++ {
		_, limited = c.Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "default", PodName: "web"})
	}
	if want := status.Error(codes.ResourceExhausted, "rejected by rate limit"); !errors.Is(limited, want) {
		t.Fatalf("200 back-to-back Gets: got %v, want %v", limited, want)
	}
	if h.counter("podres_proxy_rate_limited_total") < 1 {
		t.Error("rate_limited_total not counted")
	}
}

// Get of a pod the kubelet does not list answers the kubelet's own error,
// now that the proxy looks the pod up in the kubelet's List.
func TestGetOfAPodTheKubeletDoesNotListAnswersItsError(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("default", "web", "uid-1"), fk.NewPod("other", "nope", "uid-2"))
	for _, req := range []*v1.GetPodResourcesRequest{
		{PodNamespace: "default", PodName: "nope"},
		{},
	} {
		_, err := h.v1().Get(ctx(t), req)
		want := status.New(codes.Unknown, fk.ErrNotFound(req.PodNamespace, req.PodName).Error())
		if st, _ := status.FromError(err); st.Code() != want.Code() || st.Message() != want.Message() {
			t.Errorf("Get %s/%s = %v, want %v", req.PodNamespace, req.PodName, err, want.Err())
		}
	}
}

// A client flooding Get from many calls at once shares kubelet calls, but
// the kubelet never sees them faster than the limit: 100 a second, plus the
// burst.
func TestAConcurrentFloodOfGetsCostsTheKubeletNoMoreThanTheLimit(t *testing.T) {
	h := newHarness(t, withRateLimit(limits.DefaultRateLimitQPS, limits.DefaultRateLimitBurst))
	h.k.SetPods(fk.NewPod("default", "web", "uid-1"))
	var clients []v1.PodResourcesListerClient
	for range 2 {
		clients = append(clients, h.v1())
	}
	const period = time.Second
	start := time.Now()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < period {
				_, err := clients[i%len(clients)].Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "default", PodName: "web"})
				if err != nil && status.Code(err) != codes.ResourceExhausted {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if max := int64(limits.DefaultRateLimitQPS*elapsed.Seconds()) + limits.DefaultRateLimitBurst + 1; h.k.GRPCCalls() > max {
		t.Errorf("%d kubelet calls in %v of flooding, more than the limit lets through (%d)", h.k.GRPCCalls(), elapsed, max)
	}
}
