package state

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
	"github.com/podres-proxy/podres-proxy/state/record"
)

var pod = model.PodKey{Namespace: "ns", Name: "web-0"}

func TestPendingPodFromPodsBecomesLiveWhenNRIReportsItsSandbox(t *testing.T) {
	dec := &fakeDecoder{}
	s := New(Options{Decoder: dec, Clock: newFakeClock()})
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{
		UID: "u1", Namespace: "ns", Name: "web-0", Phase: "Pending",
		Annotations: map[string]string{"alloc/gpu": "GPU-1", "other": "x"},
		Spec:        model.PodSpec{Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}},
	}})
	r := mustGet(t, s, "u1")
	if r.State != record.PhasePending || r.Spec == nil || r.KubeletPhase != "Pending" {
		t.Fatalf("after /pods: state %q spec %v kubeletPhase %q, want pending with spec", r.State, r.Spec, r.KubeletPhase)
	}
	if !maps.Equal(r.Annotations, map[string]string{"alloc/gpu": "GPU-1"}) {
		t.Errorf("annotations %v: only relevant ones must be kept", r.Annotations)
	}
	if len(r.Devices) != 1 || r.Devices[0].IDs[0] != "GPU-1" {
		t.Errorf("devices %+v, want GPU-1", r.Devices)
	}
	if _, ok := s.Snapshot().Live(pod); ok {
		t.Fatal("a pod known only from /pods is Live; it must be read again")
	}

	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb1", map[string]string{"alloc/gpu": "GPU-1"}))
	live, ok := s.Snapshot().Live(pod)
	if !ok || live.UID != "u1" || live.SandboxID != "sb1" || live.State != record.PhaseReady {
		t.Fatalf("after NRI RunPodSandbox: Live = %+v, %v; want u1 ready in sb1", live, ok)
	}
	if live.Spec == nil {
		t.Error("the spec learned from /pods was lost when the sandbox was observed")
	}
	if live.Provenance.Sandbox.Origin != record.OriginNRI || live.Provenance.Spec.Origin != record.OriginKubelet {
		t.Errorf("sources %+v, want sandbox from nri and spec from kubelet", live.Provenance)
	}
}

func TestSandboxOfKubeletSourceIsNotLive(t *testing.T) {
	r := &record.Record{State: record.PhaseReady, SandboxID: "sb", Provenance: record.Provenance{Sandbox: &record.Seen{Origin: record.OriginKubelet}}}
	if r.Live() {
		t.Error("a ready record whose sandbox fact came from the kubelet is Live")
	}
	r.Provenance.Sandbox.Origin = record.OriginCRI
	if !r.Live() {
		t.Error("a ready sandbox reported by CRI is not Live")
	}
}

func TestStoppedOrRemovedSandboxIsNotLive(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb1", nil))
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerRunning})
	if _, ok := s.Snapshot().Live(pod); !ok {
		t.Fatal("a running sandbox is not Live")
	}

	s.SandboxStopped(record.OriginNRI, "sb1", "")
	if _, ok := s.Snapshot().Live(pod); ok {
		t.Error("a stopped sandbox is Live")
	}
	if r := mustGet(t, s, "u1"); r.State != record.PhaseStopped {
		t.Errorf("state %q after StopPodSandbox, want stopped", r.State)
	}

	removedAt := clock.Advance(time.Second)
	s.SandboxRemoved(record.OriginNRI, "sb1", "u1")
	r := mustGet(t, s, "u1")
	if _, ok := s.Snapshot().Live(pod); ok || r.State != record.PhaseRemoved {
		t.Errorf("after RemovePodSandbox: state %q, Live %v; want removed, not live", r.State, ok)
	}
	if r.RemovedAt == nil || !r.RemovedAt.Equal(removedAt) {
		t.Errorf("removedAt %v, want %v", r.RemovedAt, removedAt)
	}
	if got := containerStates(r)["c1"]; got != model.ContainerRemoved {
		t.Errorf("container of a removed sandbox is %q, want removed", got)
	}
}

