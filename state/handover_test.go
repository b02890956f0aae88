package state

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// A rolling update starts the new instance while the old one still writes
// the state directory: the new one must answer from what the old one wrote,
// touch no file until the old one lets go, then keep everything both
// learned meanwhile.
func TestAWaitingStoreTakesOverWithoutLosingWhatEitherLearned(t *testing.T) {
	dir := t.TempDir()
	old := openTest(t, dir, Options{})
	old.ObserveSandbox(record.OriginNRI, readySandbox("u-before", "ns", "before", "sb-before", nil))
	old.ObserveSandbox(record.OriginNRI, readySandbox("u-removed", "ns", "removed", "sb-removed", nil))
	old.ObserveSandbox(record.OriginNRI, readySandbox("u-pruned", "ns", "pruned", "sb-pruned", nil))
	if err := old.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A file the new instance cannot load is the writer's to set aside.
	corrupt := filepath.Join(dir, "pods", "u-corrupt.json")
	if err := os.WriteFile(corrupt, []byte("{not json"), 0o640); err != nil {
		t.Fatal(err)
	}

	log, said := newCapturedLog()
	neu, err := Open(dir, Options{Log: log, Wait: true})
	if err != nil {
		t.Fatalf("Open while another instance writes, with Wait: %v", err)
	}
	t.Cleanup(func() { neu.Close() })
	select {
	case <-neu.Writing():
		t.Fatal("the new store writes while the old one holds the lock")
	default:
	}
	if r := mustGet(t, neu, "u-before"); r.SandboxID != "sb-before" || !r.Live() {
		t.Errorf("the new store answers %+v for a pod the old one recorded, want its live sandbox", r)
	}
	if !strings.Contains(said.Text(), "waiting to become the writer") {
		t.Errorf("the new store did not say it waits to become the writer; it said:\n%s", said.Text())
	}

	// The overlap: both hear of a new sandbox and a removal (both NRI
	// plugins get every event); only the new one hears of another pod
	// (it started after the old one left NRI); only the old one pruned
	// a record.
	for _, s := range []*Store{old, neu} {
		s.ObserveSandbox(record.OriginNRI, readySandbox("u-new", "ns", "new", "sb-new", nil))
		s.SandboxRemoved(record.OriginNRI, "sb-removed", "u-removed")
	}
	neu.ObserveSandbox(record.OriginNRI, readySandbox("u-late", "ns", "late", "sb-late", nil))
	// The old one, stopping, still reads the kubelet's pods: it writes the
	// pod whose sandbox only the new one saw as pending, later.
	old.ObserveWatchedPod(model.KubeletPod{UID: "u-late", Namespace: "ns", Name: "late", Phase: "Pending",
		Spec: model.PodSpec{Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}})
	old.mu.Lock()
	old.delete("u-pruned")
	old.mu.Unlock()
	if err := old.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(corrupt); err != nil {
		t.Errorf("the waiting store touched a file it cannot load: %v", err)
	}
	if files := podFiles(t, dir); len(files) != 5 {
		t.Errorf("record files while the new store waits: %v; want the old writer's 4 and the unloadable one", files)
	}

	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-neu.Writing():
	case <-time.After(10 * time.Second):
		t.Fatal("the new store did not become the writer after the old one let go")
	}
	if err := neu.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(said.Text(), "became the writer") {
		t.Errorf("the new store did not say it became the writer; it said:\n%s", said.Text())
	}

	got := map[string]record.Phase{}
	records, errs := persist.ReadDir(dir)
	if len(errs) != 0 {
		t.Errorf("reading the directory after the handover: %v", errs)
	}
	for _, r := range records {
		got[r.UID] = r.State
	}
	want := map[string]record.Phase{"u-before": record.PhaseReady, "u-new": record.PhaseReady,
		"u-late": record.PhaseReady, "u-removed": record.PhaseRemoved}
	if len(got) != len(want) {
		t.Errorf("records on disk after the handover: %v, want %v", got, want)
	}
	for uid, phase := range want {
		if got[uid] != phase {
			t.Errorf("record %s on disk after the handover: %q, want %q", uid, got[uid], phase)
		}
	}
	if r := mustGet(t, neu, "u-late"); !r.Live() || r.Spec == nil {
		t.Errorf("the pod whose sandbox only the new store saw: live %v, spec %v; want its sandbox from the new store and its spec from the old", r.Live(), r.Spec)
	}
	if _, ok := neu.Get("u-pruned"); ok {
		t.Error("a record the old writer pruned during the overlap is still in the new store")
	}
	if st := neu.Stats(); !st.Writing || st.CorruptFiles != 1 {
		t.Errorf("new store's stats after the handover: writing %v, corrupt files %d; want writing and the unloadable file set aside", st.Writing, st.CorruptFiles)
	}
}

