package proxy_test

import (
	"cmp"
	"context"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/trust"
)

const (
	koordKey = "scheduling.koordinator.sh/device-allocated"
	gpuUUID  = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	gpuUUID2 = "GPU-2c1b5e0f-0000-4a4a-9b9b-123456789abc"
	gpuUUID3 = "GPU-7f3e1d2c-1111-4b4b-8c8c-abcdef012345"
	vfAddr   = "0000:01:00.2"
	pfAddr   = "0000:01:00.0"

	// A GPU and an RDMA VF, jointly allocated, as koord-scheduler writes it.
	gpuAndVF = `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"23040Mi","koordinator.sh/gpu-memory-ratio":"100"},"id":"` + gpuUUID + `"}],` +
		`"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"` + pfAddr + `","extension":{"vfs":[{"minor":-1,"busID":"` + vfAddr + `"}]}}]}`
	oneGPU  = `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"` + gpuUUID + `"}]}`
	twoGPUs = `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"` + gpuUUID + `"},{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"},"id":"` + gpuUUID2 + `"}]}`
)

// harness is a proxy in front of a fake kubelet.
type harness struct {
	t         testing.TB
	dir       string
	k         *fakekubelet.Kubelet
	store     *state.Store
	srv       *proxy.Server
	socket    string
	reg       *prometheus.Registry
	logs      *test.Hook
	inv       func() *inventory.Snapshot
	qps       float64
	burst     int
	noKubelet bool
	trustOpts trust.GateOptions // withSchedulerNames
	maxConns  int
	perClient int // withMaxConnectionsPerClient; else the total cap
	reqTime   time.Duration
	idle      time.Duration
	stopped   chan struct{}
	cancel    context.CancelFunc
	providers []func(*proxy.Providers) // withProviders
	// views are the sockets of the views withViews asked for, by view;
	// socket serves the default one.
	views map[merge.View]string
}

type option func(*harness)

// settledClock is podlogs.Settle and a second ahead of the real clock: a
// pod logs stamp it takes is settled whenever the test took it.
type settledClock struct{}