func TestRecreatedPodWithTwoLiveSandboxesIsAmbiguous(t *testing.T) {
	s := New(Options{Clock: newFakeClock()})
	// A reconcile says which sandboxes run, not which began last.
	s.Reconcile(record.OriginNRI, time.Time{}, []model.Sandbox{
		readySandbox("old", "ns", "web-0", "sb-old", nil),
		readySandbox("new", "ns", "web-0", "sb-new", nil),
	}, nil, false)
	if r, ok := s.Snapshot().Live(pod); ok {
		t.Fatalf("two running sandboxes of one name: Live returned %s; the kubelet must decide", r.UID)
	}

	s.SandboxStopped(record.OriginNRI, "sb-old", "")
	r, ok := s.Snapshot().Live(pod)
	if !ok || r.UID != "new" {
		t.Fatalf("old stopped, new ready: Live = %v, %v; want the new pod", r, ok)
	}
}

func TestEventsOfAnOlderSandboxDoNotTouchTheCurrentOne(t *testing.T) {
	s := New(Options{Clock: newFakeClock()})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb1", nil))
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerRunning})
	// The pod's sandbox is recreated (same uid, new sandbox).
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb2", nil))
	r := mustGet(t, s, "u1")
	if r.SandboxID != "sb2" || len(r.Containers) != 0 {
		t.Fatalf("after the new sandbox: sandbox %q containers %v; want sb2 and none of the old containers", r.SandboxID, r.Containers)
	}
	s.SandboxStopped(record.OriginNRI, "sb1", "u1")
	s.SandboxRemoved(record.OriginNRI, "sb1", "u1")
	s.ObserveSandbox(record.OriginCRI, model.Sandbox{ID: "sb1", UID: "u1", Namespace: "ns", Name: "web-0", Ready: false})
	if r, ok := s.Snapshot().Live(pod); !ok || r.SandboxID != "sb2" {
		t.Fatalf("events about the old sandbox changed the current one: Live = %+v, %v", r, ok)
	}
}

func TestRemovalOfAnUnknownContainerRecordsNothing(t *testing.T) {
	s := New(Options{Clock: newFakeClock()})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb1", nil))
	before := mustGet(t, s, "u1")
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "never-seen", SandboxID: "sb1", State: model.ContainerRemoved})
	if after := mustGet(t, s, "u1"); after != before {
		t.Errorf("removing an unknown container changed the record: containers %+v", after.Containers)
	}
}

func TestReconcileWithAnOlderSnapshotDoesNotUndoNewerEvents(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerRunning})
	asOf := clock.Advance(time.Second) // the CRI reconciler takes its snapshot...
	snapshot := []model.Sandbox{{ID: "sb1", UID: "u1", Namespace: "ns", Name: "a", Ready: true}}
	snapCtrs := []model.RuntimeContainer{{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerRunning}}

	clock.Advance(time.Second) // ...then events arrive before it is applied:
	s.SandboxStopped(record.OriginNRI, "sb1", "")
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "b", "sb2", nil))
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c2", SandboxID: "sb2", Name: "app", State: model.ContainerRunning})

	clock.Advance(time.Second)
	s.Reconcile(record.OriginCRI, asOf, snapshot, snapCtrs, true)

	if r := mustGet(t, s, "u1"); r.State != record.PhaseStopped {
		t.Errorf("sandbox stopped after the snapshot is %q after Reconcile, want stopped", r.State)
	}
	r := mustGet(t, s, "u2")
	if r.State != record.PhaseReady || containerStates(r)["c2"] != model.ContainerRunning {
		t.Errorf("sandbox created after the snapshot: state %q containers %v; want ready and running", r.State, r.Containers)
	}
}

func TestReconcileRemovesSandboxesItDoesNotList(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "b", "sb2", nil))
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "u3", Namespace: "ns", Name: "c", Phase: "Pending"}})
	asOf := clock.Advance(time.Second)
	s.Reconcile(record.OriginNRI, asOf, []model.Sandbox{readySandbox("u2", "ns", "b", "sb2", nil)}, nil, false)

	if r := mustGet(t, s, "u1"); r.State != record.PhaseRemoved || r.Provenance.Sandbox.Origin != record.OriginNRI {
		t.Errorf("unlisted sandbox: state %q source %v, want removed by nri", r.State, r.Provenance.Sandbox)
	}
	if r := mustGet(t, s, "u2"); r.State != record.PhaseReady {
		t.Errorf("listed sandbox is %q, want ready", r.State)
	}
	if r := mustGet(t, s, "u3"); r.State != record.PhasePending {
		t.Errorf("a pending pod (no sandbox yet) is %q after Reconcile; the runtime cannot know it", r.State)
	}
}

