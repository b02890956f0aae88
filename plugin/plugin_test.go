package plugin

import (
	"context"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/statetest"
)

func TestConfigureSubscribesOnlyToEventsOldRuntimesKnow(t *testing.T) {
	p := newHandlers(state.New(state.Options{}), testLog(), nil, nil)
	mask, err := p.Configure(context.Background(), "", "containerd", "v1.7.30")
	if err != nil {
		t.Fatal(err)
	}
	want := []api.Event{
		api.Event_RUN_POD_SANDBOX, api.Event_STOP_POD_SANDBOX, api.Event_REMOVE_POD_SANDBOX,
		api.Event_POST_CREATE_CONTAINER, api.Event_POST_START_CONTAINER,
		api.Event_STOP_CONTAINER, api.Event_REMOVE_CONTAINER,
	}
	var wantMask api.EventMask
	wantMask.Set(want...)
	if mask != wantMask {
		t.Errorf("Configure subscribed to %s, want %s", mask.PrettyString(), wantMask.PrettyString())
	}
	// nri before v0.10 (containerd 1.7 to 2.1) knows events up to
	// REMOVE_CONTAINER and drops a plugin that asks for more.
	for e := api.Event_UPDATE_POD_SANDBOX; e < api.Event_LAST; e++ {
		if mask.IsSet(e) {
			t.Errorf("Configure subscribed to %v, which runtimes with nri < v0.10 reject", e)
		}
	}
}

func TestHandlersTolerateNilAndSparseArguments(t *testing.T) {
	store := state.New(state.Options{})
	p := newHandlers(store, testLog(), nil, nil)
	ctx := context.Background()
	unknown := &api.PodSandbox{Id: "sb-unknown"}
	unknownCtr := &api.Container{Id: "ctr-unknown", PodSandboxId: "sb-unknown"}

	for _, pod := range []*api.PodSandbox{nil, {}, unknown} {
		if err := p.RunPodSandbox(ctx, pod); err != nil {
			t.Errorf("RunPodSandbox(%v) = %v", pod, err)
		}
		if err := p.StopPodSandbox(ctx, pod); err != nil {
			t.Errorf("StopPodSandbox(%v) = %v", pod, err)
		}
		if err := p.RemovePodSandbox(ctx, pod); err != nil {
			t.Errorf("RemovePodSandbox(%v) = %v", pod, err)
		}
		for _, ctr := range []*api.Container{nil, {}, unknownCtr} {
			if err := p.PostCreateContainer(ctx, pod, ctr); err != nil {
				t.Errorf("PostCreateContainer = %v", err)
			}
			if err := p.PostStartContainer(ctx, pod, ctr); err != nil {
				t.Errorf("PostStartContainer = %v", err)
			}
			if _, err := p.StopContainer(ctx, pod, ctr); err != nil {
				t.Errorf("StopContainer = %v", err)
			}
			if err := p.RemoveContainer(ctx, pod, ctr); err != nil {
				t.Errorf("RemoveContainer = %v", err)
			}
		}
	}
	if _, err := p.Synchronize(ctx, []*api.PodSandbox{nil, {}, {Id: "sb-no-uid"}}, []*api.Container{nil, {}}); err != nil {
		t.Errorf("Synchronize = %v", err)
	}
	if n := len(store.Records()); n != 0 {
		t.Errorf("events without a pod UID created records:\n%s", statetest.Dump(store))
	}

	// Events for a known pod that carry only ids, as exit notifications
	// do, still reach its record.
	pod := k8sPod("a")
	ctr := k8sCtr(pod, "app", api.ContainerState_CONTAINER_CREATED)
	p.RunPodSandbox(ctx, pod)
	p.PostCreateContainer(ctx, &api.PodSandbox{Id: pod.Id}, &api.Container{Id: ctr.Id, Name: "app"})
	if got := statetest.ContainerState(store, pod.Uid, ctr.Id); got != model.ContainerCreated {
		t.Errorf("container created under a pod with only its id: state %q, want created", got)
	}
	p.StopContainer(ctx, nil, &api.Container{Id: ctr.Id, PodSandboxId: pod.Id})
	if got := statetest.ContainerState(store, pod.Uid, ctr.Id); got != model.ContainerStopped {
		t.Errorf("container stopped with a nil pod: state %q, want stopped", got)
	}
	p.StopPodSandbox(ctx, &api.PodSandbox{Id: pod.Id})
	if got := statetest.Phase(store, pod.Uid); got != record.PhaseStopped {
		t.Errorf("pod stopped by id only: phase %q, want stopped", got)
	}
}

