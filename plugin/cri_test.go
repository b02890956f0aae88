package plugin

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podres-proxy/podres-proxy/internal/poll"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

func TestNewReconcilerAcceptsUnixURLsAndAbsolutePaths(t *testing.T) {
	store := state.New(state.Options{})
	for endpoint, want := range map[string]string{
		"unix:///run/containerd/containerd.sock": "unix:///run/containerd/containerd.sock",
		"/run/crio/crio.sock":                    "unix:///run/crio/crio.sock",
		"":                                       "",
		"run/containerd/containerd.sock":         "",
		"unix://relative.sock":                   "",
		"tcp://127.0.0.1:1234":                   "",
	} {
		r, err := NewReconciler(store, ReconcilerOptions{Endpoint: endpoint})
		switch {
		case want == "" && err == nil:
			t.Errorf("NewReconciler(%q) succeeded, want an error", endpoint)
		case want != "" && err != nil:
			t.Errorf("NewReconciler(%q): %v", endpoint, err)
		case want != "" && r.target != want:
			t.Errorf("NewReconciler(%q) dials %q, want %q", endpoint, r.target, want)
		}
	}
	if _, err := NewReconciler(nil, ReconcilerOptions{Endpoint: "/run/x.sock"}); err == nil {
		t.Error("NewReconciler(nil store) succeeded, want an error")
	}
}

func TestReconcileOnceRecordsWhatTheRuntimeLists(t *testing.T) {
	store := state.New(state.Options{Decoder: newTestDecoder()})
	// Known before: a pod the runtime no longer has, and a container of a
	// listed pod that is gone.
	gone := k8sPod("gone")
	store.ObserveSandbox(state.OriginNRI, sandbox(gone, true))
	ready := criPod("ready", criv1.PodSandboxState_SANDBOX_READY)
	store.ObserveSandbox(state.OriginNRI, model.Sandbox{ID: ready.Id, UID: ready.Metadata.Uid, Namespace: "default", Name: "ready", Ready: true})
	store.ObserveContainer(state.OriginNRI, model.RuntimeContainer{ID: ready.Id + "-gone", SandboxID: ready.Id, Name: "gone", State: model.ContainerRunning})

	notReady := criPod("notready", criv1.PodSandboxState_SANDBOX_NOTREADY)
	plain := &criv1.PodSandbox{Id: "sb-plain", Metadata: &criv1.PodSandboxMetadata{Name: "plain"}} // no uid: not Kubernetes'
	cri := &fakeCRI{}
	cri.set([]*criv1.PodSandbox{ready, notReady, plain}, []*criv1.Container{
		criCtr(ready, "created", criv1.ContainerState_CONTAINER_CREATED),
		criCtr(ready, "running", criv1.ContainerState_CONTAINER_RUNNING),
		criCtr(ready, "exited", criv1.ContainerState_CONTAINER_EXITED),
		criCtr(ready, "unknown", criv1.ContainerState_CONTAINER_UNKNOWN),
		criCtr(plain, "app", criv1.ContainerState_CONTAINER_RUNNING),
	})
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "cri.sock")
	serveCRI(t, sock, cri)
	r, err := NewReconciler(store, ReconcilerOptions{Endpoint: "unix://" + sock, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}

	for uid, want := range map[string]state.Phase{
		"uid-ready": state.PhaseReady, "uid-notready": state.PhaseStopped, gone.Uid: state.PhaseRemoved,
	} {
		if got := phase(store, uid); got != want {
			t.Errorf("pod %s: phase %q, want %q", uid, got, want)
		}
	}
	for name, want := range map[string]model.ContainerState{
		"created": model.ContainerCreated, "running": model.ContainerRunning,
		"exited": model.ContainerStopped, "unknown": model.ContainerUnknown,
		"gone": model.ContainerRemoved, // CRI lists exited containers: one not listed is gone
	} {
		if got := ctrState(store, "uid-ready", ready.Id+"-"+name); got != want {
			t.Errorf("container %s: state %q, want %q", name, got, want)
		}
	}
	if n := len(store.Records()); n != 3 {
		t.Errorf("store has %d records, want 3 (a sandbox without uid is not a pod):\n%s", n, dump(store))
	}
	rec, _ := store.Get("uid-notready")
	if rec.Name != "notready" || rec.Namespace != "default" || rec.SandboxID != notReady.Id {
		t.Errorf("pod recorded as %s/%s sandbox %s", rec.Namespace, rec.Name, rec.SandboxID)
	}
	if rec.Annotations["example.com/gpu"] != "GPU-notready" {
		t.Errorf("annotations not recorded: %v", rec.Annotations)
	}
	if rec.Provenance.Sandbox == nil || rec.Provenance.Sandbox.Origin != state.OriginCRI {
		t.Errorf("sandbox source %+v, want cri", rec.Provenance.Sandbox)
	}
}