func TestReconcileLearnsSandboxesAndContainersItDidNotKnow(t *testing.T) {
	clock := newFakeClock()
	dec := &fakeDecoder{}
	s := New(Options{Clock: clock, Decoder: dec})
	asOf := clock.Now()
	s.Reconcile(record.OriginCRI, asOf,
		[]model.Sandbox{readySandbox("u1", "ns", "web-0", "sb1", map[string]string{"alloc/gpu": "GPU-1"})},
		[]model.RuntimeContainer{{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerRunning}}, true)
	r, ok := s.Snapshot().Live(pod)
	if !ok || r.Provenance.Sandbox.Origin != record.OriginCRI || containerStates(r)["c1"] != model.ContainerRunning || len(r.Devices) != 1 {
		t.Fatalf("after a CRI reconcile of an unknown pod: Live = %+v, %v", r, ok)
	}
}

func TestReconcileMarksUnlistedContainersByWhatTheSnapshotLeavesOut(t *testing.T) {
	for _, tc := range []struct {
		name         string
		src          record.Origin
		exitedListed bool
		want         model.ContainerState
	}{
		// NRI's Synchronize leaves exited containers out: not listed means stopped.
		{"nri", record.OriginNRI, false, model.ContainerStopped},
		// CRI lists exited containers: not listed means removed.
		{"cri", record.OriginCRI, true, model.ContainerRemoved},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			s := New(Options{Clock: clock})
			s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
			for _, id := range []string{"c1", "c2", "c3"} {
				s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: id, SandboxID: "sb1", Name: id, State: model.ContainerRunning})
			}
			asOf := clock.Advance(time.Second)
			clock.Advance(time.Second)
			// c1 is listed and changed state, c2 is listed unchanged, c3 is not
			// listed: the change to c1 must not make the snapshot skip c3.
			s.Reconcile(tc.src, asOf, []model.Sandbox{readySandbox("u1", "ns", "a", "sb1", nil)}, []model.RuntimeContainer{
				{ID: "c1", SandboxID: "sb1", Name: "c1", State: model.ContainerStopped},
				{ID: "c2", SandboxID: "sb1", Name: "c2", State: model.ContainerRunning},
			}, tc.exitedListed)
			got := containerStates(mustGet(t, s, "u1"))
			want := map[string]model.ContainerState{"c1": model.ContainerStopped, "c2": model.ContainerRunning, "c3": tc.want}
			if !maps.Equal(got, want) {
				t.Errorf("containers %v, want %v", got, want)
			}
		})
	}
}

func TestReconcileOfANewSandboxStillMarksItsUnlistedContainers(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	s.ObserveSandbox(record.OriginNRI, model.Sandbox{ID: "sb1", UID: "u1", Namespace: "ns", Name: "a", Ready: false})
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerRunning})
	asOf := clock.Advance(time.Second)
	clock.Advance(time.Second)
	// The snapshot changes the sandbox (stopped -> ready) and omits c1.
	s.Reconcile(record.OriginCRI, asOf, []model.Sandbox{readySandbox("u1", "ns", "a", "sb1", nil)}, nil, true)
	r := mustGet(t, s, "u1")
	if r.State != record.PhaseReady || containerStates(r)["c1"] != model.ContainerRemoved {
		t.Errorf("state %q containers %v; want ready with c1 removed", r.State, r.Containers)
	}
}