func TestHandlersIgnoreDuplicateEvents(t *testing.T) {
	store := state.New(state.Options{})
	p := newHandlers(store, testLog(), nil, nil)
	ctx := context.Background()
	pod := k8sPod("a")
	ctr := k8sCtr(pod, "app", api.ContainerState_CONTAINER_RUNNING)

	p.RunPodSandbox(ctx, pod)
	p.PostStartContainer(ctx, pod, ctr)
	before, _ := store.Get(pod.Uid)
	p.RunPodSandbox(ctx, pod)
	p.PostStartContainer(ctx, pod, ctr)
	after, _ := store.Get(pod.Uid)
	if before != after {
		t.Errorf("a repeated event changed the record:\nbefore %+v\nafter  %+v", before, after)
	}
}

func TestStopContainerRecordsStoppedWhateverStateTheEventCarries(t *testing.T) {
	store := state.New(state.Options{})
	p := newHandlers(store, testLog(), nil, nil)
	ctx := context.Background()
	pod := k8sPod("a")
	p.RunPodSandbox(ctx, pod)
	p.PostStartContainer(ctx, pod, k8sCtr(pod, "app", api.ContainerState_CONTAINER_RUNNING))
	// containerd 2.3+ reports an exited container as UNKNOWN.
	p.StopContainer(ctx, pod, k8sCtr(pod, "app", api.ContainerState_CONTAINER_UNKNOWN))
	if got := statetest.ContainerState(store, pod.Uid, pod.Id+"-app"); got != model.ContainerStopped {
		t.Errorf("state after StopContainer = %q, want stopped", got)
	}
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	store := state.New(state.Options{})
	for name, tc := range map[string]struct {
		store *state.Store
		opts  Options
	}{
		"nil store":        {nil, Options{}},
		"bad name":         {store, Options{Name: "pod res"}},
		"bad index":        {store, Options{Index: "9"}},
		"backoff inverted": {store, Options{MinBackoff: time.Second, MaxBackoff: time.Millisecond}},
	} {
		if _, err := New(tc.store, tc.opts); err == nil {
			t.Errorf("%s: New succeeded, want an error", name)
		}
	}
	if _, err := New(store, Options{}); err != nil {
		t.Errorf("New with defaults: %v", err)
	}
}

func TestNewLeavesIdentityToRuntimeThatPreLaunchedThePlugin(t *testing.T) {
	t.Setenv(api.PluginNameEnvVar, "podres")
	t.Setenv(api.PluginIdxEnvVar, "05")
	// The stub refuses an index given twice; New must not pass its own.
	if _, err := New(state.New(state.Options{}), Options{Name: "other", Index: "90"}); err != nil {
		t.Fatalf("New with the runtime's NRI_PLUGIN_NAME and NRI_PLUGIN_IDX: %v", err)
	}
}