func (settledClock) Now() time.Time                    { return time.Now().Add(podlogs.Settle + time.Second) }
func (c settledClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

func withRateLimit(qps float64, burst int) option {
	return func(h *harness) { h.qps, h.burst = qps, burst }
}

// withSchedulerNames sets, per allocator, the scheduler names whose pods
// the trust gate believes its annotations on (without it: the defaults,
// koord-scheduler for Koordinator and so on), as serve's
// --<allocator>-scheduler-names flags do.
func withSchedulerNames(names map[string][]string) option {
	return func(h *harness) { h.trustOpts.SchedulerNames = names }
}

// withMaxConnections caps the proxy's client connections.
func withMaxConnections(n int) option { return func(h *harness) { h.maxConns = n } }

// withMaxConnectionsPerClient caps one process's connections at n. Without
// it the harness's cap per process is the total cap: its tests play many
// clients from one process, and each h.conn() is a connection of its own
// until the test ends.
func withMaxConnectionsPerClient(n int) option { return func(h *harness) { h.perClient = n } }

// withRequestTimeout sets the deadline the proxy gives every call.
func withRequestTimeout(d time.Duration) option { return func(h *harness) { h.reqTime = d } }

// withIdleTimeout sets after how long the proxy closes an idle connection.
func withIdleTimeout(d time.Duration) option { return func(h *harness) { h.idle = d } }

// withoutKubelet starts the proxy while the kubelet's socket does not exist.
func withoutKubelet() option { return func(h *harness) { h.noKubelet = true } }

// withInventory gives the proxy an inventory of these devices.
func withInventory(devs ...inventory.Device) option {
	snap := inventory.NewSnapshot(devs)
	return func(h *harness) {
		h.inv = func() *inventory.Snapshot { return snap }
	}
}

// withChangingInventory gives the proxy the inventory *cur holds at each
// query, as serve's inventory swaps snapshots when a source changes.
func withChangingInventory(cur *atomic.Pointer[inventory.Snapshot]) option {
	return func(h *harness) {
		h.inv = cur.Load
	}
}

// withViews serves each view on a socket of its own (h.views), besides
// the default view on h.socket, as serve's --view flags do.
func withViews(views ...merge.View) option {
	return func(h *harness) {
		if h.views == nil {
			h.views = map[merge.View]string{}
		}
		for _, v := range views {
			h.views[v] = filepath.Join(h.dir, string(v), "kubelet.sock")
		}
	}
}

// withProviders edits what the proxy is built with before it is built.
func withProviders(f func(*proxy.Providers)) option {
	return func(h *harness) { h.providers = append(h.providers, f) }
}

// shortDir returns a directory whose paths fit a unix socket name.
func shortDir(t testing.TB) string {
	dir, err := os.MkdirTemp("", "prp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func newHarness(t testing.TB, opts ...option) *harness {
	t.Helper()
	dir := shortDir(t)
	h := &harness{t: t, dir: dir, reg: prometheus.NewRegistry(), socket: filepath.Join(dir, "proxy", "kubelet.sock")}
	for _, o := range opts {
		o(h)
	}
	var views []proxy.ViewSocket
	for v, path := range h.views {
		views = append(views, proxy.ViewSocket{View: v, Socket: path})
	}
	h.k = fakekubelet.Start(t, dir)
	if h.noKubelet {
		h.k.StopGRPC()
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	h.logs = test.NewLocal(log)
	m := metrics.New(h.reg)
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set := allocator.NewSet(log, m, decoders...)
	// The proxy vets devices as serve's does: no production proxy runs
	// without the trust gate, so no test does either.
	h.trustOpts.Log, h.trustOpts.Metrics = log, m
	gate := trust.NewGate(set, h.trustOpts)
	h.store = state.New(state.Options{Decoder: set})
	client, err := kubeletpods.NewClient(kubeletpods.Config{URL: h.k.PodsURL, TokenFile: h.k.TokenFile, CAFile: h.k.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	// The fake kubelet's pod logs directory, as serve's default reads the
	// kubelet's; its stamps are taken podlogs.Settle after its changes, so
	// that no test waits for that.
	providers := proxy.Providers{Store: h.store, Pods: client.Pods, PodLogs: podlogs.New(h.k.PodLogsDir, settledClock{}),
		Allocators: set, Inventory: h.inv, Trust: gate, Metrics: m}
	for _, f := range h.providers {
		f(&providers)
	}
	h.srv, err = proxy.New(proxy.Config{
		Socket:                  h.socket,
		Views:                   views,
		KubeletSocket:           h.k.Socket,
		RateLimitQPS:            h.qps,
		RateLimitBurst:          h.burst,
		MaxConnections:          h.maxConns,
		MaxConnectionsPerClient: cmp.Or(h.perClient, h.maxConns, limits.DefaultMaxConnections),
		RequestTimeout:          h.reqTime,
		IdleTimeout:             h.idle,
		Log:                     log,
	}, providers)
	if err != nil {
		t.Fatal(err)
	}
	h.start()
	return h
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.stopped = make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		defer close(h.stopped)
		errc <- h.srv.Serve(ctx)
	}()
	h.t.Cleanup(h.stop)
	poll.Until(h.t, "the proxy to be ready", func() bool {
		select {
		case err := <-errc:
			h.t.Fatalf("proxy stopped at start: %v", err)
		default:
		}
		return h.srv.Ready()
	})
}

func (h *harness) stop() {
	h.cancel()
	<-h.stopped
}

func (h *harness) conn() *grpc.ClientConn {
	h.t.Helper()
	return h.connTo(h.socket)
}

// connTo is conn to another of the proxy's sockets (h.views).
func (h *harness) connTo(socket string) *grpc.ClientConn {
	h.t.Helper()
	c, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

func (h *harness) v1() v1.PodResourcesListerClient { return v1.NewPodResourcesListerClient(h.conn()) }
func (h *harness) v1alpha1() v1alpha1.PodResourcesListerClient {
	return v1alpha1.NewPodResourcesListerClient(h.conn())
}

func (h *harness) list() *v1.ListPodResourcesResponse {
	h.t.Helper()
	resp, err := h.v1().List(ctx(h.t), &v1.ListPodResourcesRequest{})
	if err != nil {
		h.t.Fatalf("List: %v", err)
	}
	return resp
}

func (h *harness) get(ns, name string) *v1.PodResources {
	h.t.Helper()
	resp, err := h.v1().Get(ctx(h.t), &v1.GetPodResourcesRequest{PodNamespace: ns, PodName: name})
	if err != nil {
		h.t.Fatalf("Get %s/%s: %v", ns, name, err)
	}
	return resp.GetPodResources()
}

// markLive records the pod's sandbox as NRI would at RunPodSandbox.
func (h *harness) markLive(p fakekubelet.Pod, sandboxID string) {
	h.store.ObserveSandbox(record.OriginNRI, model.Sandbox{
		ID: sandboxID, UID: string(p.UID), Namespace: p.Namespace, Name: p.Name,
		Annotations: p.Annotations, Ready: true,
	})
}

func (h *harness) counter(name string, labels ...string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			ok := true
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				ok = ok && found
			}
			if ok && m.Histogram != nil {
				return float64(m.GetHistogram().GetSampleCount())
			}
			if ok {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// devicesOf returns resource -> ids of a container, in answer order.
func devicesOf(pod *v1.PodResources, container string) map[string][]string {
	out := map[string][]string{}
	for _, c := range pod.GetContainers() {
		if c.GetName() != container {
			continue
		}
		for _, d := range c.GetDevices() {
			out[d.GetResourceName()] = append(out[d.GetResourceName()], d.GetDeviceIds()...)
		}
	}
	return out
}

func findPod(resp *v1.ListPodResourcesResponse, ns, name string) *v1.PodResources {
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() == ns && p.GetName() == name {
			return p
		}
	}
	return nil
}

// byKoord places a pod by koord-scheduler, the scheduler whose Koordinator
// annotations the trust gate believes by default: a pod of any other
// scheduler gets none of its annotated devices.
var byKoord = fakekubelet.WithSchedulerName("koord-scheduler")

// koordApp is the app container "app" asking for what the tests' Koordinator
// annotations allocate (whole GPUs, an RDMA VF), as a pod the scheduler
// allocated them to does: the trust gate believes devices only on a pod
// some container of which requests them.
var koordApp = fakekubelet.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "1"})

// byHAMi places a pod by hami-scheduler, whose annotations the trust gate
// believes by default.
var byHAMi = fakekubelet.WithSchedulerName("hami-scheduler")