func TestExitedContainerIsNotUndoneByAnUnknownState(t *testing.T) {
	s := New(Options{Clock: newFakeClock()})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", Name: "app", State: model.ContainerStopped})
	s.ObserveContainer(record.OriginCRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", State: model.ContainerUnknown})
	if got := containerStates(mustGet(t, s, "u1"))["c1"]; got != model.ContainerStopped {
		t.Errorf("stopped container became %q on an unknown report", got)
	}
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", State: model.ContainerRemoved})
	s.ObserveContainer(record.OriginCRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", State: model.ContainerRunning})
	if got := containerStates(mustGet(t, s, "u1"))["c1"]; got != model.ContainerRemoved {
		t.Errorf("removed container came back as %q", got)
	}
}

func TestPendingPodsMissingFromTheNextPodsReadAreRemoved(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{
		{UID: "gone", Namespace: "ns", Name: "a", Phase: "Pending"},
		{UID: "stays", Namespace: "ns", Name: "b", Phase: "Pending"},
	})
	s.ObserveSandbox(record.OriginNRI, readySandbox("running", "ns", "c", "sb", nil))
	clock.Advance(time.Second)
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "stays", Namespace: "ns", Name: "b", Phase: "Pending"}})

	if r := mustGet(t, s, "gone"); r.State != record.PhaseRemoved || r.RemovedAt == nil {
		t.Errorf("pending pod missing from /pods: state %q removedAt %v, want removed", r.State, r.RemovedAt)
	}
	if r := mustGet(t, s, "stays"); r.State != record.PhasePending {
		t.Errorf("listed pending pod is %q", r.State)
	}
	if r := mustGet(t, s, "running"); r.State != record.PhaseReady {
		t.Errorf("a running sandbox missing from /pods is %q; only the runtime removes sandboxes", r.State)
	}

	// A read that started before the pod appeared left it out; the next one
	// lists it again: it is pending again, not left to be pruned.
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "gone", Namespace: "ns", Name: "a", Phase: "Pending"}})
	if r := mustGet(t, s, "gone"); r.State != record.PhasePending || r.RemovedAt != nil {
		t.Errorf("pod listed again: state %q removedAt %v, want pending", r.State, r.RemovedAt)
	}
}

func TestPruneDeletesRemovedRecordsOnlyAfterTheGracePeriod(t *testing.T) {
	clock := newFakeClock()
	var dirty []string
	s := New(Options{Clock: clock, PruneAfter: time.Minute})
	s.dirty = func(uid string) { dirty = append(dirty, uid) }
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "b", "sb2", nil))
	s.SandboxRemoved(record.OriginNRI, "sb1", "")

	clock.Advance(59 * time.Second)
	if n := s.pruneRemoved(); n != 0 {
		t.Fatalf("Prune deleted %d records before the grace period", n)
	}
	clock.Advance(time.Second)
	dirty = nil
	if n := s.pruneRemoved(); n != 1 {
		t.Fatalf("Prune deleted %d records after the grace period, want 1", n)
	}
	if _, ok := s.Get("u1"); ok {
		t.Error("pruned record still there")
	}
	if _, ok := s.Get("u2"); !ok {
		t.Error("a ready record was pruned")
	}
	if len(s.byKey[model.PodKey{Namespace: "ns", Name: "a"}]) != 0 {
		t.Error("pruned record still indexed by name")
	}
	if !slices.Equal(dirty, []string{"u1"}) {
		t.Errorf("dirty hook told %v, want [u1] so that the file goes too", dirty)
	}
}