func TestSynchronizeRecordsRuntimeStateAndRemovesWhatIsNotListed(t *testing.T) {
	store := state.New(state.Options{Decoder: statetest.NewDecoder()})
	// What the store knew before the plugin connected.
	a, gone, stopped := k8sPod("a"), k8sPod("gone"), k8sPod("stopped")
	for _, pod := range []*api.PodSandbox{a, gone, stopped} {
		store.ObserveSandbox(record.OriginNRI, sandbox(pod, true))
	}
	store.SandboxStopped(record.OriginNRI, stopped.Id, stopped.Uid)
	store.ObserveContainer(record.OriginNRI, model.RuntimeContainer{
		ID: a.Id + "-exited", SandboxID: a.Id, Name: "exited", State: model.ContainerRunning,
	})

	b := k8sPod("b")
	dir := shortTempDir(t)
	startRuntime(t, dir,
		[]*api.PodSandbox{a, b, stopped},
		[]*api.Container{
			k8sCtr(a, "app", api.ContainerState_CONTAINER_RUNNING),
			k8sCtr(a, "sidecar", api.ContainerState_CONTAINER_CREATED),
			k8sCtr(b, "app", api.ContainerState_CONTAINER_PAUSED),
		})
	p := startPlugin(t, store, dir)
	poll.Until(t, "Synchronize to be applied", p.Synced)

	for uid, want := range map[string]record.Phase{
		a.Uid: record.PhaseReady, b.Uid: record.PhaseReady,
		gone.Uid: record.PhaseRemoved, stopped.Uid: record.PhaseStopped,
	} {
		if got := statetest.Phase(store, uid); got != want {
			t.Errorf("pod %s: phase %q, want %q", uid, got, want)
		}
	}
	for _, c := range []struct {
		uid, id string
		want    model.ContainerState
	}{
		{a.Uid, a.Id + "-app", model.ContainerRunning},
		{a.Uid, a.Id + "-sidecar", model.ContainerCreated},
		{a.Uid, a.Id + "-exited", model.ContainerStopped}, // Synchronize leaves exited containers out
		{b.Uid, b.Id + "-app", model.ContainerRunning},
	} {
		if got := statetest.ContainerState(store, c.uid, c.id); got != c.want {
			t.Errorf("container %s: state %q, want %q", c.id, got, c.want)
		}
	}
	rb, _ := store.Get(b.Uid)
	if rb.Namespace != "default" || rb.Name != "b" || rb.SandboxID != b.Id {
		t.Errorf("pod b recorded as %s/%s sandbox %s", rb.Namespace, rb.Name, rb.SandboxID)
	}
	if rb.Annotations["example.com/gpu"] != "GPU-b" || len(rb.Devices) != 1 {
		t.Errorf("pod b's allocation not recorded: annotations %v, devices %v", rb.Annotations, rb.Devices)
	}
	if rb.Provenance.Sandbox == nil || rb.Provenance.Sandbox.Origin != record.OriginNRI {
		t.Errorf("pod b's sandbox source = %+v, want nri", rb.Provenance.Sandbox)
	}
}

func TestLifecycleEventsReachTheStoreInOrder(t *testing.T) {
	store := state.New(state.Options{Decoder: statetest.NewDecoder()})
	dir := shortTempDir(t)
	rt := startRuntime(t, dir, nil, nil)
	p := startPlugin(t, store, dir)
	poll.Until(t, "Synchronize to be applied", p.Synced)
	rt.waitPlugins(t, 1)

	pod := k8sPod("web")
	ctr := k8sCtr(pod, "app", api.ContainerState_CONTAINER_CREATED)
	hasPhase := func(want record.Phase) func() bool {
		return func() bool { return statetest.Phase(store, pod.Uid) == want }
	}
	hasCtr := func(want model.ContainerState) func() bool {
		return func() bool { return statetest.ContainerState(store, pod.Uid, ctr.Id) == want }
	}
	for _, step := range []struct {
		event string
		ctr   *api.Container
		what  string
		done  func() bool
	}{
		{"RunPodSandbox", nil, "pod ready", func() bool {
			r, ok := store.Get(pod.Uid)
			return ok && r.Live() && r.Annotations["example.com/gpu"] == "GPU-web"
		}},
		{"PostCreateContainer", ctr, "container created", hasCtr(model.ContainerCreated)},
		{"PostStartContainer", ctr, "container running", hasCtr(model.ContainerRunning)},
		{"StopContainer", ctr, "container stopped", hasCtr(model.ContainerStopped)},
		{"RemoveContainer", ctr, "container removed", hasCtr(model.ContainerRemoved)},
		{"StopPodSandbox", nil, "pod stopped", hasPhase(record.PhaseStopped)},
		{"RemovePodSandbox", nil, "pod removed", hasPhase(record.PhaseRemoved)},
	} {
		rt.mustSend(t, step.event, pod, step.ctr)
		statetest.Wait(t, store, step.what+" after "+step.event, step.done)
	}
	if f := rt.stats.failed(); len(f) != 0 {
		t.Errorf("the runtime saw plugin failures: %v", f)
	}
	for _, e := range []string{"RunPodSandbox", "PostCreateContainer", "PostStartContainer",
		"StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox"} {
		if n := p.metrics.get(func(m *testMetrics) int { return m.events[e] }); n != 1 {
			t.Errorf("metrics counted %d %s events, want 1", n, e)
		}
	}
}