// Of a record both instances changed during the overlap, the newer wins;
// a record only the new instance deleted stays deleted.
func TestTheNewerRecordWinsAHandover(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	old := openTest(t, dir, Options{Clock: clock})
	old.ObserveSandbox(record.OriginNRI, readySandbox("u-a", "ns", "a", "sb-a", nil))
	old.ObserveSandbox(record.OriginNRI, readySandbox("u-b", "ns", "b", "sb-b", nil))
	old.ObserveSandbox(record.OriginNRI, readySandbox("u-c", "ns", "c", "sb-c", nil))
	if err := old.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	neu, err := Open(dir, Options{Log: quietLog(), Clock: clock, Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { neu.Close() })

	clock.Advance(time.Second)
	neu.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-a", SandboxID: "sb-a", Name: "app", State: model.ContainerRunning})
	old.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-b", SandboxID: "sb-b", Name: "app", State: model.ContainerRunning})
	clock.Advance(time.Second)
	old.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-a", SandboxID: "sb-a", Name: "app", State: model.ContainerStopped})
	neu.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-b", SandboxID: "sb-b", Name: "app", State: model.ContainerStopped})
	neu.mu.Lock()
	neu.delete("u-c")
	neu.mu.Unlock()
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-neu.Writing():
	case <-time.After(10 * time.Second):
		t.Fatal("the new store did not become the writer")
	}
	if got := containerStates(mustGet(t, neu, "u-a"))["c-a"]; got != model.ContainerStopped {
		t.Errorf("u-a's container after the handover: %q, want the old writer's newer %q", got, model.ContainerStopped)
	}
	if got := containerStates(mustGet(t, neu, "u-b"))["c-b"]; got != model.ContainerStopped {
		t.Errorf("u-b's container after the handover: %q, want the new store's newer %q", got, model.ContainerStopped)
	}
	if _, ok := neu.Get("u-c"); ok {
		t.Error("a record the new store deleted came back from the old writer's file")
	}
	if err := neu.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pods", "u-c.json")); !os.IsNotExist(err) {
		t.Errorf("the deleted record's file after the handover: %v, want it removed", err)
	}
}

// A second instance that stops before the first lets go writes nothing
// and stops at once.
func TestAWaitingStoreClosesWithoutWriting(t *testing.T) {
	dir := t.TempDir()
	old := openTest(t, dir, Options{})
	neu, err := Open(dir, Options{Log: quietLog(), Wait: true})
	if err != nil {
		t.Fatal(err)
	}
	neu.ObserveSandbox(record.OriginNRI, readySandbox("u-x", "ns", "x", "sb-x", nil))
	if err := neu.Close(); err != nil {
		t.Errorf("closing a store that never became the writer: %v", err)
	}
	if files := podFiles(t, dir); len(files) != 0 {
		t.Errorf("a store that never became the writer wrote %v", files)
	}
	if _, ok := old.Get("u-x"); ok {
		t.Fatal("the stores share memory")
	}
}
