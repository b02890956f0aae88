package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/podsapitest"
)

// The Get of a pod being created (Multus's, during CNI ADD: the pod is
// admitted, its sandbox not yet started) costs what the proxy must do to
// learn the pod. With the kubelet's Pods API the watch has told the store
// the pod, with its annotations, before the sandbox is created, so the
// Get needs no read; with /pods alone it reads every pod of the node. Both
// proxies are wired as serve wires them (podsapi.Source.Or in front of
// /pods, Providers.Watching), in front of one fake kubelet each, their pod
// sources reached through relays that count the bytes the proxy reads.

// byteRelay forwards every connection made to its listener to target and
// counts the bytes that come back: what the proxy reads from its pod
// source, framing and TLS included.
type byteRelay struct {
	ln     net.Listener
	read   atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

// startRelay listens on network/addr and relays to network/target until
// the test ends.
func startRelay(t testing.TB, network, addr, target string) *byteRelay {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	r := &byteRelay{ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial(network, target)
			if err != nil {
				c.Close()
				continue
			}
			if !r.track(c, up) {
				return
			}
			r.wg.Add(2)
			go func() {
				defer r.wg.Done()
				_, _ = io.Copy(up, c)
				closeWrite(up)
			}()
			go func() {
				defer r.wg.Done()
				// Counted as read from target, before the client can
				// see them: a client that has read them finds them
				// counted.
				_, _ = io.Copy(c, countingReader{up, &r.read})
				closeWrite(c)
			}()
		}
	}()
	t.Cleanup(r.close)
	return r
}

// track records the connections for close; false once the relay is closed.
func (r *byteRelay) track(conns ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	r.conns = append(r.conns, conns...)
	return true
}

