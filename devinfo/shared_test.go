package devinfo_test

import (
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// The device-info directory is shared with the SR-IOV device plugin,
// Multus and anything else with a hostPath of it, so whatever is found at
// a device's path must neither hang the writer nor grow the daemon.

// hangGuard bounds how long a test waits for a call that must not block;
// it fails the test rather than hang it. It measures nothing.
const hangGuard = 10 * time.Second

// returns runs f and reports whether it returned within hangGuard; a call
// still blocked is left to cleanup, which must unblock it.
func returns(t *testing.T, what string, f func()) bool {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	t.Cleanup(func() { <-done })
	select {
	case <-done:
		return true
	case <-time.After(hangGuard):
		t.Errorf("%s did not return within %v", what, hangGuard)
		return false
	}
}

// A FIFO at one VF's path (a reader opening it blocks until a writer
// comes) must not hang the answers of that pod or of any other.
func TestAFIFOAtAVFsPathHangsNoAnswer(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir)
	fifo := w.Path(rdma, vf)
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	// A reader blocked in open is released by a writer opening the FIFO;
	// deferred, this runs before the cleanups that wait for the reader.
	defer func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}()
	if !returns(t, "Hold of the VF whose path is a FIFO", func() { w.Hold(pod, []model.Device{vfDevice(vf)}) }) {
		return
	}
	if !returns(t, "Hold of another device", func() { w.Hold(pod, []model.Device{vfDevice(pf)}) }) {
		return
	}
	if _, ok := read(t, w.Path(rdma, pf)); !ok {
		t.Error("the other device's file was not written")
	}
	if !returns(t, "Release", func() { w.Release(func() []*record.Record { return nil }) }) {
		return
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode().Type() != os.ModeNamedPipe {
		t.Errorf("the FIFO, another writer's, was replaced or removed: %v %v", fi, err)
	}
}

// A symbolic link at a device's path to a file larger than the daemon's
// memory limit, or a plain file that large, is neither read nor touched.
func TestAHugeFileAtADevicesPathIsNotRead(t *testing.T) {
	dir, elsewhere := t.TempDir(), t.TempDir()
	w := newWriter(t, dir)
	const huge = 256 << 20 // over the DaemonSet's 128 MiB; sparse, no disk
	big := filepath.Join(elsewhere, "big")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, huge); err != nil {
		t.Fatal(err)
	}
	link := w.Path(rdma, vf)
	if err := os.Symlink(big, link); err != nil {
		t.Fatal(err)
	}
	plain := w.Path(rdma, pf)
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(plain, huge); err != nil {
		t.Fatal(err)
	}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	w.Hold(pod, []model.Device{vfDevice(vf), vfDevice(pf)})
	w.Adopt(rdma)
	w.Release(func() []*record.Record { return nil })
	runtime.ReadMemStats(&after)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Errorf("writing, adopting and releasing around %d MiB files allocated %d MiB: they were read", huge>>20, grew>>20)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode().Type() != os.ModeSymlink {
		t.Errorf("the symbolic link, another writer's, was replaced or removed: %v %v", fi, err)
	}
	for _, p := range []string{big, plain} {
		if fi, err := os.Stat(p); err != nil || fi.Size() != huge {
			t.Errorf("%s was changed: %v %v", p, fi, err)
		}
	}
}

// A symbolic link at a device's path to /dev/zero, which never ends, is
// not read: reading it would grow the daemon until it is killed.
//
// Without the fix this test eats memory fast; run it under a memory limit
// (ulimit -v) when checking that.
func TestASymlinkToDevZeroAtADevicesPathIsNotRead(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir)
	link := w.Path(rdma, vf)
	if err := os.Symlink("/dev/zero", link); err != nil {
		t.Fatal(err)
	}
	if !returns(t, "Hold of the VF whose path links to /dev/zero", func() { w.Hold(pod, []model.Device{vfDevice(vf)}) }) {
		return
	}
	if !returns(t, "Adopt", func() { w.Adopt(rdma) }) {
		return
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode().Type() != os.ModeSymlink {
		t.Errorf("the symbolic link, another writer's, was replaced or removed: %v %v", fi, err)
	}
}

// The writer does its I/O outside its lock, so a Release running while a
// pod is answered must still never remove the file of a device that pod
// holds: its record is in the store before the answer (Hold), so Release
// either sees it among the records or sees that Hold wanted the file after
// it read them.
func TestReleaseNeverRemovesAFileHoldWantsMeanwhile(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir)
	path := w.Path(rdma, vf)
	none := []*record.Record{}
	holding := []*record.Record{podRecord("uid-1", record.PhaseReady, vfDevice(vf))}
	var recs atomic.Pointer[[]*record.Record]
	recs.Store(&none)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				w.Release(func() []*record.Record { return *recs.Load() })
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for i := range 100 {
		recs.Store(&holding)                      // the store learns the pod...
		w.Hold(pod, []model.Device{vfDevice(vf)}) // ...then it is answered
		if _, err := os.Lstat(path); err != nil {
			t.Fatalf("round %d: the file of a VF a live pod holds is gone right after its answer: %v", i, err)
		}
		recs.Store(&none) // the pod goes
		w.Release(func() []*record.Record { return *recs.Load() })
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Fatalf("round %d: the file of a VF no pod holds is still there after a Release: %v", i, err)
		}
	}
}
