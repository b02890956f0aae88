package inventory_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
)

func TestRunReloadsSourcesAtTheirIntervalAndStopsWhenCancelled(t *testing.T) {
	src := inventorytest.NewFakeSource("fake", time.Millisecond)
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{src}, Logger: logrus.New()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	changed := inv.Changed()
	go func() { done <- inv.Run(ctx) }()

	src.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1", Healthy: true}}}
	<-changed
	if _, ok := inv.Snapshot().Lookup("GPU-1"); !ok {
		t.Fatal("the first answer is not in the inventory")
	}
	changed = inv.Changed()
	src.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-2", Healthy: true}}}
	<-changed
	if _, ok := inv.Snapshot().Lookup("GPU-2"); !ok {
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
	src := inventorytest.NewFakeSource("once", 0)
	src.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1"}}}
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{src}, Logger: logrus.New()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := inv.Run(ctx); err != nil {
		t.Fatalf("Run() = %v, want nil once every source is done", err)
	}
	if n := src.Loads(); n != 1 {
		t.Errorf("%d loads, want 1", n)
	}
}

func TestASourceThatPanicsIsLoggedAndTheOthersServe(t *testing.T) {
	bad := inventorytest.NewFakeSource("bad", 0)
	good := inventorytest.NewFakeSource("good", 0)
	bad.Answers <- inventorytest.Answer{Panic: "index out of range"}
	good.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1"}}}
	log, hook := inventorytest.QuietLogger()
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{bad, good}, Logger: log})
	inv.Refresh(context.Background())
	if _, ok := inv.Snapshot().Lookup("GPU-1"); !ok {
		t.Error("the good source's device is missing")
	}
	if errs := inventorytest.EntriesAt(hook, logrus.ErrorLevel); len(errs) != 1 || !strings.Contains(errs[0], "panicked: index out of range") {
		t.Errorf("errors logged = %q, want the panic", errs)
	}
}

func TestAnUnchangedInventoryIsNotRepublished(t *testing.T) {
	src := inventorytest.NewFakeSource("fake", 0)
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{src}, Logger: logrus.New()})
	devices := []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1", NUMANode: new(int64(0))}}
	src.Answers <- inventorytest.Answer{Devices: devices}
	inv.Refresh(context.Background())
	first, changed := inv.Snapshot(), inv.Changed()
	src.Answers <- inventorytest.Answer{Devices: devices}
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

// The daemon refreshes before serving and then runs the inventory: each
// source must be asked once at start, not twice (a second Device object
// read from the API server, a second sysfs scan).
func TestRunAfterRefreshDoesNotLoadAgainAtOnce(t *testing.T) {
	src := inventorytest.NewFakeSource("once", 0)
	src.Answers <- inventorytest.Answer{Devices: []inventory.Device{{Type: inventory.TypeGPU, ID: "GPU-1"}}}
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{src}, Logger: logrus.New()})
	inv.Refresh(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := inv.Run(ctx); err != nil {
		t.Fatalf("Run() = %v", err)
	}
	if n := src.Loads(); n != 1 {
		t.Errorf("%d loads for Refresh then Run, want 1", n)
	}
	if _, ok := inv.Snapshot().Lookup("GPU-1"); !ok {
		t.Error("the device Refresh loaded is gone")
	}
}

func TestNUMASourceNamesTheSourceThatGaveTheNodeNotTheOneThatGaveTheDevice(t *testing.T) {
	inv := inventorytest.TwoSourceInventory(t)
	for id, want := range map[string]string{
		inventorytest.GPU1: "source=device-cr numa=1 from sysfs",
		"0000:d8:00.0":     "source=device-cr numa=1 from sysfs",
		"0000:d8:00.2":     "source=device-cr numa=1 from sysfs",     // the Device object left the VF's node out
		"0000:d8:00.3":     "source=device-cr numa=0 from device-cr", // it wins over sysfs where it says one
	} {
		d, ok := inv.Snapshot().Lookup(id)
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
