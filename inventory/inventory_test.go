package inventory

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func TestRunReloadsSourcesAtTheirIntervalAndStopsWhenCancelled(t *testing.T) {
	src := newFakeSource("fake", time.Millisecond)
	inv := New(Options{Sources: []Source{src}, Logger: logrus.New()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	changed := inv.Changed()
	go func() { done <- inv.Run(ctx) }()

	src.answers <- answer{devices: []Device{{Type: TypeGPU, ID: "GPU-1", Healthy: true}}}
	<-changed
	if _, ok := inv.Lookup("GPU-1"); !ok {
		t.Fatal("the first answer is not in the inventory")
	}
	changed = inv.Changed()
	src.answers <- answer{devices: []Device{{Type: TypeGPU, ID: "GPU-2", Healthy: true}}}
	<-changed
	if _, ok := inv.Lookup("GPU-2"); !ok {
		t.Fatal("the second answer, loaded on the ticker, is not in the inventory")
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
}

func TestRunLoadsASourceWithoutIntervalOnce(t *testing.T) {
	src := newFakeSource("once", 0)
	src.answers <- answer{devices: []Device{{Type: TypeGPU, ID: "GPU-1"}}}
	inv := New(Options{Sources: []Source{src}, Logger: logrus.New()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := inv.Run(ctx); err != nil {
		t.Fatalf("Run() = %v, want nil once every source is done", err)
	}
	if src.loads != 1 {
		t.Errorf("%d loads, want 1", src.loads)
	}
}

func TestASourceThatPanicsIsLoggedAndTheOthersServe(t *testing.T) {
	bad := newFakeSource("bad", 0)
	good := newFakeSource("good", 0)
	bad.answers <- answer{panic: "index out of range"}
	good.answers <- answer{devices: []Device{{Type: TypeGPU, ID: "GPU-1"}}}
	log, hook := quietLogger()
	inv := New(Options{Sources: []Source{bad, good}, Logger: log})
	inv.Refresh(context.Background())
	if _, ok := inv.Lookup("GPU-1"); !ok {
		t.Error("the good source's device is missing")
	}
	if errs := entriesAt(hook, logrus.ErrorLevel); len(errs) != 1 || !strings.Contains(errs[0], "panicked: index out of range") {
		t.Errorf("errors logged = %q, want the panic", errs)
	}
}

func TestAnUnchangedInventoryIsNotRepublished(t *testing.T) {
	src := newFakeSource("fake", 0)
	inv := New(Options{Sources: []Source{src}, Logger: logrus.New()})
	devices := []Device{{Type: TypeGPU, ID: "GPU-1", NUMANode: ptr(0)}}
	src.answers <- answer{devices: devices}
	inv.Refresh(context.Background())
	first, changed := inv.Snapshot(), inv.Changed()
	src.answers <- answer{devices: devices}
	inv.Refresh(context.Background())
	if inv.Snapshot() != first {
		t.Error("the same answer published a new snapshot")
	}
	select {
	case <-changed:
		t.Error("Changed fired for the same answer")
	default:
	}
}

func TestNewFromConfigOrdersTheSourcesByPrecedence(t *testing.T) {
	api := newFakeAPIServer(t)
	node := newTwoNUMANode(t)
	path := t.TempDir() + "/inventory.json"
	// The file says the GPU the Device object calls unhealthy is on node 0;
	// sysfs says node 1.
	writeFile(t, path, `{"devices":[{"type":"gpu","id":"`+uuid1+`","numaNode":0,"index":5}]}`)
	inv, err := NewFromConfig(Config{
		DeviceCR: &DeviceCROptions{APIServer: api.URL, TokenFile: api.tokenFile, CAFile: api.caFile, NodeName: "node-1"},
		File:     path,
		Sysfs:    &SysfsOptions{SysfsRoot: node.sys, ProcRoot: node.proc},
		Logger:   logrus.New(),
	})
	if err != nil {
		t.Fatal(err)
	}
	inv.Refresh(context.Background())
	gpu, _ := inv.Lookup(uuid1)
	if want := "gpu id=" + uuid1 + " vendor=nvidia minor=0 index=5 bus=0000:af:00.0 numa=0 healthy=false vfs=[] source=device-cr"; describe(gpu) != want {
		t.Errorf("GPU = %s\nwant  %s", describe(gpu), want)
	}
	if _, err := NewFromConfig(Config{DeviceCR: &DeviceCROptions{}}); err == nil {
		t.Error("NewFromConfig accepted a Device object source without node name")
	}
}

// The daemon refreshes before serving and then runs the inventory: each
// source must be asked once at start, not twice (a second Device object
// read from the API server, a second sysfs scan).
func TestRunAfterRefreshDoesNotLoadAgainAtOnce(t *testing.T) {
	src := newFakeSource("once", 0)
	src.answers <- answer{devices: []Device{{Type: TypeGPU, ID: "GPU-1"}}}
	inv := New(Options{Sources: []Source{src}, Logger: logrus.New()})
	inv.Refresh(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := inv.Run(ctx); err != nil {
		t.Fatalf("Run() = %v", err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.loads != 1 {
		t.Errorf("%d loads for Refresh then Run, want 1", src.loads)
	}
	if _, ok := inv.Lookup("GPU-1"); !ok {
		t.Error("the device Refresh loaded is gone")
	}
}