func (r *byteRelay) close() {
	r.mu.Lock()
	r.closed = true
	r.ln.Close()
	for _, c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// creationSource is how a creationEnv's proxy learns a pod being created.
type creationSource int

const (
	// watched: from the Pods API, whose watch shows the pod before the
	// Get, as on a node (the kubelet's event comes when it admits the
	// pod, long before the runtime creates its sandbox and calls CNI ADD).
	watched creationSource = iota
	// beforeTheWatch: from the Pods API, the Get asking before the watch
	// shows the pod (its stream stalled): the proxy reads with ListPods.
	beforeTheWatch
	// slashPods: from /pods alone (a kubelet without the Pods API).
	slashPods
)

func (s creationSource) String() string {
	return [...]string{"Pods API, watch first", "Pods API, Get first", "/pods"}[s]
}

// creationEnv is a proxy with n steady pods (every sandbox live, every
// spec known) learning new pods from /pods, or from the Pods API with
// /pods as its fallback.
type creationEnv struct {
	source    creationSource
	h         *harness
	client    v1.PodResourcesListerClient // one connection, as Multus's thick plugin keeps
	api       *podsapitest.Server         // nil: /pods only
	podsRelay *byteRelay
	apiRelay  *byteRelay
	// seen receives the UID of every pod the watch added or deleted,
	// once the store has applied it.
	seen chan string
	// synced is closed at the watch's first sync.
	synced chan struct{}
}

func newCreationEnv(t testing.TB, n int, source creationSource) *creationEnv {
	e := &creationEnv{source: source, seen: make(chan string, 64), synced: make(chan struct{})}
	pods := benchPods(n)
	var syncOnce sync.Once
	wire := func(h *harness) {
		h.providers = append(h.providers, func(p *proxy.Providers) {
			u, err := url.Parse(h.k.PodsURL)
			if err != nil {
				t.Fatal(err)
			}
			e.podsRelay = startRelay(t, "tcp", "127.0.0.1:0", u.Host)
			u.Host = e.podsRelay.ln.Addr().String()
			client, err := kubeletpods.NewClient(kubeletpods.Config{URL: u.String(), TokenFile: h.k.TokenFile, CAFile: h.k.CAFile,
				MaxAnnotationBytes: p.Allocators.MaxAnnotationBytes})
			if err != nil {
				t.Fatal(err)
			}
			p.Pods = client.Pods
			if source == slashPods {
				return
			}
			e.api = podsapitest.New(filepath.Join(h.dir, "pods-api.sock"))
			for i := range pods {
				e.api.Add(&pods[i].Pod) // the watch's first sync brings them
			}
			if err := e.api.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(e.api.Stop)
			relaySock := filepath.Join(h.dir, "pods-api-relay.sock")
			e.apiRelay = startRelay(t, "unix", relaySock, e.api.Socket())
			// As kubeletpods.Watched applies the watch to the store.
			store := p.Store
			src, err := podsapi.New(podsapi.Options{
				Socket:             relaySock,
				MaxAnnotationBytes: p.Allocators.MaxAnnotationBytes,
				Handler: func(ev podsapi.Event) {
					switch ev.Type {
					case podsapi.PodAdded, podsapi.PodModified:
						store.ObserveWatchedPod(ev.Pod)
					case podsapi.PodDeleted:
						store.WatchedPodDeleted(model.PodRef{UID: ev.Pod.UID, Namespace: ev.Pod.Namespace, Name: ev.Pod.Name})
					case podsapi.Synced:
						syncOnce.Do(func() { close(e.synced) })
						return
					default:
						return
					}
					if strings.HasPrefix(ev.Pod.UID, "uid-created-") {
						e.seen <- ev.Pod.UID
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- src.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("Pods API watch: %v", err)
				}
				src.Close()
			})
			p.Pods = src.Or(client.Pods)
			p.Watching = src.Synced
		})
	}
	e.h = newHarness(t, wire)
	e.client = e.h.v1()
	e.h.k.SetPods(pods...)
	if e.api != nil {
		select {
		case <-e.synced:
		case <-time.After(time.Minute):
			t.Fatal("the Pods API watch did not sync")
		}
	}
	// Steady state: the specs are known (a read, or the watch), NRI has
	// recorded every sandbox.
	e.h.list()
	for i, p := range pods {
		e.h.markLive(p, fmt.Sprintf("sandbox-%d", i))
	}
	return e
}

// await waits for the watch to apply the pod's event to the store.
func (e *creationEnv) await(t testing.TB, uid string) {
	t.Helper()
	select {
	case got := <-e.seen:
		if got != uid {
			t.Fatalf("the watch showed %s, want %s", got, uid)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the watch did not show %s", uid)
	}
}

// creationCost is what one Get of a pod being created cost.
type creationCost struct {
	latency                         time.Duration
	podResources, podsReads, listed int64
	bytes                           int64
}

func (e *creationEnv) counters() creationCost {
	c := creationCost{podResources: e.h.k.GRPCCalls(), podsReads: e.h.k.PodsReads(), bytes: e.podsRelay.read.Load()}
	if e.api != nil {
		c.listed = int64(e.api.ListCalls())
		c.bytes += e.apiRelay.read.Load()
	}
	return c
}

// getCreated creates pod i on the kubelet (and in its Pods API), asks the
// proxy for it as Multus does, checks the answer has the pod's GPU, and
// removes the pod again. The costs count from the pod's creation to the
// answer and the watch's event of the pod, whichever comes last; the
// latency is the Get's.
func (e *creationEnv) getCreated(t testing.TB, i int) creationCost {
	t.Helper()
	gpu := fmt.Sprintf("GPU-%08x-0000-4a4a-9b9b-00000000c0de", i)
	p := fk.NewPod("default", fmt.Sprintf("created-%d", i), fmt.Sprintf("uid-created-%d", i), byKoord,
		fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpu)),
		fk.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100"}), fk.Realistic())
	before := e.counters()
	e.h.k.AddPod(p)
	switch e.source {
	case watched:
		e.api.Add(&p.Pod)
		e.await(t, string(p.UID))
	case beforeTheWatch:
		e.api.Stall()
		e.api.Add(&p.Pod)
	}
	start := time.Now()
	resp, err := e.client.Get(context.Background(), &v1.GetPodResourcesRequest{PodNamespace: p.Namespace, PodName: p.Name})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Get %s: %v", p.Name, err)
	}
	if got := devicesOf(resp.GetPodResources(), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpu}) {
		t.Fatalf("Get %s: GPUs %v, want %s", p.Name, got, gpu)
	}
	if e.source == beforeTheWatch {
		e.api.Resume()
		e.await(t, string(p.UID))
	}
	after := e.counters()
	e.h.k.RemovePod(p.Namespace, p.Name)
	if e.api != nil {
		e.api.Delete(&p.Pod)
		e.await(t, string(p.UID))
	}
	return creationCost{
		latency:      took,
		podResources: after.podResources - before.podResources,
		podsReads:    after.podsReads - before.podsReads,
		listed:       after.listed - before.listed,
		bytes:        after.bytes - before.bytes,
	}
}

