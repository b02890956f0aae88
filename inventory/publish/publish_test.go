package publish

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

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
)

func TestPublishWritesTheInventoryWithTheSourceOfEachNUMANode(t *testing.T) {
	inv := inventorytest.TwoSourceInventory(t)
	path := filepath.Join(t.TempDir(), FileName)
	p := New(inv, path, nil)
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.FixedZone("CET", 3600))
	p.clock = testingclock.NewFakePassiveClock(at)
	if err := p.Publish(); err != nil {
		t.Fatal(err)
	}

	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != Version || !got.WrittenAt.Equal(at) || got.WrittenAt.Location() != time.UTC {
		t.Errorf("version %d, writtenAt %v; want %d and %v in UTC", got.Version, got.WrittenAt, Version, at)
	}
	if !slices.Equal(got.Sources, []string{inventory.SourceDeviceCR, inventory.SourceSysfs}) {
		t.Errorf("sources %v, want the configured ones in precedence order", got.Sources)
	}
	vf, ok := got.Snapshot().Lookup("0000:d8:00.2")
	if !ok || vf.NUMANode == nil || *vf.NUMANode != 1 || vf.NUMASource != inventory.SourceSysfs || vf.PhysFn != "0000:d8:00.0" {
		t.Errorf("the published VF reads %s numaSource=%s, want node 1 from sysfs, PF 0000:d8:00.0", inventorytest.Describe(vf), vf.NUMASource)
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
	inv := inventory.New(inventory.Options{Logger: logrus.New()})
	path := filepath.Join(t.TempDir(), FileName)
	if err := New(inv, path, nil).Publish(); err != nil {
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
	inventorytest.WriteFile(t, stale, "{")
	inventorytest.WriteFile(t, other, "{")
	if err := New(inventory.New(inventory.Options{Logger: logrus.New()}), filepath.Join(dir, FileName), nil).Publish(); err != nil {
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
	src := inventorytest.NewFakeSource(inventory.SourceFile, 0)
	src.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1", NUMANode: new(int64(0)), Healthy: true}}}
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{src}, Logger: logrus.New()})
	inv.Refresh(context.Background())
	path := filepath.Join(t.TempDir(), FileName)
	p := New(inv, path, nil)
	writes := make(chan error, 16)
	p.written = func(_ *inventory.Snapshot, err error) { writes <- err }

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	if err := await(t, writes); err != nil {
		t.Fatal(err)
	}
	if _, ok := mustRead(t, path).Snapshot().Lookup("GPU-1"); !ok {
		t.Error("the first write lacks GPU-1")
	}

	src.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-2", NUMANode: new(int64(1)), Healthy: true}}}
	inv.Refresh(context.Background())
	if err := await(t, writes); err != nil {
		t.Fatal(err)
	}
	snap := mustRead(t, path).Snapshot()
	if _, ok := snap.Lookup("GPU-2"); !ok || len(snap.Devices()) != 1 {
		t.Errorf("after the change the file holds %v, want GPU-2 only", inventorytest.DescribeAll(snap.Devices()))
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
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Logger: log})
	dir := filepath.Join(t.TempDir(), "not-yet")
	p := New(inv, filepath.Join(dir, FileName), log)
	p.retryMin = time.Millisecond
	writes := make(chan error, 64)
	p.written = func(_ *inventory.Snapshot, err error) { writes <- err }

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	for range 3 {
		if err := await(t, writes); err == nil {
			t.Fatal("a write into a missing directory succeeded")
		}
	}
	inventorytest.MkdirAll(t, dir)
	for await(t, writes) != nil {
	}
	cancel()
	<-done
	if _, err := Read(p.path); err != nil {
		t.Errorf("after the directory appeared: %v", err)
	}
	if errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel); len(errs) != 1 {
		t.Errorf("errors logged %q, want the failure once", errs)
	}
	if infos := inventorytest.EntriesAt(hook, logrus.InfoLevel); !slices.Contains(infos, "inventory file written again") {
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
		inventorytest.WriteFile(t, path, content)
		if _, err := Read(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: err %v, want an error naming the file", name, err)
		}
	}
	// Fields a later version adds are ignored.
	path := filepath.Join(dir, "newer")
	inventorytest.WriteFile(t, path, `{"version": 1, "devices": [{"type": "gpu", "id": "GPU-1", "healthy": true, "source": "file", "color": "red"}], "extra": {}}`)
	if p, err := Read(path); err != nil || len(p.Devices) != 1 {
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

func mustRead(t *testing.T, path string) *File {
	t.Helper()
	p, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadPublishedDoesNotFollowASymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := Write(real, &File{Version: Version}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FileName)
	if err := os.Symlink(real, path); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("ReadPublished of a planted symlink: got %v, want an error naming the link", err)
	}
}