func TestAnnotationsAreDecodedAgainOnlyWhenTheyChange(t *testing.T) {
	dec := &fakeDecoder{}
	s := New(Options{Decoder: dec, Clock: newFakeClock()})
	ann := map[string]string{"alloc/gpu": "GPU-1", "unrelated": "1"}
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", ann))
	if dec.Calls() != 1 {
		t.Fatalf("decoder called %d times for a new pod, want 1", dec.Calls())
	}
	before := mustGet(t, s, "u1")

	// The same allocator annotations from every source, and a change to an
	// irrelevant one, cost no decode and no change.
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", map[string]string{"alloc/gpu": "GPU-1", "unrelated": "2"}))
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "u1", Namespace: "ns", Name: "a", Phase: "Running", Annotations: ann}})
	if dec.Calls() != 1 {
		t.Errorf("decoder called %d times for unchanged annotations, want 1", dec.Calls())
	}
	if r := mustGet(t, s, "u1"); r.Provenance.Annotations != before.Provenance.Annotations {
		t.Error("unchanged annotations were recorded as learned again")
	}

	// A new sandbox of the same pod UID, started with other annotations
	// (the pause process was killed after an API edit): the allocation is
	// fixed at the pod's first sandbox, the edit is recorded, not taken.
	s.ObserveSandbox(record.OriginCRI, readySandbox("u1", "ns", "a", "sb2", map[string]string{"alloc/gpu": "GPU-2"}))
	r := mustGet(t, s, "u1")
	if len(r.Devices) != 1 || r.Devices[0].IDs[0] != "GPU-1" {
		t.Errorf("devices %+v, want still GPU-1", r.Devices)
	}
	if !slices.Equal(r.Edited, []string{"alloc/gpu"}) {
		t.Errorf("edited %v, want [alloc/gpu]", r.Edited)
	}
	if r.SandboxID != "sb2" || r.Provenance.Annotations.Origin != record.OriginNRI {
		t.Errorf("sandbox %s, annotations learned from %q; want sb2, and still the first sandbox's (nri)", r.SandboxID, r.Provenance.Annotations.Origin)
	}

	// A pod first learned from /pods: the runtime's copy replaces it, and a
	// change there is decoded once.
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "u2", Namespace: "ns", Name: "b", Phase: "Pending", Annotations: map[string]string{"alloc/gpu": "GPU-3"}}})
	calls := dec.Calls()
	s.ObserveSandbox(record.OriginCRI, readySandbox("u2", "ns", "b", "sb3", map[string]string{"alloc/gpu": "GPU-4", "alloc/fpga": "bad"}))
	if dec.Calls() != calls+1 {
		t.Errorf("decoder called %d times after a change, want 1", dec.Calls()-calls)
	}
	r = mustGet(t, s, "u2")
	if len(r.Devices) != 1 || r.Devices[0].IDs[0] != "GPU-4" {
		t.Errorf("devices %+v, want GPU-4", r.Devices)
	}
	if len(r.DecodeErrors) != 1 {
		t.Errorf("decode errors %v, want the fpga one", r.DecodeErrors)
	}
	if r.Provenance.Annotations.Origin != record.OriginCRI {
		t.Errorf("annotation source %q, want cri", r.Provenance.Annotations.Origin)
	}
}

func TestSpecReadBackFromDiskIsNotAChange(t *testing.T) {
	s := New(Options{Clock: newFakeClock()})
	var writes int
	s.dirty = func(string) { writes++ }
	// What a file gives back: no empty maps.
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "u1", Namespace: "ns", Name: "a", Phase: "Pending",
		Spec: model.PodSpec{Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}}})
	writes = 0
	// What a /pods decoder may build: an empty requests map.
	s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: "u1", Namespace: "ns", Name: "a", Phase: "Pending",
		Spec: model.PodSpec{Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp, Requests: map[string]string{}}}}}})
	if writes != 0 {
		t.Errorf("an equal spec was recorded as a change (%d writes)", writes)
	}
}

func TestRecordsAreSorted(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "b", "sb2", nil))
	clock.Advance(time.Second)
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "b", "sb1", nil))
	s.ObserveSandbox(record.OriginNRI, readySandbox("u3", "a", "z", "sb3", nil))
	var uids []string
	for _, r := range s.Records() {
		uids = append(uids, r.UID)
	}
	if want := []string{"u3", "u1", "u2"}; !slices.Equal(uids, want) {
		t.Errorf("Records order %v, want %v", uids, want)
	}
}

// A CRI reconcile that only confirms what NRI reported is not news: the
// record keeps NRI as the source of its sandbox, and nothing is rewritten
// (a reconcile every 30 s must not rewrite every pod's file).
func TestAReconcileThatAgreesChangesNothing(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	var dirty []string
	s.dirty = func(uid string) { dirty = append(dirty, uid) }
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil))
	before := mustGet(t, s, "u1")
	dirty = nil

	asOf := clock.Advance(time.Second)
	s.Reconcile(record.OriginCRI, asOf, []model.Sandbox{readySandbox("u1", "ns", "a", "sb1", nil)}, nil, true)

	after := mustGet(t, s, "u1")
	if after != before || len(dirty) != 0 {
		t.Errorf("an agreeing reconcile replaced the record (%v) and dirtied %v", after != before, dirty)
	}
	if after.Provenance.Sandbox.Origin != record.OriginNRI {
		t.Errorf("sandbox source = %s, want nri (who reported it), not cri (who confirmed it)", after.Provenance.Sandbox.Origin)
	}
	// A reconcile that does change something is recorded as its news.
	clock.Advance(time.Second)
	stopped := readySandbox("u1", "ns", "a", "sb1", nil)
	stopped.Ready = false
	s.Reconcile(record.OriginCRI, clock.Now(), []model.Sandbox{stopped}, nil, true)
	if r := mustGet(t, s, "u1"); r.State != record.PhaseStopped || r.Provenance.Sandbox.Origin != record.OriginCRI {
		t.Errorf("after CRI saw it stop: state %q source %s, want stopped by cri", r.State, r.Provenance.Sandbox.Origin)
	}
}

