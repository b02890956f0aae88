package devinfo_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/devinfo"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

const (
	rdma = "koordinator.sh/rdma"
	pf   = "0000:3b:00.0"
	vf   = "0000:3b:02.1"
)

// fakeSysfs is a sysfs with a Mellanox PF and one of its VFs, which has
// the RDMA device mlx5_3.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	devs := filepath.Join(root, "bus", "pci", "devices")
	for _, p := range []string{filepath.Join(devs, pf), filepath.Join(devs, vf, "infiniband", "mlx5_3")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../"+pf, filepath.Join(devs, vf, "physfn")); err != nil {
		t.Fatal(err)
	}
	return root
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func newWriter(t *testing.T, dir string) *devinfo.Writer {
	return devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: fakeSysfs(t), Log: quiet()})
}

var pod = model.PodRef{UID: "uid-1", Namespace: "net", Name: "rdma"}

func vfDevice(id string) model.Device {
	return model.Device{Allocator: "koordinator", Type: "rdma", Resource: rdma, IDs: []string{id}}
}

// podRecord is a live pod holding devs.
func podRecord(uid string, phase record.Phase, devs ...model.Device) *record.Record {
	return &record.Record{UID: uid, State: phase, Devices: devs}
}

func read(t *testing.T, path string) (devinfo.Info, bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return devinfo.Info{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var in devinfo.Info
	if err := json.Unmarshal(b, &in); err != nil {
		t.Fatalf("%s is not device-info: %v", path, err)
	}
	return in, true
}

// The file is where Multus looks for it (resource and id with "/" as "-"),
// and says what sriov-cni's device plugin would: the VF's address, its PF,
// its RDMA device.
func TestAVFsFileSaysWhatSysfsKnows(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir)
	w.Hold(pod, []model.Device{vfDevice(vf), {Allocator: "koordinator", Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{"GPU-x"}}})
	path := filepath.Join(dir, "koordinator.sh-rdma-"+vf+"-device.json")
	if w.Path(rdma, vf) != path {
		t.Errorf("Path = %s, want %s", w.Path(rdma, vf), path)
	}
	in, ok := read(t, path)
	want := devinfo.Info{Type: "pci", Version: "1.1.0", PCI: devinfo.PCI{PCIAddress: vf, PFPCIAddress: pf, RDMADevice: "mlx5_3"}}
	if !ok || in != want {
		t.Errorf("device-info = %+v (exists %v), want %+v", in, ok, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d files, want the VF's only (no GPU's, no temporary file)", len(entries))
	}
	// A PF without VFs: its address, nothing sysfs does not say.
	w.Hold(pod, []model.Device{vfDevice(pf)})
	if in, _ := read(t, w.Path(rdma, pf)); in.PCI != (devinfo.PCI{PCIAddress: pf}) {
		t.Errorf("the PF's device-info = %+v", in)
	}
}

// The file lives as long as a live pod (running or pending) holds the
// device, and goes when none does.
func TestAFileGoesWhenNoLivePodHoldsItsDevice(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir)
	w.Hold(pod, []model.Device{vfDevice(vf)})
	path := w.Path(rdma, vf)
	recs := []*record.Record{podRecord("uid-1", record.PhaseReady, vfDevice(vf))}
	if n := w.Release(func() []*record.Record { return recs }); n != 0 {
		t.Fatalf("released %d files of a running pod's VF", n)
	}
	recs = []*record.Record{podRecord("uid-1", record.PhaseStopped, vfDevice(vf)), podRecord("uid-2", record.PhasePending, vfDevice(vf))}
	if n := w.Release(func() []*record.Record { return recs }); n != 0 {
		t.Fatalf("released %d files of a pending pod's VF", n)
	}
	recs = []*record.Record{podRecord("uid-2", record.PhaseRemoved, vfDevice(vf))}
	if n := w.Release(func() []*record.Record { return recs }); n != 1 {
		t.Fatalf("released %d files, want the VF's", n)
	}
	if _, ok := read(t, path); ok {
		t.Error("the file is still there with no pod holding the VF")
	}
	w.Hold(pod, []model.Device{vfDevice(vf)})
	if _, ok := read(t, path); !ok {
		t.Error("the file was not written again for the VF's next pod")
	}
}