// podCreationReport measures, for each pod count, rounds Gets of a pod
// being created through each source, interleaved (one of each per round,
// so both share the machine's noise), and prints one table.
func podCreationReport(t *testing.T, sizes []int, rounds int) string {
	var out strings.Builder
	fmt.Fprintf(&out, "\nGet of a pod being created (CNI ADD's: admitted, no sandbox yet), %d Gets per source, interleaved; medians, ms at the 10th/90th percentile, and the median over rounds of the latency ratio within a round:\n", rounds)
	fmt.Fprintf(&out, "| pods | source | Get latency | p10 / p90 | kubelet calls per Get: PodResources, /pods, ListPods | KiB read from the pod source per Get | latency ÷ watch first |\n")
	fmt.Fprintf(&out, "|---:|---|---:|---:|---:|---:|---:|\n")
	for _, n := range sizes {
		var envs []*creationEnv
		for _, s := range []creationSource{watched, beforeTheWatch, slashPods} {
			envs = append(envs, newCreationEnv(t, n, s))
		}
		costs := make([][]creationCost, len(envs))
		for r := range rounds {
			for i, e := range envs {
				costs[i] = append(costs[i], e.getCreated(t, r))
			}
		}
		lat := make([][]float64, len(envs))
		for i := range envs {
			for _, c := range costs[i] {
				lat[i] = append(lat[i], float64(c.latency))
			}
		}
		for i, e := range envs {
			var calls [3]int64
			var bytes int64
			for _, c := range costs[i] {
				calls[0] += c.podResources
				calls[1] += c.podsReads
				calls[2] += c.listed
				bytes += c.bytes
			}
			per := func(v int64) float64 { return float64(v) / float64(rounds) }
			ratio := ""
			if i > 0 {
				// Within a round, so that the Gets share the
				// machine's load of the moment.
				var ratios []float64
				for r := range rounds {
					ratios = append(ratios, lat[i][r]/lat[0][r])
				}
				ratio = fmt.Sprintf("%.1fx", median(ratios))
			}
			fmt.Fprintf(&out, "| %d | %s | %.2f ms | %.2f / %.2f | %.2f, %.2f, %.2f | %.1f | %s |\n", n, e.source,
				median(lat[i])/1e6, percentile(lat[i], 10)/1e6, percentile(lat[i], 90)/1e6,
				per(calls[0]), per(calls[1]), per(calls[2]), per(bytes)/1024, ratio)
		}
	}
	return out.String()
}

// TestPodCreationBenchmarkReport prints the table of podCreationReport
// alone (TestBenchmarkReport prints it too):
// `PODRES_BENCH=1 go test -count=1 -run '^TestPodCreationBenchmarkReport$' -v ./proxy`.
func TestPodCreationBenchmarkReport(t *testing.T) {
	if os.Getenv("PODRES_BENCH") == "" {
		t.Skip("set PODRES_BENCH=1 to run the benchmark report")
	}
	sizes, rounds := podCreationSizes()
	t.Log(podCreationReport(t, sizes, rounds))
}

// podCreationSizes are the pod counts and rounds of the pod creation
// table: 110 (the kubelet's default maxPods) and 250, 101 Gets per
// source; 10 pods and 3 Gets for PODRES_BENCH=quick.
func podCreationSizes() ([]int, int) {
	if os.Getenv("PODRES_BENCH") == "quick" {
		return []int{10}, 3
	}
	return []int{110, 250}, 101
}