// The proxy reuses a List answer while Version stays put, so Version must
// move with every change a lookup could see, and should not move otherwise
// (a steady node would rebuild every answer for nothing).
func TestVersionMovesWithEveryChangeAndOnlyThen(t *testing.T) {
	clock := newFakeClock()
	s := New(Options{Clock: clock})
	v := s.Version()
	step := func(what string, change bool, fn func()) {
		t.Helper()
		fn()
		if moved := s.Version() != v; moved != change {
			t.Errorf("%s: version moved = %v, want %v", what, moved, change)
		}
		v = s.Version()
	}
	step("a new sandbox", true, func() { s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil)) })
	step("the same sandbox again", false, func() { s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "a", "sb1", nil)) })
	step("an agreeing reconcile", false, func() {
		s.Reconcile(record.OriginCRI, clock.Advance(time.Second), []model.Sandbox{readySandbox("u1", "ns", "a", "sb1", nil)}, nil, true)
	})
	step("the sandbox stopped", true, func() { s.SandboxStopped(record.OriginNRI, "sb1", "u1") })
	step("the sandbox removed", true, func() { s.SandboxRemoved(record.OriginNRI, "sb1", "u1") })
	clock.Advance(2 * DefaultPruneAfter)
	step("pruned", true, func() {
		if n := s.pruneRemoved(); n != 1 {
			t.Fatalf("pruned %d records, want 1", n)
		}
	})
}

func TestTheRuntimesAnnotationsAreTheAllocationOnceTheSandboxStarted(t *testing.T) {
	spec := model.PodSpec{Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}
	apiSays := func(s *Store, uid, name string, ann map[string]string) {
		s.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: uid, Namespace: "ns", Name: name, Phase: "Running", Annotations: ann, Spec: spec}})
	}
	ids := func(r *record.Record) map[string]string {
		out := map[string]string{}
		for _, d := range r.Devices {
			out[d.Type] = strings.Join(d.IDs, ",")
		}
		return out
	}
	s := New(Options{Decoder: &fakeDecoder{}, Clock: newFakeClock()})

	// /pods first (CNI ADD), then the runtime starts the sandbox with the
	// same annotations: the runtime's copy is now the allocation, held since
	// it was first seen.
	apiSays(s, "u1", "web-0", map[string]string{"alloc/gpu": "GPU-1"})
	firstSeen := mustGet(t, s, "u1").Provenance.Annotations.At
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb1", map[string]string{"alloc/gpu": "GPU-1"}))
	if r := mustGet(t, s, "u1"); r.Provenance.Annotations.Origin != record.OriginNRI || !r.Provenance.Annotations.At.Equal(firstSeen) {
		t.Fatalf("annotations source %+v, want nri since %v", r.Provenance.Annotations, firstSeen)
	}

	// An edit, a late key (a MIG annotation written after the start) and a
	// removal, in that order.
	apiSays(s, "u1", "web-0", map[string]string{"alloc/gpu": "GPU-2", "alloc/mig": "MIG-1"})
	r := mustGet(t, s, "u1")
	if got, want := ids(r), map[string]string{"gpu": "GPU-1", "mig": "MIG-1"}; !maps.Equal(got, want) {
		t.Errorf("after an edit and a late key: devices %v, want %v", got, want)
	}
	if !slices.Equal(r.Edited, []string{"alloc/gpu"}) {
		t.Errorf("edited %v, want [alloc/gpu]", r.Edited)
	}
	apiSays(s, "u1", "web-0", map[string]string{"alloc/mig": "MIG-1"})
	if r := mustGet(t, s, "u1"); ids(r)["gpu"] != "GPU-1" || !slices.Equal(r.Edited, []string{"alloc/gpu"}) {
		t.Errorf("after a removal: devices %v edited %v, want GPU-1 kept and the removal recorded", ids(r), r.Edited)
	}
	// The API agrees again: nothing is edited any more.
	apiSays(s, "u1", "web-0", map[string]string{"alloc/gpu": "GPU-1", "alloc/mig": "MIG-1"})
	if r := mustGet(t, s, "u1"); len(r.Edited) != 0 {
		t.Errorf("edited %v once the API agrees, want none", r.Edited)
	}

	// A pod whose sandbox started with no allocation gets none later.
	s.ObserveSandbox(record.OriginNRI, readySandbox("u2", "ns", "plain-0", "sb2", nil))
	apiSays(s, "u2", "plain-0", map[string]string{"alloc/gpu": "GPU-3"})
	if r := mustGet(t, s, "u2"); len(r.Devices) != 0 || !slices.Equal(r.Edited, []string{"alloc/gpu"}) {
		t.Errorf("an allocation added after the start: devices %v edited %v, want none and [alloc/gpu]", ids(r), r.Edited)
	}
}