func TestReconnectsAfterRuntimeRestartAndConverges(t *testing.T) {
	store := state.New(state.Options{})
	a, b, c, d := k8sPod("a"), k8sPod("b"), k8sPod("c"), k8sPod("d")
	dir := shortTempDir(t)
	rt := startRuntime(t, dir, []*api.PodSandbox{a, b}, nil)
	p := startPlugin(t, store, dir)
	poll.Until(t, "first Synchronize", p.Synced)
	rt.waitPlugins(t, 1)

	// The runtime crashes: its socket goes away and so does the connection.
	rt.stop()
	p.cut()
	poll.Until(t, "the plugin to notice the lost connection", func() bool { return !p.Synced() })

	// While the plugin was disconnected, b was removed and c started. The
	// restarted runtime lists what is there now.
	rt2 := startRuntime(t, dir, []*api.PodSandbox{a, c}, nil)
	poll.Until(t, "Synchronize after the restart", p.Synced)
	rt2.waitPlugins(t, 1)
	for uid, want := range map[string]record.Phase{
		a.Uid: record.PhaseReady, b.Uid: record.PhaseRemoved, c.Uid: record.PhaseReady,
	} {
		if got := statetest.Phase(store, uid); got != want {
			t.Errorf("pod %s after the restart: phase %q, want %q", uid, got, want)
		}
	}

	rt2.mustSend(t, "RunPodSandbox", d, nil)
	statetest.Wait(t, store, "pod d started after the restart", func() bool { return statetest.Phase(store, d.Uid) == record.PhaseReady })
	if n := p.metrics.get(func(m *testMetrics) int { return m.reconnects }); n < 1 {
		t.Errorf("metrics counted %d reconnects, want at least 1", n)
	}
}

func TestConnectsOnceTheRuntimeComesUp(t *testing.T) {
	store := state.New(state.Options{})
	dir := shortTempDir(t)
	p := startPlugin(t, store, dir)
	poll.Until(t, "a failed connection attempt", func() bool {
		return p.metrics.get(func(m *testMetrics) int { return m.reconnects }) >= 2
	})
	if p.Synced() {
		t.Fatal("Synced without a runtime")
	}
	a := k8sPod("a")
	startRuntime(t, dir, []*api.PodSandbox{a}, nil)
	poll.Until(t, "Synchronize once the runtime is up", p.Synced)
	if got := statetest.Phase(store, a.Uid); got != record.PhaseReady {
		t.Errorf("pod a: phase %q, want ready", got)
	}
}

// hangGuard bounds the wait for an event a regression would never produce;
// it measures nothing.
const hangGuard = 30 * time.Second

