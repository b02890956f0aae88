package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

var quietOnce sync.Once

// quietNRI silences the NRI runtime side, which logs through logrus's
// standard logger.
func quietNRI() {
	quietOnce.Do(func() { logrus.SetLevel(logrus.ErrorLevel) })
}

func testLog() logrus.FieldLogger {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	return l
}

// shortTempDir returns a directory for unix sockets: t.TempDir's paths can
// exceed the 108 bytes a socket path may have.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func k8sPod(name string) *api.PodSandbox {
	return &api.PodSandbox{
		Id:          "sb-" + name,
		Uid:         "uid-" + name,
		Namespace:   "default",
		Name:        name,
		Annotations: map[string]string{"example.com/gpu": "GPU-" + name, "unrelated": "x"},
	}
}

func k8sCtr(pod *api.PodSandbox, name string, st api.ContainerState) *api.Container {
	return &api.Container{Id: pod.Id + "-" + name, PodSandboxId: pod.Id, Name: name, State: st}
}

// fakeRuntime is the runtime side of NRI, nri's own adaptation, serving a
// real socket. Synchronize sends whatever set last put in.
type fakeRuntime struct {
	nri   *adaptation.Adaptation
	stats *runtimeStats

	mu   sync.Mutex
	pods []*api.PodSandbox
	ctrs []*api.Container

	stopOnce sync.Once
}

func startRuntime(t testing.TB, dir string, pods []*api.PodSandbox, ctrs []*api.Container) *fakeRuntime {
	t.Helper()
	quietNRI()
	r := &fakeRuntime{stats: &runtimeStats{}, pods: pods, ctrs: ctrs}
	nri, err := adaptation.New("fake-runtime", "v0.0.1", r.synchronize,
		func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil },
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		adaptation.WithSocketPath(filepath.Join(dir, "nri.sock")),
		adaptation.WithMetrics(r.stats))
	if err != nil {
		t.Fatal(err)
	}
	if err := nri.Start(); err != nil {
		t.Fatal(err)
	}
	r.nri = nri
	t.Cleanup(r.stop)
	return r
}

// stop stops listening, as a runtime going down would. Connected plugins
// stay connected: the adaptation does not close them.
func (r *fakeRuntime) stop() { r.stopOnce.Do(r.nri.Stop) }

func (r *fakeRuntime) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
	r.mu.Lock()
	pods, ctrs := r.pods, r.ctrs
	r.mu.Unlock()
	_, err := cb(ctx, pods, ctrs)
	return err
}

// send relays one event to the plugins as containerd does, holding off
// plugin synchronization meanwhile, and returns how long it took.
func (r *fakeRuntime) send(ctx context.Context, event string, pod *api.PodSandbox, ctr *api.Container) (time.Duration, error) {
	block := r.nri.BlockPluginSync()
	defer block.Unblock()
	start := time.Now()
	var err error
	switch event {
	case "RunPodSandbox":
		err = r.nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod})
	case "StopPodSandbox":
		err = r.nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod})
	case "RemovePodSandbox":
		err = r.nri.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod})
	case "PostCreateContainer":
		err = r.nri.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: ctr})
	case "PostStartContainer":
		err = r.nri.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: ctr})
	case "StopContainer":
		_, err = r.nri.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: ctr})
	case "RemoveContainer":
		err = r.nri.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: ctr})
	default:
		panic("unknown event " + event)
	}
	return time.Since(start), err
}

func (r *fakeRuntime) mustSend(t testing.TB, event string, pod *api.PodSandbox, ctr *api.Container) {
	t.Helper()
	if _, err := r.send(context.Background(), event, pod, ctr); err != nil {
		t.Fatalf("%s: %v", event, err)
	}
}

func (r *fakeRuntime) waitPlugins(t testing.TB, n int) {
	t.Helper()
	poll.Until(t, "the runtime to register the plugin", func() bool { return r.stats.pluginCount() == n })
}

// runtimeStats is the adaptation's view of its plugins.
type runtimeStats struct {
	mu       sync.Mutex
	plugins  int
	names    map[string]bool
	failures []string
}

func (s *runtimeStats) RecordPluginInvocation(name, op string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.names == nil {
		s.names = map[string]bool{}
	}
	s.names[name] = true
	if err != nil {
		s.failures = append(s.failures, name+" "+op+": "+err.Error())
	}
}

func (s *runtimeStats) RecordPluginLatency(string, string, time.Duration) {}

func (s *runtimeStats) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {
}

func (s *runtimeStats) UpdatePluginCount(n int) {
	s.mu.Lock()
	s.plugins = n
	s.mu.Unlock()
}

func (s *runtimeStats) pluginCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plugins
}

func (s *runtimeStats) failed() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.failures...)
}

func (s *runtimeStats) saw(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[name]
}

// testMetrics records what the plugin reports.
type testMetrics struct {
	mu              sync.Mutex
	events          map[string]int
	took            []time.Duration
	disconnects     int
	reconnects      int
	reconciles      int
	reconcileErrors int
}

func newTestMetrics() *testMetrics {
	return &testMetrics{events: map[string]int{}}
}

func (m *testMetrics) NRIEvent(name string, took time.Duration) {
	m.mu.Lock()
	m.events[name]++
	m.took = append(m.took, took)
	m.mu.Unlock()
}

func (m *testMetrics) NRIConnected(up bool) {
	m.mu.Lock()
	if !up {
		m.disconnects++
	}
	m.mu.Unlock()
}

func (m *testMetrics) NRIReconnect() {
	m.mu.Lock()
	m.reconnects++
	m.mu.Unlock()
}

func (m *testMetrics) CRIReconciled(_ time.Duration, err error) {
	m.mu.Lock()
	m.reconciles++
	if err != nil {
		m.reconcileErrors++
	}
	m.mu.Unlock()
}

func (m *testMetrics) get(f func(m *testMetrics) int) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return f(m)
}

// runningPlugin is a Plugin whose Run is going, with its connections to
// the runtime captured so a test can cut them like a runtime crash would.
type runningPlugin struct {
	*Plugin
	metrics *testMetrics

	mu    sync.Mutex
	conns []net.Conn
}

// startPlugin runs a plugin on the runtime whose socket is in dir; tweaks
// adjust its options.
func startPlugin(t testing.TB, store *state.Store, dir string, tweaks ...func(*Options)) *runningPlugin {
	t.Helper()
	rp := &runningPlugin{metrics: newTestMetrics()}
	opts := Options{
		Socket:     filepath.Join(dir, "nri.sock"),
		Name:       "podres-proxy",
		Index:      "90",
		Log:        testLog(),
		MinBackoff: 10 * time.Millisecond,
		MaxBackoff: 100 * time.Millisecond,
		Metrics:    rp.metrics,
	}
	for _, tweak := range tweaks {
		tweak(&opts)
	}
	p, err := New(store, opts)
	if err != nil {
		t.Fatal(err)
	}
	p.stubOptions = []stub.Option{stub.WithDialer(rp.dial)}
	rp.Plugin = p
	runPlugin(t, p)
	return rp
}

// runPlugin runs p until the test ends and checks that Run then returns nil.
func runPlugin(t testing.TB, p *Plugin) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return after cancel")
		}
	})
}

func (rp *runningPlugin) dial(path string) (net.Conn, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	rp.mu.Lock()
	rp.conns = append(rp.conns, c)
	rp.mu.Unlock()
	return c, nil
}

// cut closes the plugin's connections, as a runtime crash would.
func (rp *runningPlugin) cut() {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	for _, c := range rp.conns {
		c.Close()
	}
	rp.conns = nil
}
