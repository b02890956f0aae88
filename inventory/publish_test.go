package inventory

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/sirupsen/logrus"
)

// twoSourceInventory is an inventory whose Device object knows a GPU and a
// PF without their NUMA nodes, and whose sysfs knows the nodes.
func twoSourceInventory(t *testing.T) (*Inventory, *fakeSource, *fakeSource) {
	t.Helper()
	cr := newFakeSource(SourceDeviceCR, 0)
	sys := newFakeSource(SourceSysfs, 0)
	cr.answers <- answer{devices: []Device{
		{Type: TypeGPU, ID: uuid1, BusID: "0000:af:00.0", Healthy: true},
		{Type: TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", Healthy: true,
			VFs: []VF{{BusID: "0000:d8:00.2"}, {BusID: "0000:d8:00.3", NUMANode: ptr(0)}}},
	}}
	sys.answers <- answer{devices: []Device{
		{Type: TypeGPU, ID: uuid1, BusID: "0000:af:00.0", NUMANode: ptr(1), Healthy: true},
		{Type: TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", NUMANode: ptr(1), Healthy: true,
			VFs: []VF{{BusID: "0000:d8:00.2", NUMANode: ptr(1)}, {BusID: "0000:d8:00.3", NUMANode: ptr(1)}}},
	}}
	inv := New(Options{Sources: []Source{cr, sys}, Logger: logrus.New()})
	inv.Refresh(context.Background())
	return inv, cr, sys
}

func TestNUMASourceNamesTheSourceThatGaveTheNodeNotTheOneThatGaveTheDevice(t *testing.T) {
	inv, _, _ := twoSourceInventory(t)
	for id, want := range map[string]string{
		uuid1:          "source=device-cr numa=1 from sysfs",
		"0000:d8:00.0": "source=device-cr numa=1 from sysfs",
		"0000:d8:00.2": "source=device-cr numa=1 from sysfs",     // the Device object left the VF's node out
		"0000:d8:00.3": "source=device-cr numa=0 from device-cr", // it wins over sysfs where it says one
	} {
		d, ok := inv.Lookup(id)
		if !ok {
			t.Fatalf("Lookup(%s) found nothing", id)
		}
		numa := "?"
		if d.NUMANode != nil {
			numa = string(rune('0' + *d.NUMANode))
		}
		if got := "source=" + d.Source + " numa=" + numa + " from " + d.NUMASource; got != want {
			t.Errorf("%s: %s, want %s", id, got, want)
		}
	}
}

func TestPublishWritesTheInventoryWithTheSourceOfEachNUMANode(t *testing.T) {
	inv, _, _ := twoSourceInventory(t)
	path := filepath.Join(t.TempDir(), PublishedFileName)
	p := NewPublisher(inv, path)
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.FixedZone("CET", 3600))
	p.clock = testingclock.NewFakePassiveClock(at)
	if err := p.Publish(); err != nil {
		t.Fatal(err)
	}

	got, err := ReadPublished(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != PublishedVersion || !got.WrittenAt.Equal(at) || got.WrittenAt.Location() != time.UTC {
		t.Errorf("version %d, writtenAt %v; want %d and %v in UTC", got.Version, got.WrittenAt, PublishedVersion, at)
	}
	if !slices.Equal(got.Sources, []string{SourceDeviceCR, SourceSysfs}) {
		t.Errorf("sources %v, want the configured ones in precedence order", got.Sources)
	}
	vf, ok := got.Snapshot().Lookup("0000:d8:00.2")
	if !ok || vf.NUMANode == nil || *vf.NUMANode != 1 || vf.NUMASource != SourceSysfs || vf.PhysFn != "0000:d8:00.0" {
		t.Errorf("the published VF reads %s numaSource=%s, want node 1 from sysfs, PF 0000:d8:00.0", describe(vf), vf.NUMASource)
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"{\n  \"version\": 1,\n  \"writtenAt\": \"2025-03-01T11:00:00Z\",", `"numaSource": "sysfs"`, `"source": "device-cr"`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the file lacks %q:\n%s", want, data)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v (%v), want 0640 like the records", fi.Mode(), err)
	}
}

func TestPublishOfAnEmptyInventoryWritesEmptyLists(t *testing.T) {
	inv := New(Options{Logger: logrus.New()})
	path := filepath.Join(t.TempDir(), PublishedFileName)
	if err := NewPublisher(inv, path).Publish(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), `"sources": [],`) || !strings.Contains(string(data), `"devices": []`) {
		t.Errorf("an empty inventory must give [] lists, for jq:\n%s", data)
	}
}