// TestHandlersApplyEventsWhileAnotherPodsAnnotationIsDecoded holds a /pods
// read in the middle of decoding a (hostile) annotation and sends a pod's
// lifecycle meanwhile: each handler must have applied its event when it
// returns, since decoding never holds the store's lock. It awaits events
// only: no timing is asserted, so a busy machine cannot fail it.
func TestHandlersApplyEventsWhileAnotherPodsAnnotationIsDecoded(t *testing.T) {
	dec := statetest.NewDecoder()
	store := state.New(state.Options{Decoder: dec})
	dir := shortTempDir(t)
	rt := startRuntime(t, dir, nil, nil)
	p := startPlugin(t, store, dir)
	poll.Until(t, "Synchronize to be applied", p.Synced)
	rt.waitPlugins(t, 1)

	observed := make(chan struct{})
	go func() {
		defer close(observed)
		store.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{
			UID: "uid-holder", Namespace: "default", Name: "holder", Phase: "Running",
			Annotations: map[string]string{"example.com/hold": "1"},
		}})
	}()
	<-dec.Held() // decoding the holder's annotation, and staying there
	released := false
	release := func() {
		if !released {
			released = true
			dec.Release()
			<-observed
		}
	}
	t.Cleanup(release)

	pod := k8sPod("x")
	ctr := k8sCtr(pod, "app", api.ContainerState_CONTAINER_CREATED)
	for _, event := range []string{"RunPodSandbox", "PostCreateContainer", "PostStartContainer"} {
		if _, err := rt.send(context.Background(), event, pod, ctr); err != nil {
			t.Fatalf("%s failed while another pod's annotation was decoded: %v", event, err)
		}
	}
	// Applied when the handlers returned, though the decoding goes on. The
	// look is guarded: a store that decodes under its lock would block it.
	looked := make(chan [2]string, 1)
	go func() {
		looked <- [2]string{string(statetest.Phase(store, pod.Uid)), string(statetest.ContainerState(store, pod.Uid, ctr.Id))}
	}()
	select {
	case got := <-looked:
		if got != [2]string{string(record.PhaseReady), string(model.ContainerRunning)} {
			t.Fatalf("while another pod's annotation was decoded: pod %q, container %q; want ready, running", got[0], got[1])
		}
	case <-time.After(hangGuard):
		release()
		t.Fatal("reading the store waited for another pod's annotation to be decoded")
	}
	if f := rt.stats.failed(); len(f) != 0 {
		t.Errorf("the runtime saw plugin failures: %v", f)
	}

	release()
	if r, ok := store.Get("uid-holder"); !ok || len(r.Devices) != 1 {
		t.Errorf("the held /pods read was not recorded: %+v", r)
	}
	// Still registered: the next event reaches the store.
	rt.mustSend(t, "StopContainer", pod, ctr)
	if got := statetest.ContainerState(store, pod.Uid, ctr.Id); got != model.ContainerStopped {
		t.Errorf("a later event: container %q, want stopped", got)
	}
	if got := rt.stats.pluginCount(); got != 1 {
		t.Errorf("the runtime has %d plugins, want 1", got)
	}
	if n := p.metrics.get(func(m *testMetrics) int { return m.disconnects }); n != 0 {
		t.Errorf("the plugin was disconnected %d times", n)
	}
}

func TestPreLaunchedRunReturnsWhenTheConnectionCloses(t *testing.T) {
	store := state.New(state.Options{})
	dir := shortTempDir(t)
	a := k8sPod("a")
	rt := startRuntime(t, dir, []*api.PodSandbox{a}, nil)

	// Hand the plugin a connected socket the way a runtime that launches
	// it does: by file descriptor in NRI_PLUGIN_SOCKET.
	conn, err := net.Dial("unix", dir+"/nri.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	raw.Control(func(s uintptr) { fd, err = syscall.Dup(int(s)) }) // the stub closes this one
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(api.PluginSocketEnvVar, strconv.Itoa(fd))
	t.Setenv(api.PluginNameEnvVar, "launched")
	t.Setenv(api.PluginIdxEnvVar, "05")

	p, err := New(store, Options{Log: testLog(), MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	poll.Until(t, "Synchronize", p.Synced)
	rt.waitPlugins(t, 1)
	if got := statetest.Phase(store, a.Uid); got != record.PhaseReady {
		t.Errorf("pod a: phase %q, want ready", got)
	}
	if !rt.stats.saw("05-launched") {
		t.Errorf("the plugin did not register under the runtime's name 05-launched")
	}

	// The runtime goes away: shutting the socket down ends it for every
	// descriptor of it, the plugin's too.
	conn.(*net.UnixConn).CloseWrite()
	select {
	case err := <-done:
		if err == nil {
			t.Error("Run returned nil after the handed-over connection closed, want an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the handed-over connection closed")
	}
}
