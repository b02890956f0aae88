package plugin

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/critest"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/statetest"
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
		r, err := NewReconciler(store, CRIOptions{Endpoint: endpoint})
		switch {
		case want == "" && err == nil:
			t.Errorf("NewReconciler(%q) succeeded, want an error", endpoint)
		case want != "" && err != nil:
			t.Errorf("NewReconciler(%q): %v", endpoint, err)
		case want != "" && r.target != want:
			t.Errorf("NewReconciler(%q) dials %q, want %q", endpoint, r.target, want)
		}
	}
	if _, err := NewReconciler(nil, CRIOptions{Endpoint: "/run/x.sock"}); err == nil {
		t.Error("NewReconciler(nil store) succeeded, want an error")
	}
}

func TestReconcileOnceRecordsWhatTheRuntimeLists(t *testing.T) {
	store := state.New(state.Options{Decoder: statetest.NewDecoder()})
	// Known before: a pod the runtime no longer has, and a container of a
	// listed pod that is gone.
	gone := model.Sandbox{ID: "sb-gone", UID: "uid-gone", Namespace: "default", Name: "gone", Ready: true}
	store.ObserveSandbox(record.OriginNRI, gone)
	ready := critest.Pod("ready", criv1.PodSandboxState_SANDBOX_READY)
	store.ObserveSandbox(record.OriginNRI, model.Sandbox{ID: ready.Id, UID: ready.Metadata.Uid, Namespace: "default", Name: "ready", Ready: true})
	store.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: ready.Id + "-gone", SandboxID: ready.Id, Name: "gone", State: model.ContainerRunning})

	notReady := critest.Pod("notready", criv1.PodSandboxState_SANDBOX_NOTREADY)
	plain := &criv1.PodSandbox{Id: "sb-plain", Metadata: &criv1.PodSandboxMetadata{Name: "plain"}} // no uid: not Kubernetes'
	rt := &critest.Runtime{}
	rt.Set([]*criv1.PodSandbox{ready, notReady, plain}, []*criv1.Container{
		critest.Ctr(ready, "created", criv1.ContainerState_CONTAINER_CREATED),
		critest.Ctr(ready, "running", criv1.ContainerState_CONTAINER_RUNNING),
		critest.Ctr(ready, "exited", criv1.ContainerState_CONTAINER_EXITED),
		critest.Ctr(ready, "unknown", criv1.ContainerState_CONTAINER_UNKNOWN),
		critest.Ctr(plain, "app", criv1.ContainerState_CONTAINER_RUNNING),
	})
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "cri.sock")
	critest.Serve(t, sock, rt)
	r, err := NewReconciler(store, CRIOptions{Endpoint: "unix://" + sock, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}

	for uid, want := range map[string]record.Phase{
		"uid-ready": record.PhaseReady, "uid-notready": record.PhaseStopped, gone.UID: record.PhaseRemoved,
	} {
		if got := statetest.Phase(store, uid); got != want {
			t.Errorf("pod %s: phase %q, want %q", uid, got, want)
		}
	}
	for name, want := range map[string]model.ContainerState{
		"created": model.ContainerCreated, "running": model.ContainerRunning,
		"exited": model.ContainerStopped, "unknown": model.ContainerUnknown,
		"gone": model.ContainerRemoved, // CRI lists exited containers: one not listed is gone
	} {
		if got := statetest.ContainerState(store, "uid-ready", ready.Id+"-"+name); got != want {
			t.Errorf("container %s: state %q, want %q", name, got, want)
		}
	}
	if n := len(store.Records()); n != 3 {
		t.Errorf("store has %d records, want 3 (a sandbox without uid is not a pod):\n%s", n, statetest.Dump(store))
	}
	rec, _ := store.Get("uid-notready")
	if rec.Name != "notready" || rec.Namespace != "default" || rec.SandboxID != notReady.Id {
		t.Errorf("pod recorded as %s/%s sandbox %s", rec.Namespace, rec.Name, rec.SandboxID)
	}
	if rec.Annotations["example.com/gpu"] != "GPU-notready" {
		t.Errorf("annotations not recorded: %v", rec.Annotations)
	}
	if rec.Provenance.Sandbox == nil || rec.Provenance.Sandbox.Origin != record.OriginCRI {
		t.Errorf("sandbox source %+v, want cri", rec.Provenance.Sandbox)
	}
}

func TestReconcilerRetriesUntilTheCRISocketAppearsAndAfterRestarts(t *testing.T) {
	store := state.New(state.Options{})
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "cri.sock")
	metrics := newTestMetrics()
	r, err := NewReconciler(store, CRIOptions{
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

	web := critest.Pod("web", criv1.PodSandboxState_SANDBOX_READY)
	rt := &critest.Runtime{}
	rt.Set([]*criv1.PodSandbox{web}, nil)
	stop := critest.Serve(t, sock, rt)
	statetest.Wait(t, store, "the pod once the runtime is up", func() bool { return statetest.Phase(store, "uid-web") == record.PhaseReady })

	// The runtime restarts; meanwhile the pod went away.
	stop()
	failed := errorsSoFar()
	poll.Until(t, "a reconcile failing while the runtime is down", func() bool { return errorsSoFar() > failed })
	critest.Serve(t, sock, &critest.Runtime{})
	statetest.Wait(t, store, "the pod removed after the restart", func() bool { return statetest.Phase(store, "uid-web") == record.PhaseRemoved })
}

// CRI lists a container with the annotations it was created with: a device
// plugin's there (TensorFusion's MIG partitions) reach the pod's devices
// when NRI missed the container's creation.
func TestReconcileBringsTheContainersAnnotations(t *testing.T) {
	formats, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store := state.New(state.Options{Decoder: allocator.NewSet(testLog(), nil, formats...)})
	const parent, mig = "GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11", "MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55"
	pod := critest.Pod("train", criv1.PodSandboxState_SANDBOX_READY)
	pod.Annotations = map[string]string{tensorfusion.IsolationKey: "partitioned", tensorfusion.GPUIDsKey: parent}
	ctr := critest.Ctr(pod, "main", criv1.ContainerState_CONTAINER_RUNNING)
	ctr.Annotations = map[string]string{tensorfusion.PartitionUUIDsKey: mig + "/7/0:" + parent, "io.kubernetes.container.hash": "3f2a1b"}
	rt := &critest.Runtime{}
	rt.Set([]*criv1.PodSandbox{pod}, []*criv1.Container{ctr})
	sock := filepath.Join(shortTempDir(t), "cri.sock")
	critest.Serve(t, sock, rt)
	r, err := NewReconciler(store, CRIOptions{Endpoint: "unix://" + sock, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, ok := store.Get(pod.Metadata.Uid)
	if !ok || len(rec.Devices) != 1 || rec.Devices[0].IDs[0] != mig || rec.Devices[0].Container != "main" {
		t.Errorf("devices after a CRI reconcile: %+v; want the container's MIG slice only\n%s", rec, statetest.Dump(store))
	}
}
