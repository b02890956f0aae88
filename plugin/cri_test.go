package plugin

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/critest"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/statetest"
)

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
	statetest.Wait(t, store, "container running", func() bool { return statetest.ContainerState(store, pod.Uid, ctr.Id) == model.ContainerRunning })

	// The pod is stopped without NRI events.
	fake := &critest.Runtime{}
	criSandbox := critest.Pod("web", criv1.PodSandboxState_SANDBOX_NOTREADY)
	fake.Set([]*criv1.PodSandbox{criSandbox}, []*criv1.Container{critest.Ctr(criSandbox, "app", criv1.ContainerState_CONTAINER_EXITED)})
	sock := filepath.Join(dir, "cri.sock")
	critest.Serve(t, sock, fake)
	r, err := NewReconciler(store, CRIOptions{Endpoint: sock, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := statetest.Phase(store, pod.Uid); got != record.PhaseStopped {
		t.Errorf("pod stopped without events: phase %q after reconcile, want stopped", got)
	}
	if got := statetest.ContainerState(store, pod.Uid, ctr.Id); got != model.ContainerStopped {
		t.Errorf("container exited without events: state %q after reconcile, want stopped", got)
	}

	// Then it is removed, again without events.
	fake.Set(nil, nil)
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := statetest.Phase(store, pod.Uid); got != record.PhaseRemoved {
		t.Errorf("pod removed without events: phase %q after reconcile, want removed", got)
	}
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

	fake := &critest.Runtime{}
	criSandbox := critest.Pod("web", criv1.PodSandboxState_SANDBOX_READY)
	criSandbox.Id, criSandbox.Metadata.Uid = pod.Id, pod.Uid
	fake.Set([]*criv1.PodSandbox{criSandbox}, nil)
	sock := filepath.Join(dir, "cri.sock")
	critest.Serve(t, sock, fake)
	metrics := newTestMetrics()
	r, err := NewReconciler(store, CRIOptions{Endpoint: sock, Interval: time.Hour, Log: testLog(), Metrics: metrics})
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
	statetest.Wait(t, store, "the pod ready", func() bool { return statetest.Phase(store, pod.Uid) == record.PhaseReady })
	poll.Until(t, "the first reconciles", func() bool { return metrics.get(func(m *testMetrics) int { return m.reconciles }) >= 2 })

	// The pod stops while the plugin is disconnected; the runtime still
	// lists its sandbox in the next Synchronize.
	fake.Set([]*criv1.PodSandbox{func() *criv1.PodSandbox {
		sb := critest.Pod("web", criv1.PodSandboxState_SANDBOX_NOTREADY)
		sb.Id, sb.Metadata.Uid = pod.Id, pod.Uid
		return sb
	}()}, nil)
	p.cut()
	statetest.Wait(t, store, "the stale sandbox stopped by the reconcile the resync triggered", func() bool {
		return statetest.Phase(store, pod.Uid) == record.PhaseStopped
	})
}