// containerd does not send StopPodSandbox and RemovePodSandbox for pods
// created before it restarted, nor RemoveContainer for containers that had
// exited by then: the store keeps them as running until CRI says otherwise.
func TestCRIReconcileClosesWhatNRIEventsMissed(t *testing.T) {
	store := state.New(state.Options{})
	dir := shortTempDir(t)
	rt := startRuntime(t, dir, nil, nil)
	p := startPlugin(t, store, dir)
	poll.Until(t, "Synchronize", p.Synced)
	rt.waitPlugins(t, 1)

	pod := k8sPod("web")
	ctr := k8sCtr(pod, "app", api.ContainerState_CONTAINER_RUNNING)
	rt.mustSend(t, "RunPodSandbox", pod, nil)
	rt.mustSend(t, "PostCreateContainer", pod, ctr)
	rt.mustSend(t, "PostStartContainer", pod, ctr)
	waitStore(t, store, "container running", func() bool { return ctrState(store, pod.Uid, ctr.Id) == model.ContainerRunning })

	// The pod is stopped without NRI events.
	cri := &fakeCRI{}
	criSandbox := criPod("web", criv1.PodSandboxState_SANDBOX_NOTREADY)
	cri.set([]*criv1.PodSandbox{criSandbox}, []*criv1.Container{criCtr(criSandbox, "app", criv1.ContainerState_CONTAINER_EXITED)})
	sock := filepath.Join(dir, "cri.sock")
	serveCRI(t, sock, cri)
	r, err := NewReconciler(store, ReconcilerOptions{Endpoint: sock, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := phase(store, pod.Uid); got != state.PhaseStopped {
		t.Errorf("pod stopped without events: phase %q after reconcile, want stopped", got)
	}
	if got := ctrState(store, pod.Uid, ctr.Id); got != model.ContainerStopped {
		t.Errorf("container exited without events: state %q after reconcile, want stopped", got)
	}

	// Then it is removed, again without events.
	cri.set(nil, nil)
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := phase(store, pod.Uid); got != state.PhaseRemoved {
		t.Errorf("pod removed without events: phase %q after reconcile, want removed", got)
	}
}

func TestReconcilerRetriesUntilTheCRISocketAppearsAndAfterRestarts(t *testing.T) {
	store := state.New(state.Options{})
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "cri.sock")
	metrics := newTestMetrics()
	r, err := NewReconciler(store, ReconcilerOptions{
		Endpoint: "unix://" + sock, Interval: 10 * time.Millisecond, Timeout: time.Second,
		Log: testLog(), Metrics: metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	}()

	errorsSoFar := func() int { return metrics.get(func(m *testMetrics) int { return m.reconcileErrors }) }
	poll.Until(t, "reconciles failing while there is no runtime", func() bool { return errorsSoFar() >= 2 })

	web := criPod("web", criv1.PodSandboxState_SANDBOX_READY)
	cri := &fakeCRI{}
	cri.set([]*criv1.PodSandbox{web}, nil)
	stop := serveCRI(t, sock, cri)
	waitStore(t, store, "the pod once the runtime is up", func() bool { return phase(store, "uid-web") == state.PhaseReady })

	// The runtime restarts; meanwhile the pod went away.
	stop()
	failed := errorsSoFar()
	poll.Until(t, "a reconcile failing while the runtime is down", func() bool { return errorsSoFar() > failed })
	serveCRI(t, sock, &fakeCRI{})
	waitStore(t, store, "the pod removed after the restart", func() bool { return phase(store, "uid-web") == state.PhaseRemoved })
}

// After a reconnect, Synchronize lists a sandbox that stopped while the
// plugin was away as if it were running (NRI carries no sandbox state).
// OnSynchronized triggering the reconciler closes that window at once
// instead of at the next interval.
func TestResyncTriggersACRIReconcileThatStopsStaleSandboxes(t *testing.T) {
	store := state.New(state.Options{})
	dir := shortTempDir(t)
	pod := k8sPod("web")
	rt := startRuntime(t, dir, []*api.PodSandbox{pod}, nil)

	cri := &fakeCRI{}
	criSandbox := criPod("web", criv1.PodSandboxState_SANDBOX_READY)
	criSandbox.Id, criSandbox.Metadata.Uid = pod.Id, pod.Uid
	cri.set([]*criv1.PodSandbox{criSandbox}, nil)
	sock := filepath.Join(dir, "cri.sock")
	serveCRI(t, sock, cri)
	metrics := newTestMetrics()
	r, err := NewReconciler(store, ReconcilerOptions{Endpoint: sock, Interval: time.Hour, Log: testLog(), Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	p := startPlugin(t, store, dir, func(o *Options) { o.OnSynchronized = r.Trigger })
	poll.Until(t, "Synchronize", p.Synced)
	rt.waitPlugins(t, 1)
	waitStore(t, store, "the pod ready", func() bool { return phase(store, pod.Uid) == state.PhaseReady })
	poll.Until(t, "the first reconciles", func() bool { return metrics.get(func(m *testMetrics) int { return m.reconciles }) >= 2 })

	// The pod stops while the plugin is disconnected; the runtime still
	// lists its sandbox in the next Synchronize.
	cri.set([]*criv1.PodSandbox{func() *criv1.PodSandbox {
		sb := criPod("web", criv1.PodSandboxState_SANDBOX_NOTREADY)
		sb.Id, sb.Metadata.Uid = pod.Id, pod.Uid
		return sb
	}()}, nil)
	p.cut()
	waitStore(t, store, "the stale sandbox stopped by the reconcile the resync triggered", func() bool {
		return phase(store, pod.Uid) == state.PhaseStopped
	})
}
