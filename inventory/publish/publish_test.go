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

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

func TestPublishWritesTheInventoryWithTheSourceOfEachNUMANode(t *testing.T) {
	inv := inventorytest.TwoSourceInventory(t)
	path := filepath.Join(t.TempDir(), FileName)
	before := time.Now()
	if err := New(inv, path, nil).Publish(); err != nil {
		t.Fatal(err)
	}
	after := time.Now()

	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != Version || got.WrittenAt.Before(before) || got.WrittenAt.After(after) || got.WrittenAt.Location() != time.UTC {
		t.Errorf("version %d, writtenAt %v; want %d and the time of the write in UTC", got.Version, got.WrittenAt, Version)
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
	for _, want := range []string{"{\n  \"version\": 1,\n  \"writtenAt\": \"" + got.WrittenAt.Format(time.RFC3339Nano) + "\",", `"numaSource": "sysfs"`, `"source": "device-cr"`} {
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

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	holds := func(id string) func() bool {
		return func() bool {
			f, err := Read(path)
			if err != nil {
				return false
			}
			_, ok := f.Snapshot().Lookup(id)
			return ok && len(f.Devices) == 1
		}
	}
	poll.Until(t, "the first write, with GPU-1", holds("GPU-1"))

	src.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-2", NUMANode: new(int64(1)), Healthy: true}}}
	inv.Refresh(context.Background())
	poll.Until(t, "the write after the change, with GPU-2 only", holds("GPU-2"))
	written := mustRead(t, path).WrittenAt

	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	if again := mustRead(t, path).WrittenAt; !again.Equal(written) {
		t.Errorf("the file was written again at %v without a change of the inventory", again)
	}
}

// A failed write is logged once however often it fails again, and the
// recovery is logged; Run retries until the write succeeds.
func TestAFailedWriteIsLoggedOnceAndRetried(t *testing.T) {
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Logger: log})
	dir := filepath.Join(t.TempDir(), "not-yet")
	p := New(inv, filepath.Join(dir, FileName), log)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	poll.Until(t, "Run's failed write", func() bool { return len(inventorytest.EntriesAt(hook, logrus.ErrorLevel)) > 0 })
	for range 2 {
		if err := p.Publish(); err == nil {
			t.Fatal("a write into a missing directory succeeded")
		}
	}
	if errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel); len(errs) != 1 {
		t.Errorf("errors logged %q, want the failure once", errs)
	}
	inventorytest.MkdirAll(t, dir)
	poll.Until(t, "Run's retried write", func() bool { _, err := Read(p.path); return err == nil })
	cancel()
	<-done
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