// The runtime carries a pod's annotations whole (NRI's RunPodSandbox, CRI's
// ListPodSandbox): a tenant's 255 KiB hint must cost its record no more
// than /pods lets it cost, and a pod the runtime reports with what /pods
// reported must be the same pod to the store, its allocation held since
// /pods first showed it (the exclusive-device contest goes by that time).
func TestTheRuntimesAnnotationsAreBoundedAsThePodSourcesBoundThem(t *testing.T) {
	hint := strings.Repeat("h", 255<<10)
	huge := strings.Repeat("g", 100<<10)
	runtime := map[string]string{"alloc/gpu": "GPU-1", "alloc/hint": hint, "other": hint}
	clock := newFakeClock()
	dec := &fakeDecoder{}
	s := New(Options{Decoder: dec, Clock: clock})

	// What a pod source (/pods, the Pods API) keeps of the same pod.
	kept := annotationbound.Allocators(dec.MaxAnnotationBytes).Apply(runtime)
	s.ObserveKubeletPods(clock.Now(), nil, []model.KubeletPod{{UID: "u1", Namespace: "ns", Name: "web-0", Phase: "Pending", Annotations: kept}})
	firstSeen := mustGet(t, s, "u1").Provenance.Annotations.At
	clock.Advance(time.Second)
	s.ObserveSandbox(record.OriginNRI, readySandbox("u1", "ns", "web-0", "sb1", runtime))
	r := mustGet(t, s, "u1")
	if _, ok := model.Oversized(r.Annotations["alloc/hint"]); !ok || len(r.Annotations) != 2 || r.Annotations["alloc/gpu"] != "GPU-1" {
		t.Errorf("NRI's copy kept as %.100v; want alloc/gpu and alloc/hint refused for its size", r.Annotations)
	}
	if seen := r.Provenance.Annotations; seen.Origin != record.OriginNRI || !seen.At.Equal(firstSeen) {
		t.Errorf("annotations %+v, want nri since /pods showed them at %v", seen, firstSeen)
	}
	if len(r.Edited) != 0 {
		t.Errorf("edited %v: the runtime's copy differs from what /pods kept of the same annotations", r.Edited)
	}

	// A snapshot (CRI) of a pod no source showed before, with an
	// allocation too large to be one.
	sandboxes := []model.Sandbox{readySandbox("u2", "ns", "big-0", "sb2", map[string]string{"alloc/gpu": huge})}
	s.Reconcile(record.OriginCRI, clock.Now(), sandboxes, nil, true)
	if got := mustGet(t, s, "u2").Annotations["alloc/gpu"]; !strings.HasPrefix(got, model.OversizedAnnotation("")) {
		t.Errorf("CRI's copy of a 100 KiB allocation kept as %.60q..., want it refused for its size", got)
	}
	if sandboxes[0].Annotations["alloc/gpu"] != huge {
		t.Error("Reconcile changed the caller's sandboxes")
	}
}
