package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/podstest"
)

// TestLimitsReport prints, side by side in one run, the figures of the
// daemon's limits (issue 12):
//   - List latency (110 realistic pods) with and without one pod whose
//     annotation, within the API's 256 KiB, lists 6,000 RDMA VFs, for a
//     steady node (answer reused) and one that changes between calls
//     (answer rebuilt);
//   - the peak RSS of a child process reading 44 MiB of finished pods from
//     /pods with the DaemonSet's GOMEMLIMIT;
//   - the success rate of a polite client (10 List/s) while another
//     process floods the socket.
//
// Run it with `PODRES_BENCH=1 go test -run TestLimitsReport -v ./proxy`.
func TestLimitsReport(t *testing.T) {
	if url := os.Getenv("PODRES_LIMITS_PODS_URL"); url != "" {
		limitsMemoryChild(url)
		return
	}
	if sock := os.Getenv("PODRES_LIMITS_FLOOD_SOCKET"); sock != "" {
		limitsFloodChild(sock)
		return
	}
	if os.Getenv("PODRES_BENCH") == "" {
		t.Skip("set PODRES_BENCH=1 to run the limits report")
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\nLimits report\n")

	// List latency with and without a hostile pod.
	const n, rounds = 110, 5
	e := &benchEnv{h: newHarness(t, withRateLimit(0, 0))}
	pods := benchPods(n)
	e.h.k.SetPods(pods...)
	e.h.list()
	for i, p := range pods {
		e.h.markLive(p, fmt.Sprintf("sandbox-%d", i))
	}
	// rebuilt: one pod's part of the kubelet's answer changes before every
	// call, so that pod is rebuilt each time: an ordinary pod without the
	// hostile one, the hostile pod itself with it (the worst case).
	measure := func(want int, changed []fk.Pod) (steady, rebuilt float64) {
		var s, r []float64
		for range rounds {
			s = append(s, float64(testing.Benchmark(func(b *testing.B) { benchList(b, e.h.socket, want) }).NsPerOp()))
			r = append(r, float64(testing.Benchmark(func(b *testing.B) { benchListWith(b, e.h.socket, want, changeOne(e.h.k, changed)) }).NsPerOp()))
		}
		sort.Float64s(s)
		sort.Float64s(r)
		return s[rounds/2], r[rounds/2]
	}
	steady0, rebuilt0 := measure(n, pods)
	fmt.Fprintf(&out, "List latency, %d pods (median ns/op of %d rounds)        %12s %12s %8s %8s\n", n, rounds, "steady", "1 changed", "ratio", "ratio")
	fmt.Fprintf(&out, "  without a hostile pod                                   %12.0f %12.0f\n", steady0, rebuilt0)
	// The largest annotation the API takes (6,000 VFs, over the device cap:
	// refused as malformed), and the largest the cap lets through.
	for _, vfs := range []int{6000, allocator.DefaultMaxDevicesPerPod} {
		hostile := hostilePod(vfs)
		e.h.k.SetPods(append(slices.Clone(pods), hostile)...)
		e.h.list()
		e.h.markLive(hostile, "sandbox-hostile")
		steady1, rebuilt1 := measure(n+1, []fk.Pod{hostile})
		fmt.Fprintf(&out, "  with one pod of %5d RDMA VFs (%3d KiB annotation)     %12.0f %12.0f %7.2fx %7.2fx (goal <= 1.5x)\n",
			vfs, len(hostile.Annotations[koordKey])>>10, steady1, rebuilt1, steady1/steady0, rebuilt1/rebuilt0)
	}

	// Peak RSS while reading 44 MiB of /pods.
	body := podstest.FinishedPodsJSON(35, 1300<<10, 3)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	defer srv.Close()
	child := exec.Command(os.Args[0], "-test.run=^TestLimitsReport$", "-test.count=1")
	child.Env = append(os.Environ(), "PODRES_LIMITS_PODS_URL="+srv.URL+"/pods", "GOMEMLIMIT=100MiB")
	res, err := child.CombinedOutput()
	if err != nil {
		t.Fatalf("memory child: %v: %s", err, res)
	}
	fmt.Fprintf(&out, "Peak RSS reading %d MiB of /pods (35 finished pods, GOMEMLIMIT=100MiB, child VmHWM; goal <= 96 MiB): %s\n",
		len(body)>>20, strings.TrimSpace(lastLine(res)))

	// A polite client beside a flooding process.
	h := newHarness(t, withRateLimit(100, 10)) // the kubelet's numbers
	flood := exec.Command(os.Args[0], "-test.run=^TestLimitsReport$", "-test.count=1")
	flood.Env = append(os.Environ(), "PODRES_LIMITS_FLOOD_SOCKET="+h.socket)
	stop, err := flood.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	floodOut, err := flood.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := flood.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(floodOut)
	if !lines.Scan() || lines.Text() != "flooding" {
		t.Fatalf("flood child: %q", lines.Text())
	}
	c := h.v1()
	const politeCalls = 100
	ok := 0
	tick := time.NewTicker(100 * time.Millisecond) // the polite client's pace
	for range politeCalls {
		<-tick.C
		if _, err := c.List(ctx(t), &v1.ListPodResourcesRequest{}); err == nil {
			ok++
		}
	}
	tick.Stop()
	stop.Close()
	var floodStats string
	for lines.Scan() {
		floodStats = lines.Text()
	}
	flood.Wait()
	fmt.Fprintf(&out, "Polite client (10 List/s) while another process floods: %d/%d succeeded = %.0f%% (goal >= 99%%); flooder: %s\n",
		ok, politeCalls, 100*float64(ok)/politeCalls, floodStats)
	t.Log(out.String())
}

// hostilePod is a pod whose Koordinator annotation lists 6,000 RDMA VFs,
// within the API's 256 KiB for all of a pod's annotations.
func hostilePod(n int) fk.Pod {
	var vfs strings.Builder
	for i := range n {
		if i > 0 {
			vfs.WriteByte(',')
		}
		fmt.Fprintf(&vfs, `{"minor":-1,"busID":"0000:%02x:%02x.%d"}`, 0x10+i/256, (i/8)%32, i%8)
	}
	ann := `{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:0f:00.0","extension":{"vfs":[` + vfs.String() + `]}}]}`
	// Placed by koord-scheduler (any pod may name it), so that the trust
	// gate looks at every VF: the worst case.
	return fk.NewPod("tenant", "hostile", "uid-hostile", byKoord, fk.WithAnnotation(koordKey, ann),
		fk.WithContainer("app", map[string]string{"koordinator.sh/rdma": "1"}), fk.Realistic())
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

func limitsMemoryChild(url string) {
	c, err := kubeletpods.NewClient(kubeletpods.Config{URL: url, Timeout: time.Minute})
	if err == nil {
		var pods []any
		if ps, perr := c.Pods(context.Background()); perr == nil {
			for range ps {
				pods = append(pods, nil)
			}
			fmt.Printf("%d MiB (read %d pods)\n", vmHWMKiB()>>10, len(pods))
			os.Exit(0)
		} else {
			err = perr
		}
	}
	fmt.Println("error:", err)
	os.Exit(1)
}

// limitsFloodChild calls List on socket from 8 goroutines as fast as it
// can until its stdin closes, then prints what it got.
func limitsFloodChild(socket string) {
	h := &harness{t: &testing.T{}, socket: socket}
	c := h.v1()
	var ok, limited atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start := time.Now()
	first := make(chan struct{})
	var once sync.Once
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_, err := c.List(ctx, &v1.ListPodResourcesRequest{})
				switch {
				case err == nil:
					ok.Add(1)
				case status.Code(err) == codes.ResourceExhausted:
					limited.Add(1)
				}
				once.Do(func() { close(first) })
			}
		}()
	}
	<-first
	fmt.Println("flooding")
	io.Copy(io.Discard, os.Stdin)
	cancel()
	wg.Wait()
	secs := time.Since(start).Seconds()
	fmt.Printf("%.0f calls/s, %.0f/s accepted, %.0f%% refused\n", float64(ok.Load()+limited.Load())/secs, float64(ok.Load())/secs,
		100*float64(limited.Load())/float64(ok.Load()+limited.Load()))
	os.Exit(0)
}

func vmHWMKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return -1
}