func TestPublishRemovesTemporaryFilesOfAnInterruptedWriteAndLeavesOthers(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, ".inventory.json.123.tmp")
	other := filepath.Join(dir, ".abc.json.123.tmp") // a record writer's, not ours
	writeFile(t, stale, "{")
	writeFile(t, other, "{")
	if err := NewPublisher(New(Options{Logger: logrus.New()}), filepath.Join(dir, PublishedFileName)).Publish(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale temporary file is still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another writer's temporary file was removed: %v", err)
	}
}

func TestRunRewritesTheFileWhenTheInventoryChangesAndStopsWhenCancelled(t *testing.T) {
	src := newFakeSource(SourceFile, 0)
	src.answers <- answer{devices: []Device{{Type: TypeGPU, ID: "GPU-1", NUMANode: ptr(0), Healthy: true}}}
	inv := New(Options{Sources: []Source{src}, Logger: logrus.New()})
	inv.Refresh(context.Background())
	path := filepath.Join(t.TempDir(), PublishedFileName)
	p := NewPublisher(inv, path)
	writes := make(chan error, 16)
	p.written = func(_ *Snapshot, err error) { writes <- err }

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	if err := await(t, writes); err != nil {
		t.Fatal(err)
	}
	if _, ok := mustReadPublished(t, path).Snapshot().Lookup("GPU-1"); !ok {
		t.Error("the first write lacks GPU-1")
	}

	src.answers <- answer{devices: []Device{{Type: TypeGPU, ID: "GPU-2", NUMANode: ptr(1), Healthy: true}}}
	inv.Refresh(context.Background())
	if err := await(t, writes); err != nil {
		t.Fatal(err)
	}
	snap := mustReadPublished(t, path).Snapshot()
	if _, ok := snap.Lookup("GPU-2"); !ok || len(snap.Devices()) != 1 {
		t.Errorf("after the change the file holds %v, want GPU-2 only", describeAll(snap.Devices()))
	}

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if len(writes) != 0 {
		t.Errorf("%d writes without a change of the inventory", len(writes))
	}
}

func TestRunRetriesAFailedWriteAndLogsTheErrorOnce(t *testing.T) {
	log, hook := quietLogger()
	inv := New(Options{Logger: log})
	dir := filepath.Join(t.TempDir(), "not-yet")
	p := NewPublisher(inv, filepath.Join(dir, PublishedFileName))
	p.retryMin = time.Millisecond
	writes := make(chan error, 64)
	p.written = func(_ *Snapshot, err error) { writes <- err }

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	for range 3 {
		if err := await(t, writes); err == nil {
			t.Fatal("a write into a missing directory succeeded")
		}
	}
	mkdirAll(t, dir)
	for await(t, writes) != nil {
	}
	cancel()
	<-done
	if _, err := ReadPublished(p.path); err != nil {
		t.Errorf("after the directory appeared: %v", err)
	}
	if errs := entriesAt(hook, logrus.ErrorLevel); len(errs) != 1 {
		t.Errorf("errors logged %q, want the failure once", errs)
	}
	if infos := entriesAt(hook, logrus.InfoLevel); !slices.Contains(infos, "inventory file written again") {
		t.Errorf("the recovery was not logged: %q", infos)
	}
}

func TestReadPublishedRefusesAnotherVersion(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"v2":         `{"version": 2, "devices": []}`,
		"no-version": `{"devices": []}`,
		"not-json":   `{"version": 1, "devices": [`,
	} {
		path := filepath.Join(dir, name)
		writeFile(t, path, content)
		if _, err := ReadPublished(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err %v, want an error naming the file", name, err)
		}
	}
	// Fields a later version adds are ignored.
	path := filepath.Join(dir, "newer")
	writeFile(t, path, `{"version": 1, "devices": [{"type": "gpu", "id": "GPU-1", "healthy": true, "source": "file", "color": "red"}], "extra": {}}`)
	if p, err := ReadPublished(path); err != nil || len(p.Devices) != 1 {
		t.Errorf("a file with an added field: %v, %v", p, err)
	}
}

// await returns the next write's result, failing the test when none comes.
func await(t *testing.T, writes <-chan error) error {
	t.Helper()
	select {
	case err := <-writes:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("no write within 10s")
		return nil
	}
}

func mustReadPublished(t *testing.T, path string) *Published {
	t.Helper()
	p, err := ReadPublished(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadPublishedDoesNotFollowASymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := WritePublished(real, &Published{Version: PublishedVersion}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, PublishedFileName)
	if err := os.Symlink(real, path); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPublished(path); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("ReadPublished of a planted symlink: got %v, want an error naming the link", err)
	}
}
