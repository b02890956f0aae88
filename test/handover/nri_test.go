package handover

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/sirupsen/logrus"
)

// runtime is the container runtime's side of NRI: nri's own adaptation on
// a real socket, which both instances' plugins dial as they dial
// containerd's. Each event is relayed as containerd relays it, holding off
// a plugin's Synchronize meanwhile (BlockPluginSync), and a plugin that
// connects is sent every sandbox and container that exists then. Every
// event's round trip, from the runtime's wish to relay it to the
// adaptation's return (what a container's start waits for), is kept.
type runtime struct {
	socket  string
	nri     *adaptation.Adaptation
	plugins atomic.Int64 // plugins registered

	mu     sync.Mutex
	pods   map[string]*api.PodSandbox // by sandbox id
	ctrs   map[string]*api.Container  // by container id
	events []event
}

// event is one relayed event's round trip.
type event struct {
	name       string
	pod        string
	start, end time.Time
	err        error
}

func (e event) took() time.Duration { return e.end.Sub(e.start) }

func startRuntime(t *testing.T, dir string) *runtime {
	t.Helper()
	logrus.SetLevel(logrus.ErrorLevel) // the adaptation logs every plugin through logrus
	r := &runtime{socket: filepath.Join(dir, "nri.sock"), pods: map[string]*api.PodSandbox{}, ctrs: map[string]*api.Container{}}
	nri, err := adaptation.New("handover-runtime", "v0.0.1", r.synchronize,
		func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil },
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		adaptation.WithSocketPath(r.socket),
		adaptation.WithMetrics(runtimeMetrics{r}))
	if err != nil {
		t.Fatal(err)
	}
	if err := nri.Start(); err != nil {
		t.Fatal(err)
	}
	r.nri = nri
	t.Cleanup(nri.Stop)
	return r
}

// synchronize sends a connecting plugin what runs now.
func (r *runtime) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
	r.mu.Lock()
	pods := make([]*api.PodSandbox, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	ctrs := make([]*api.Container, 0, len(r.ctrs))
	for _, c := range r.ctrs {
		ctrs = append(ctrs, c)
	}
	r.mu.Unlock()
	_, err := cb(ctx, pods, ctrs)
	return err
}

// relay changes what runs with change and relays the event, both while no
// plugin synchronizes, and keeps its round trip.
func (r *runtime) relay(ctx context.Context, name string, pod *api.PodSandbox, change func(), send func(context.Context) error) {
	start := time.Now()
	block := r.nri.BlockPluginSync()
	defer block.Unblock()
	r.mu.Lock()
	change()
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := send(ctx)
	end := time.Now()
	r.mu.Lock()
	r.events = append(r.events, event{name: name, pod: pod.Name, start: start, end: end, err: err})
	r.mu.Unlock()
}

// relayedSince is the number of events that began at or after t.
func (r *runtime) relayedSince(t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if !e.start.Before(t) {
			n++
		}
	}
	return n
}

// log is every event relayed so far.
func (r *runtime) log() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// runSandbox starts a pod's sandbox and its one container.
func (r *runtime) runSandbox(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	r.relay(ctx, "RunPodSandbox", pod, func() { r.pods[pod.Id] = pod }, func(ctx context.Context) error {
		return r.nri.RunPodSandbox(ctx, &api.RunPodSandboxRequest{Pod: pod})
	})
	created := withState(ctr, api.ContainerState_CONTAINER_CREATED)
	r.relay(ctx, "PostCreateContainer", pod, func() { r.ctrs[ctr.Id] = created }, func(ctx context.Context) error {
		return r.nri.PostCreateContainer(ctx, &api.PostCreateContainerRequest{Pod: pod, Container: created})
	})
	running := withState(ctr, api.ContainerState_CONTAINER_RUNNING)
	r.relay(ctx, "PostStartContainer", pod, func() { r.ctrs[ctr.Id] = running }, func(ctx context.Context) error {
		return r.nri.PostStartContainer(ctx, &api.PostStartContainerRequest{Pod: pod, Container: running})
	})
}

// stopSandbox stops a pod's container and its sandbox.
func (r *runtime) stopSandbox(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	stopped := withState(ctr, api.ContainerState_CONTAINER_STOPPED)
	r.relay(ctx, "StopContainer", pod, func() { r.ctrs[ctr.Id] = stopped }, func(ctx context.Context) error {
		_, err := r.nri.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: stopped})
		return err
	})
	r.relay(ctx, "StopPodSandbox", pod, func() {}, func(ctx context.Context) error {
		return r.nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod})
	})
}

// removeSandbox removes a stopped pod's container and sandbox.
func (r *runtime) removeSandbox(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	stopped := withState(ctr, api.ContainerState_CONTAINER_STOPPED)
	r.relay(ctx, "RemoveContainer", pod, func() { delete(r.ctrs, ctr.Id) }, func(ctx context.Context) error {
		return r.nri.RemoveContainer(ctx, &api.RemoveContainerRequest{Pod: pod, Container: stopped})
	})
	r.relay(ctx, "RemovePodSandbox", pod, func() { delete(r.pods, pod.Id) }, func(ctx context.Context) error {
		return r.nri.RemovePodSandbox(ctx, &api.RemovePodSandboxRequest{Pod: pod})
	})
}

func withState(c *api.Container, st api.ContainerState) *api.Container {
	return &api.Container{Id: c.Id, PodSandboxId: c.PodSandboxId, Name: c.Name, State: st}
}

// sandboxOf is the sandbox and container the runtime starts for a pod.
func sandboxOf(namespace, name, uid string, annotations map[string]string) (*api.PodSandbox, *api.Container) {
	id := fmt.Sprintf("sb-%s", uid)
	return &api.PodSandbox{Id: id, Uid: uid, Namespace: namespace, Name: name, Annotations: annotations},
		&api.Container{Id: id + "-app", PodSandboxId: id, Name: "app"}
}

// runtimeMetrics tells the runtime how many plugins are registered.
type runtimeMetrics struct{ r *runtime }

func (m runtimeMetrics) RecordPluginInvocation(string, string, error)      {}
func (m runtimeMetrics) RecordPluginLatency(string, string, time.Duration) {}
func (m runtimeMetrics) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {
}
func (m runtimeMetrics) UpdatePluginCount(n int) { m.r.plugins.Store(int64(n)) }
