package inventory

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

	"github.com/podres-proxy/podres-proxy/inventory/inventorytest"
)

// twoNUMANode is inventorytest's two-socket node (its
// testdata/two-numa.txtar), materialised for one test.
type twoNUMANode struct{ sys, proc string }

func newTwoNUMANode(t *testing.T) twoNUMANode {
	n := inventorytest.TwoNUMANode(t)
	return twoNUMANode{sys: n.Sys, proc: n.Proc}
}

// pci returns the sysfs directory of a PCI device, through the bus link as
// the source reads it.
func (n twoNUMANode) pci(addr string) string {
	return inventorytest.Node{Sys: n.sys, Proc: n.proc}.PCI(addr)
}

func (n twoNUMANode) source(log logrus.FieldLogger) *SysfsSource {
	return NewSysfsSource(SysfsOptions{SysfsRoot: n.sys, ProcRoot: n.proc, Logger: log})
}

const (
	uuid0 = inventorytest.GPU0 // 0000:3b:00.0, NUMA 0
	uuid1 = inventorytest.GPU1 // 0000:af:00.0, NUMA 1
)

func mkdirAll(t *testing.T, dir string) {
	t.Helper()
	inventorytest.MkdirAll(t, dir)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	inventorytest.WriteFile(t, path, content)
}

// quietLogger returns a logger whose entries the test can inspect.
func quietLogger() (*logrus.Logger, *logtest.Hook) {
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	return log, hook
}

// entriesAt returns the messages (with their error field) logged at level.
func entriesAt(hook *logtest.Hook, level logrus.Level) []string {
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

// render turns ContainerDevices into lines that compare and print well,
// checking the kubelet's shape on the way: one id per entry, topology nil
// or naming exactly one node.
func render(t *testing.T, cds []*podresourcesv1.ContainerDevices) []string {
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

// fakeSource is a Source the test drives: each Load returns the next answer
// sent on answers, or blocks until ctx is done.
type fakeSource struct {
	name     string
	interval time.Duration
	answers  chan answer
	mu       sync.Mutex
	loads    int
}

type answer struct {
	devices []Device
	err     error
	panic   any
}

func newFakeSource(name string, interval time.Duration) *fakeSource {
	return &fakeSource{name: name, interval: interval, answers: make(chan answer, 16)}
}

func (f *fakeSource) Name() string            { return f.name }
func (f *fakeSource) Interval() time.Duration { return f.interval }
func (f *fakeSource) Load(ctx context.Context) ([]Device, error) {
	f.mu.Lock()
	f.loads++
	f.mu.Unlock()
	select {
	case a := <-f.answers:
		if a.panic != nil {
			panic(a.panic)
		}
		return a.devices, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// describe prints every field of a device on one line, for comparisons
// whose failures read well.
func describe(d Device) string {
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

func describeAll(devices []Device) []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, describe(d))
	}
	return out
}

// equalLines reports a difference between two lists of lines, one per line.
func equalLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	t.Errorf("%s:\ngot:\n\t%s\nwant:\n\t%s", what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
}
