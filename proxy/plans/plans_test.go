package plans_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/trust"
)

const (
	koordKey = "scheduling.koordinator.sh/device-allocated"
	gpuA     = "GPU-0a1b2c3d-0000-4000-8000-000000000001"
	gpuB     = "GPU-0a1b2c3d-0000-4000-8000-000000000002"
	gpuC     = "GPU-0a1b2c3d-0000-4000-8000-000000000003"
)

func koordPod(uid, name, gpu string) model.KubeletPod {
	return model.KubeletPod{
		UID: uid, Namespace: "ml", Name: name, Phase: "Running",
		Annotations: map[string]string{koordKey: `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"` + gpu + `"}]}`},
		Spec: model.PodSpec{SchedulerName: "koord-scheduler", Containers: []model.ContainerSpec{
			{Name: "train", Kind: model.KindApp, Requests: map[string]string{"koordinator.sh/gpu-core": "100"}},
		}},
	}
}

func start(t *testing.T) (*state.Store, *plans.Builder) {
	t.Helper()
	return startWith(t, nil)
}

// startWith starts a builder that writes device-info with w; nil: none.
func startWith(t *testing.T, w plans.DeviceInfoWriter) (*state.Store, *plans.Builder) {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set := allocator.NewSet(log, nil, decoders...)
	store := state.New(state.Options{Decoder: set})
	b := plans.New(plans.Options{Store: store, Allocators: set, Gate: trust.NewGate(set, trust.GateOptions{Log: log}), DeviceInfo: w, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return store, b
}

func tableAt(t *testing.T, store *state.Store, b *plans.Builder) *plans.Table {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tab, err := b.At(ctx, store.Version())
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

// A plan is computed once per change of what it depends on: a change to
// another pod that does not touch its devices keeps it (the same plan, so
// answers built with it are reused), a change to its own devices replaces
// it, and a table always agrees with the records it was computed from.
func TestPlansChangeOnlyWithWhatTheyDependOn(t *testing.T) {
	store, b := start(t)
	a, other := koordPod("uid-a", "a", gpuA), koordPod("uid-b", "b", gpuB)
	store.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{a, other})

	first := tableAt(t, store, b)
	pa := first.Plan("uid-a")
	if pa == nil || len(pa.Containers["train"]) != 1 || pa.Containers["train"][0].IDs[0] != gpuA {
		t.Fatalf("pod a's plan = %+v, want its GPU on container train", pa)
	}

	// Another pod without devices comes: a's plan is the same plan.
	idle := model.KubeletPod{UID: "uid-idle", Namespace: "ml", Name: "idle", Phase: "Running",
		Spec: model.PodSpec{SchedulerName: "default-scheduler", Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}}
	store.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{a, other, idle})
	second := tableAt(t, store, b)
	if _, ok := second.Pods().Get("uid-idle"); !ok {
		t.Fatal("the table does not have the pod that came")
	}
	if second.Plan("uid-a") != pa {
		t.Error("pod a's plan was computed again although nothing it depends on changed")
	}

	// a's GPU changes in the API before its sandbox: a new plan.
	moved := koordPod("uid-a", "a", gpuB)
	other2 := koordPod("uid-b", "b", gpuA)
	store.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{moved, other2, idle})
	third := tableAt(t, store, b)
	if p := third.Plan("uid-a"); p == pa || p == nil || p.Containers["train"][0].IDs[0] != gpuB {
		t.Errorf("after a's annotation changed its plan is %+v, want a new plan with %s", p, gpuB)
	}
	if rec, _ := third.Pods().Get("uid-a"); rec == nil || len(rec.Devices) == 0 {
		t.Error("the table's record of a is not the one its plan was computed from")
	}
}

// At waits for the builder and gives up with the caller's context, and
// with an error once the builder has stopped.
func TestAtEndsWithItsContextOrTheBuilder(t *testing.T) {
	store, b := start(t)
	tab := tableAt(t, store, b)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.At(ctx, tab.Pods().Version()+1000); err == nil {
		t.Error("At of a version the store never reaches returned without error on a cancelled context")
	}
}

// stallingWriter wants a device-info file for every device; its writes for
// one pod hang until released, as on a disk that stalls. It records how
// many of each pod's writes were in flight at once.
type stallingWriter struct {
	uid     string
	holding chan struct{} // closed when the stalled pod's first write began
	release chan struct{}

	mu       sync.Mutex
	inFlight map[string]int
	most     map[string]int
}

func (w *stallingWriter) Wants(model.Device) bool { return true }

func (w *stallingWriter) Hold(pod model.PodRef, _ []model.Device) {
	w.mu.Lock()
	w.inFlight[pod.UID]++
	w.most[pod.UID] = max(w.most[pod.UID], w.inFlight[pod.UID])
	first := pod.UID == w.uid && w.most[pod.UID] == 1 && w.holding != nil
	if first {
		close(w.holding)
		w.holding = nil
	}
	w.mu.Unlock()
	if pod.UID == w.uid {
		<-w.release
	}
	w.mu.Lock()
	w.inFlight[pod.UID]--
	w.mu.Unlock()
}

// While one pod's device-info write is stalled, deciding every plan again
// (another pod's GPU moves) writes that pod's files in one goroutine at a
// time, not one more per decision, and every plan decided meanwhile is
// written once the write ends.
func TestReDecisionsWhileADeviceInfoWriteStallsAddNoWriters(t *testing.T) {
	holding := make(chan struct{})
	w := &stallingWriter{uid: "uid-a", holding: holding, release: make(chan struct{}),
		inFlight: map[string]int{}, most: map[string]int{}}
	store, b := startWith(t, w)
	released := false
	free := func() {
		if !released {
			released = true
			close(w.release)
		}
	}
	t.Cleanup(free) // runs before the builder's stop, which waits for writes
	a := koordPod("uid-a", "a", gpuA)
	store.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{a, koordPod("uid-b", "b", gpuB)})
	decided := []*plans.Plan{tableAt(t, store, b).Plan("uid-a")}
	<-holding

	for i := range 50 {
		gpu := gpuB
		if i%2 == 0 {
			gpu = gpuC
		}
		store.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{a, koordPod("uid-b", "b", gpu)})
		p := tableAt(t, store, b).Plan("uid-a")
		if p == nil || p == decided[len(decided)-1] {
			t.Fatalf("after b's GPU moved, a's plan is %p, want a new one", p)
		}
		decided = append(decided, p)
	}
	free()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, p := range decided {
		if err := p.Written(ctx); err != nil {
			t.Fatalf("plan %d of a: its device-info files were never written: %v", i, err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := w.most["uid-a"]; n > 1 {
		t.Errorf("%d device-info writes of pod a were in flight at once, want 1", n)
	}
}