// A file another writer made (the SR-IOV device plugin's) is neither
// overwritten nor removed.
func TestAnotherWritersFileIsLeftAlone(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir)
	path := w.Path(rdma, vf)
	theirs := []byte(`{"type":"pci","version":"1.0.0","pci":{"pci-address":"` + vf + `"}}`)
	if err := os.WriteFile(path, theirs, 0o444); err != nil {
		t.Fatal(err)
	}
	w.Hold(pod, []model.Device{vfDevice(vf)})
	w.Release(func() []*record.Record { return nil })
	if b, err := os.ReadFile(path); err != nil || string(b) != string(theirs) {
		t.Errorf("another writer's file became %q (%v)", b, err)
	}

	// Ours, replaced by another writer afterwards: theirs now.
	w.Hold(pod, []model.Device{vfDevice(pf)})
	path = w.Path(rdma, pf)
	if err := os.WriteFile(path, theirs, 0o644); err != nil {
		t.Fatal(err)
	}
	w.Release(func() []*record.Record { return nil })
	if b, err := os.ReadFile(path); err != nil || string(b) != string(theirs) {
		t.Errorf("a file another writer replaced became %q (%v)", b, err)
	}
}

// After a restart, a file the previous process wrote (the same content)
// is adopted, and removed once its pod is gone.
func TestARestartedWriterAdoptsItsOwnFiles(t *testing.T) {
	dir, sysfs := t.TempDir(), fakeSysfs(t)
	devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: sysfs, Log: quiet()}).Hold(pod, []model.Device{vfDevice(vf)})
	w := devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: sysfs, Log: quiet()})
	w.Hold(pod, []model.Device{vfDevice(vf)})
	if n := w.Release(func() []*record.Record { return nil }); n != 1 {
		t.Errorf("released %d files, want the previous process's", n)
	}
}

// Run releases once the store changes, without being asked.
func TestRunReleasesWhenThePodGoes(t *testing.T) {
	dir := t.TempDir()
	w := newWriter(t, dir)
	store := state.New(state.Options{})
	w.Hold(pod, []model.Device{vfDevice(vf)})
	ctx, cancel := contextWithCancel(t)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, store, time.Millisecond) }()
	store.ObserveSandbox(record.OriginNRI, model.Sandbox{ID: "s", UID: "uid-9", Namespace: "x", Name: "y", Ready: true})
	poll.Until(t, "the file of a device no pod holds to go", func() bool {
		_, ok := read(t, w.Path(rdma, vf))
		return !ok
	})
	cancel()
	if err := <-done; err == nil {
		t.Error("Run returned nil when its context ended")
	}
}

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx, cancel
}

