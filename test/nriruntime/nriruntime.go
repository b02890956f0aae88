// Package nriruntime is the container runtime's side of NRI for tests that
// run serve as a process: nri's own adaptation on a real socket, which
// serve's plugin dials as it dials containerd's. Each event is relayed as
// containerd relays it, holding off a plugin's Synchronize meanwhile
// (BlockPluginSync), and a plugin that connects is sent every sandbox and
// container that exists then. Every event's round trip, from the runtime's
// wish to relay it to the adaptation's return (what a container's start
// waits for), is kept.
package nriruntime

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

// Runtime relays a test's pods to the plugins registered on its socket.
type Runtime struct {
	// Socket is the NRI socket, serve's --nri-socket.
	Socket string

	nri     *adaptation.Adaptation
	plugins atomic.Int64 // plugins registered

	mu     sync.Mutex
	pods   map[string]*api.PodSandbox // by sandbox id
	ctrs   map[string]*api.Container  // by container id
	events []Event
}

// Event is one relayed event's round trip. Err is a plugin's failure of
// it: the runtime's loss, not the pod's, as containerd goes on.
type Event struct {
	Name       string
	Pod        string
	Start, End time.Time
	Err        error
}

// Took is the event's round trip.
func (e Event) Took() time.Duration { return e.End.Sub(e.Start) }

// Start starts a runtime named name with its socket and plugin directories
// in dir; the test's end stops it.
func Start(t testing.TB, dir, name string) *Runtime {
	t.Helper()
	logrus.SetLevel(logrus.ErrorLevel) // the adaptation logs every plugin through logrus
	r := &Runtime{Socket: filepath.Join(dir, "nri.sock"), pods: map[string]*api.PodSandbox{}, ctrs: map[string]*api.Container{}}
	nri, err := adaptation.New(name, "v0.0.1", r.synchronize,
		func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil },
		adaptation.WithPluginPath(filepath.Join(dir, "plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(dir, "conf.d")),
		adaptation.WithSocketPath(r.Socket),
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

// Plugins is the number of plugins registered now.
func (r *Runtime) Plugins() int64 { return r.plugins.Load() }

// synchronize sends a connecting plugin what runs now.
func (r *Runtime) synchronize(ctx context.Context, cb adaptation.SyncCB) error {
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
func (r *Runtime) relay(ctx context.Context, name string, pod *api.PodSandbox, change func(), send func(context.Context) error) {
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
	r.events = append(r.events, Event{Name: name, Pod: pod.Name, Start: start, End: end, Err: err})
	r.mu.Unlock()
}

// RelayedSince is the number of events that began at or after t.
func (r *Runtime) RelayedSince(t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if !e.Start.Before(t) {
			n++
		}
	}
	return n
}

// Failed is the number of events a plugin failed so far.
func (r *Runtime) Failed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Err != nil {
			n++
		}
	}
	return n
}

// Log is every event relayed so far.
func (r *Runtime) Log() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// RunSandbox starts a pod's sandbox and its one container.
func (r *Runtime) RunSandbox(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
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

// StopSandbox stops a pod's container and its sandbox.
func (r *Runtime) StopSandbox(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
	stopped := withState(ctr, api.ContainerState_CONTAINER_STOPPED)
	r.relay(ctx, "StopContainer", pod, func() { r.ctrs[ctr.Id] = stopped }, func(ctx context.Context) error {
		_, err := r.nri.StopContainer(ctx, &api.StopContainerRequest{Pod: pod, Container: stopped})
		return err
	})
	r.relay(ctx, "StopPodSandbox", pod, func() {}, func(ctx context.Context) error {
		return r.nri.StopPodSandbox(ctx, &api.StopPodSandboxRequest{Pod: pod})
	})
}

// RemoveSandbox removes a stopped pod's container and sandbox.
func (r *Runtime) RemoveSandbox(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) {
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

// SandboxOf is the sandbox and the one container ("app") the runtime starts
// for a pod.
func SandboxOf(namespace, name, uid string, annotations map[string]string) (*api.PodSandbox, *api.Container) {
	id := fmt.Sprintf("sb-%s", uid)
	return &api.PodSandbox{Id: id, Uid: uid, Namespace: namespace, Name: name, Annotations: annotations},
		&api.Container{Id: id + "-app", PodSandboxId: id, Name: "app"}
}

// runtimeMetrics tells the runtime how many plugins are registered.
type runtimeMetrics struct{ r *Runtime }

func (m runtimeMetrics) RecordPluginInvocation(string, string, error)      {}
func (m runtimeMetrics) RecordPluginLatency(string, string, time.Duration) {}
func (m runtimeMetrics) RecordPluginAdjustments(string, string, *api.ContainerAdjustment, int, int) {
}
func (m runtimeMetrics) UpdatePluginCount(n int) { m.r.plugins.Store(int64(n)) }
