package inventorytest

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/inventory"
)

// QuietLogger returns a logger whose entries the test can inspect.
func QuietLogger() (*logrus.Logger, *logtest.Hook) {
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	return log, hook
}

// EntriesAt returns the messages (with their error field) logged at level.
func EntriesAt(hook *logtest.Hook, level logrus.Level) []string {
	var out []string
	for _, e := range hook.AllEntries() {
		if e.Level != level {
			continue
		}
		msg := e.Message
		if err, ok := e.Data[logrus.ErrorKey]; ok {
			msg += ": " + err.(error).Error()
		}
		out = append(out, msg)
	}
	return out
}

// Render turns ContainerDevices into lines that compare and print well,
// checking the kubelet's shape on the way: one id per entry, topology nil
// or naming exactly one node.
func Render(t testing.TB, cds []*podresourcesv1.ContainerDevices) []string {
	t.Helper()
	var out []string
	for _, cd := range cds {
		if len(cd.DeviceIds) != 1 {
			t.Errorf("entry %v has %d device ids, the kubelet reports one per entry", cd, len(cd.DeviceIds))
		}
		numa := "nil"
		if cd.Topology != nil {
			if len(cd.Topology.Nodes) != 1 {
				t.Errorf("entry %v has %d NUMA nodes, the kubelet reports one per entry", cd, len(cd.Topology.Nodes))
			}
			var ids []string
			for _, n := range cd.Topology.Nodes {
				ids = append(ids, strconv.FormatInt(n.ID, 10))
			}
			numa = strings.Join(ids, ",")
		}
		out = append(out, cd.ResourceName+" "+strings.Join(cd.DeviceIds, ",")+" numa="+numa)
	}
	return out
}

// FakeSource is an inventory.Source the test drives: each Load returns the
// next answer sent on Answers, or blocks until ctx is done.
type FakeSource struct {
	Answers  chan Answer
	name     string
	interval time.Duration
	mu       sync.Mutex
	loads    int
}

// Answer is what one Load of a FakeSource returns, or panics with.
type Answer struct {
	Devices []inventory.Device
	Err     error
	Panic   any
}

// NewFakeSource returns a FakeSource with room for 16 answers.
func NewFakeSource(name string, interval time.Duration) *FakeSource {
	return &FakeSource{name: name, interval: interval, Answers: make(chan Answer, 16)}
}

// Name implements inventory.Source.
func (f *FakeSource) Name() string { return f.name }

// Interval implements inventory.Source.
func (f *FakeSource) Interval() time.Duration { return f.interval }

// Load implements inventory.Source.
func (f *FakeSource) Load(ctx context.Context) ([]inventory.Device, error) {
	f.mu.Lock()
	f.loads++
	f.mu.Unlock()
	select {
	case a := <-f.Answers:
		if a.Panic != nil {
			panic(a.Panic)
		}
		return a.Devices, a.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Loads returns how many times Load was called.
func (f *FakeSource) Loads() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads
}

// TwoSourceInventory is an inventory whose Device object knows a GPU and a
// PF without their NUMA nodes, and whose sysfs knows the nodes.
func TwoSourceInventory(t testing.TB) *inventory.Inventory {
	t.Helper()
	cr := NewFakeSource(inventory.SourceDeviceCR, 0)
	sys := NewFakeSource(inventory.SourceSysfs, 0)
	cr.Answers <- Answer{Devices: []inventory.Device{
		{Type: inventory.TypeGPU, ID: GPU1, BusID: "0000:af:00.0", Healthy: true},
		{Type: inventory.TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", Healthy: true,
			VFs: []inventory.VF{{BusID: "0000:d8:00.2"}, {BusID: "0000:d8:00.3", NUMANode: new(int64(0))}}},
	}}
	sys.Answers <- Answer{Devices: []inventory.Device{
		{Type: inventory.TypeGPU, ID: GPU1, BusID: "0000:af:00.0", NUMANode: new(int64(1)), Healthy: true},
		{Type: inventory.TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", NUMANode: new(int64(1)), Healthy: true,
			VFs: []inventory.VF{{BusID: "0000:d8:00.2", NUMANode: new(int64(1))}, {BusID: "0000:d8:00.3", NUMANode: new(int64(1))}}},
	}}
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{cr, sys}, Logger: logrus.New()})
	inv.Refresh(context.Background())
	return inv
}

// Describe prints every field of a device on one line, for comparisons
// whose failures read well.
func Describe(d inventory.Device) string {
	p := func(v *int64) string {
		if v == nil {
			return "?"
		}
		return strconv.FormatInt(*v, 10)
	}
	var vfs []string
	for _, vf := range d.VFs {
		vfs = append(vfs, vf.BusID+"@"+p(vf.NUMANode))
	}
	s := d.Type + " id=" + d.ID + " vendor=" + d.Vendor + " minor=" + p(d.Minor) + " index=" + p(d.Index) +
		" bus=" + d.BusID + " numa=" + p(d.NUMANode) + " healthy=" + strconv.FormatBool(d.Healthy) +
		" vfs=[" + strings.Join(vfs, " ") + "] source=" + d.Source
	if d.PhysFn != "" {
		s += " physfn=" + d.PhysFn
	}
	return s
}

// DescribeAll describes each device, in order.
func DescribeAll(devices []inventory.Device) []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, Describe(d))
	}
	return out
}

// EqualLines reports a difference between two lists of lines, one per line.
func EqualLines(t testing.TB, what string, got, want []string) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	t.Errorf("%s:\ngot:\n\t%s\nwant:\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
}

// CheckDecoded holds for whatever a source's decoder accepts: every device
// can be found, its PCI addresses are in sysfs form, and a snapshot of them
// answers without panicking. The fuzz tests of the file and the Device
// object call it.
func CheckDecoded(t testing.TB, devices []inventory.Device) {
	t.Helper()
	for _, d := range devices {
		if d.ID == "" && d.BusID == "" {
			t.Fatalf("accepted a device without id or address: %s", Describe(d))
		}
		if d.BusID != "" {
			if c, ok := inventory.CanonicalPCIAddress(d.BusID); !ok || c != d.BusID {
				t.Fatalf("busID %q is not in sysfs form", d.BusID)
			}
		}
		for _, vf := range d.VFs {
			if c, ok := inventory.CanonicalPCIAddress(vf.BusID); !ok || c != vf.BusID {
				t.Fatalf("VF busID %q is not in sysfs form", vf.BusID)
			}
		}
		for _, p := range []*int64{d.NUMANode, d.Minor, d.Index} {
			if p != nil && *p < 0 {
				t.Fatalf("negative number accepted as known: %s", Describe(d))
			}
		}
	}
	snap := inventory.NewSnapshot(devices)
	for _, d := range devices {
		for _, id := range []string{d.ID, d.BusID} {
			if _, ok := snap.Lookup(id); id != "" && !ok {
				t.Fatalf("Lookup(%q) of an accepted device failed", id)
			}
		}
		_ = snap.ContainerDevices("r", d.ID)
	}
	for _, cd := range snap.Allocatable(inventory.DefaultResourceNames()) {
		if len(cd.DeviceIds) != 1 || cd.DeviceIds[0] == "" {
			t.Fatalf("allocatable entry %v does not name one device", cd)
		}
	}
}

// Load asks a source once and fails the test if it fails.
func Load(t testing.TB, src inventory.Source) []inventory.Device {
	t.Helper()
	devices, err := src.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return devices
}