// A file an earlier run left for a pod that went while the daemon was down
// is adopted at start and released; another writer's file is not.
func TestFilesOfAnEarlierRunAreAdoptedAndReleased(t *testing.T) {
	dir, sysfs := t.TempDir(), fakeSysfs(t)
	devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: sysfs, Log: quiet()}).Hold(pod, []model.Device{vfDevice(vf)})
	w := devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: sysfs, Log: quiet()})
	theirs := w.Path(rdma, pf)
	if err := os.WriteFile(theirs, []byte(`{"type":"pci","version":"1.0.0","pci":{"pci-address":"`+pf+`"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := w.Adopt(rdma); n != 1 {
		t.Errorf("adopted %d files, want the earlier run's one", n)
	}
	w.Release(func() []*record.Record { return nil })
	if _, ok := read(t, w.Path(rdma, vf)); ok {
		t.Error("the earlier run's file of a device no pod holds is still there")
	}
	if _, ok := read(t, theirs); !ok {
		t.Error("another writer's file was removed")
	}
}

// Adopt takes only files named for a device of the resources it is given.
func TestAdoptTakesOnlyItsResourcesFiles(t *testing.T) {
	dir, sysfs := t.TempDir(), fakeSysfs(t)
	devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: sysfs, Log: quiet()}).Hold(pod, []model.Device{vfDevice(vf)})
	// Another resource's file with the same content: a device plugin's.
	same, err := os.ReadFile(filepath.Join(dir, "koordinator.sh-rdma-"+vf+"-device.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "intel.com-sriov-"+vf+"-device.json"), same, 0o644); err != nil {
		t.Fatal(err)
	}
	w := devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: sysfs, Log: quiet()})
	if n := w.Adopt(rdma); n != 1 {
		t.Errorf("adopted %d files, want koordinator.sh/rdma's one", n)
	}
	w.Release(func() []*record.Record { return nil })
	if _, err := os.Stat(filepath.Join(dir, "intel.com-sriov-"+vf+"-device.json")); err != nil {
		t.Errorf("another resource's file was removed: %v", err)
	}
}

// otherPF is the PF the inventory names for vf, unlike fakeSysfs, so that a
// file shows which of them it was read from.
const otherPF = "0000:5e:00.0"

func inventoryWithVF() func() *inventory.Snapshot {
	snap := inventory.NewSnapshot([]inventory.Device{{Type: inventory.TypeRDMA, ID: otherPF, BusID: otherPF, Healthy: true, VFs: []inventory.VF{{BusID: vf}}}})
	return func() *inventory.Snapshot { return snap }
}

// With sysfs off (an empty --sysfs-root), or a sysfs that does not show the VF
// (a VM, a container without /sys/bus/pci), the PF still comes from the
// inventory, which lists each NIC's VFs. sysfs, when it shows the VF, is
// read at the root given and wins.
func TestAVFsPFComesFromTheInventoryWhenSysfsDoesNotShowIt(t *testing.T) {
	for _, tc := range []struct {
		name, root string
		want       devinfo.PCI
	}{
		{"sysfs off", "", devinfo.PCI{PCIAddress: vf, PFPCIAddress: otherPF}},
		{"sysfs without the VF", t.TempDir(), devinfo.PCI{PCIAddress: vf, PFPCIAddress: otherPF}},
		{"sysfs with the VF", fakeSysfs(t), devinfo.PCI{PCIAddress: vf, PFPCIAddress: pf, RDMADevice: "mlx5_3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			w := devinfo.New(devinfo.Options{Dir: dir, SysfsRoot: tc.root, Log: quiet(), Inventory: inventoryWithVF()})
			w.Hold(pod, []model.Device{vfDevice(vf)})
			if in, ok := read(t, w.Path(rdma, vf)); !ok || in.PCI != tc.want {
				t.Errorf("device-info = %+v (exists %v), want %+v", in.PCI, ok, tc.want)
			}
		})
	}
}

// An empty --sysfs-root means no sysfs, not the host's /sys: a device that /sys
// shows is described from the inventory alone (here, one the inventory
// does not know: its address only).
func TestNoSysfsRootReadsNothingFromSlashSys(t *testing.T) {
	// A device of the host's, one with a PF or an RDMA device if there is
	// one (an SR-IOV host), whose file would then say so if /sys were read.
	entries, err := os.ReadDir("/sys/bus/pci/devices")
	if err != nil || len(entries) == 0 {
		t.Skip("no /sys/bus/pci/devices here to tell whether it is read")
	}
	addr := entries[0].Name()
	for _, e := range entries {
		dev := filepath.Join("/sys/bus/pci/devices", e.Name())
		if _, err := os.Lstat(filepath.Join(dev, "physfn")); err == nil {
			addr = e.Name()
			break
		}
		if _, err := os.Stat(filepath.Join(dev, "infiniband")); err == nil {
			addr = e.Name()
		}
	}
	root := t.TempDir()
	// The given root is read: a fake sysfs that gives addr a PF and an RDMA device.
	devs := filepath.Join(root, "bus", "pci", "devices")
	if err := os.MkdirAll(filepath.Join(devs, addr, "infiniband", "mlx5_9"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../"+otherPF, filepath.Join(devs, addr, "physfn")); err != nil {
		t.Fatal(err)
	}
	w := devinfo.New(devinfo.Options{Dir: t.TempDir(), SysfsRoot: root, Log: quiet()})
	w.Hold(pod, []model.Device{vfDevice(addr)})
	if in, _ := read(t, w.Path(rdma, addr)); in.PCI != (devinfo.PCI{PCIAddress: addr, PFPCIAddress: otherPF, RDMADevice: "mlx5_9"}) {
		t.Fatalf("with --sysfs-root %s, device-info = %+v, want what that root says", root, in.PCI)
	}
	// No root: nothing from /sys, whatever it holds for addr.
	w = devinfo.New(devinfo.Options{Dir: t.TempDir(), Log: quiet()})
	w.Hold(pod, []model.Device{vfDevice(addr)})
	if in, _ := read(t, w.Path(rdma, addr)); in.PCI != (devinfo.PCI{PCIAddress: addr}) {
		t.Errorf("with no sysfs root, device-info = %+v, want the address only", in.PCI)
	}
}
