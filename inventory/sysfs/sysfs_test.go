package sysfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
)

// twoNUMANode is inventorytest's two-socket node (its
// testdata/two-numa.txtar), materialised for one test.
type twoNUMANode struct{ inventorytest.Node }

func newTwoNUMANode(t *testing.T) twoNUMANode {
	return twoNUMANode{inventorytest.TwoNUMANode(t)}
}

// pci returns the sysfs directory of a PCI device, through the bus link as
// the source reads it.
func (n twoNUMANode) pci(addr string) string { return n.PCI(addr) }

func (n twoNUMANode) source(log logrus.FieldLogger) *Source {
	return New(Options{SysfsRoot: n.Sys, ProcRoot: n.Proc, Logger: log})
}

func TestSysfsFindsTheGPUsAndTheRDMANICWithTheirNUMANodesAndIgnoresOtherDevices(t *testing.T) {
	node := newTwoNUMANode(t)
	devices, err := node.source(nil).Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Bridges, the BMC's VGA, the GPU's audio function, the Intel NIC and
	// the VFs themselves are not devices of their own.
	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(inventory.NewSnapshot(devices).Devices()), []string{
		"gpu id=" + inventorytest.GPU0 + " vendor=nvidia minor=2 index=0 bus=0000:3b:00.0 numa=0 healthy=true vfs=[] source=",
		"gpu id=" + inventorytest.GPU1 + " vendor=nvidia minor=0 index=1 bus=0000:af:00.0 numa=1 healthy=true vfs=[] source=",
		"rdma id=0000:d8:00.0 vendor= minor=0 index=? bus=0000:d8:00.0 numa=1 healthy=true vfs=[0000:d8:00.2@1 0000:d8:00.3@1] source=",
	})
}

func TestSysfsFixtureGivesTheAllocatableAnswerAndTopology(t *testing.T) {
	node := newTwoNUMANode(t)
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{node.source(nil)}, Logger: logrus.New()})
	inv.Refresh(context.Background())

	inventorytest.EqualLines(t, "allocatable", inventorytest.Render(t, inv.Snapshot().Allocatable(inventory.DefaultResourceNames())), []string{
		"koordinator.sh/rdma 0000:d8:00.2 numa=1",
		"koordinator.sh/rdma 0000:d8:00.3 numa=1",
		"nvidia.com/gpu " + inventorytest.GPU0 + " numa=0",
		"nvidia.com/gpu " + inventorytest.GPU1 + " numa=1",
	})
	for id, want := range map[string]string{
		inventorytest.GPU0: "0",
		inventorytest.GPU1: "1",
		"0000:d8:00.3":     "1", // a VF, as the annotation names it
		"0000:d8:00.0":     "1",
		"GPU-unknown":      "",
	} {
		var got []string
		for _, n := range inv.Snapshot().Topology(id) {
			got = append(got, string(rune('0'+n)))
		}
		if strings.Join(got, ",") != want {
			t.Errorf("Topology(%s) = %v, want [%s]", id, got, want)
		}
	}
	inventorytest.EqualLines(t, "List entries of a VF", inventorytest.Render(t, inv.Snapshot().ContainerDevices("koordinator.sh/rdma", "0000:d8:00.2")),
		[]string{"koordinator.sh/rdma 0000:d8:00.2 numa=1"})
	if d, ok := inv.Snapshot().ByMinor(inventory.TypeGPU, 0); !ok || d.ID != inventorytest.GPU1 {
		t.Errorf("ByMinor(gpu, 0) = %s, %v; want the GPU at 0000:af:00.0", inventorytest.Describe(d), ok)
	}
	if d, ok := inv.Snapshot().ByIndex(inventory.TypeGPU, 0); !ok || d.ID != inventorytest.GPU0 {
		t.Errorf("ByIndex(gpu, 0) = %s, %v; want the GPU at 0000:3b:00.0 (first in PCI order)", inventorytest.Describe(d), ok)
	}
}

func TestSysfsNUMANodeMinusOneIsUnknown(t *testing.T) {
	node := newTwoNUMANode(t)
	inventorytest.WriteFile(t, filepath.Join(node.pci("0000:af:00.0"), "numa_node"), "-1\n")
	inventorytest.WriteFile(t, filepath.Join(node.pci("0000:d8:00.3"), "numa_node"), "-1\n")
	snap := inventory.NewSnapshot(inventorytest.Load(t, node.source(nil)))

	gpu, _ := snap.Lookup(inventorytest.GPU1)
	if gpu.NUMANode != nil {
		t.Errorf("GPU with numa_node -1 has NUMA node %d, want unknown", *gpu.NUMANode)
	}
	pf, _ := snap.Lookup("0000:d8:00.0")
	if got := inventorytest.Describe(pf); !strings.Contains(got, "vfs=[0000:d8:00.2@1 0000:d8:00.3@?]") {
		t.Errorf("PF = %s, want VF 0000:d8:00.3 with an unknown node", got)
	}
	// A VF with no node of its own is on its PF's node.
	inventorytest.EqualLines(t, "allocatable", inventorytest.Render(t, snap.Allocatable(inventory.DefaultResourceNames())), []string{
		"koordinator.sh/rdma 0000:d8:00.2 numa=1",
		"koordinator.sh/rdma 0000:d8:00.3 numa=1",
		"nvidia.com/gpu " + inventorytest.GPU0 + " numa=0",
		"nvidia.com/gpu " + inventorytest.GPU1 + " numa=nil",
	})
}

func TestSysfsGPUWithoutDriverInformationIsListedByAddressOnlyAndWarnedOnce(t *testing.T) {
	node := newTwoNUMANode(t)
	if err := os.RemoveAll(filepath.Join(node.Proc, "driver", "nvidia", "gpus", "0000:3b:00.0")); err != nil {
		t.Fatal(err)
	}
	log, hook := inventorytest.QuietLogger()
	src := node.source(log)
	inventorytest.Load(t, src)
	devices := inventorytest.Load(t, src)

	inventorytest.EqualLines(t, "GPUs", inventorytest.DescribeAll(inventory.NewSnapshot(devices).Devices())[:2], []string{
		"gpu id= vendor=nvidia minor=? index=? bus=0000:3b:00.0 numa=0 healthy=true vfs=[] source=",
		// The driver enumerates one GPU only: it is index 0.
		"gpu id=" + inventorytest.GPU1 + " vendor=nvidia minor=0 index=0 bus=0000:af:00.0 numa=1 healthy=true vfs=[] source=",
	})
	if w := inventorytest.EntriesAt(hook, logrus.WarnLevel); len(w) != 1 || !strings.Contains(w[0], "0000:3b:00.0") {
		t.Errorf("warnings = %q, want one naming 0000:3b:00.0", w)
	}
	for _, line := range inventorytest.Render(t, inventory.NewSnapshot(devices).Allocatable(inventory.DefaultResourceNames())) {
		if strings.Contains(line, "0000:3b:00.0") || strings.Contains(line, "nvidia.com/gpu  ") {
			t.Errorf("allocatable lists the GPU without id: %s", line)
		}
	}
}

func TestSysfsGPUUUIDNotYetInitialisedIsUnknown(t *testing.T) {
	node := newTwoNUMANode(t)
	info := filepath.Join(node.Proc, "driver", "nvidia", "gpus", "0000:af:00.0", "information")
	inventorytest.WriteFile(t, info, "Model: \t\t NVIDIA A100\nGPU UUID: \t ????????-????-????-????-????????????\nDevice Minor: \t 0\n")
	gpu, _ := inventory.NewSnapshot(inventorytest.Load(t, node.source(nil))).Lookup("0000:af:00.0")
	if gpu.ID != "" || gpu.Minor == nil || *gpu.Minor != 0 {
		t.Errorf("GPU = %s, want no id and minor 0", inventorytest.Describe(gpu))
	}
}

func TestSysfsGPUExcludedByTheDriverIsUnhealthyAndNotIndexed(t *testing.T) {
	node := newTwoNUMANode(t)
	info := filepath.Join(node.Proc, "driver", "nvidia", "gpus", "0000:3b:00.0", "information")
	content, err := os.ReadFile(info)
	if err != nil {
		t.Fatal(err)
	}
	inventorytest.WriteFile(t, info, strings.Replace(string(content), "GPU Excluded:\t No", "GPU Excluded:\t Yes", 1))
	snap := inventory.NewSnapshot(inventorytest.Load(t, node.source(nil)))
	excluded, _ := snap.Lookup(inventorytest.GPU0)
	other, _ := snap.Lookup(inventorytest.GPU1)
	if excluded.Healthy || excluded.Index != nil {
		t.Errorf("excluded GPU = %s, want unhealthy without index", inventorytest.Describe(excluded))
	}
	if other.Index == nil || *other.Index != 0 {
		t.Errorf("other GPU = %s, want index 0", inventorytest.Describe(other))
	}
}

func TestSysfsRDMAPortNotActiveMakesTheNICUnhealthy(t *testing.T) {
	node := newTwoNUMANode(t)
	inventorytest.WriteFile(t, filepath.Join(node.pci("0000:d8:00.0"), "infiniband", "mlx5_0", "ports", "1", "state"), "1: DOWN\n")
	snap := inventory.NewSnapshot(inventorytest.Load(t, node.source(nil)))
	if pf, _ := snap.Lookup("0000:d8:00.0"); pf.Healthy {
		t.Errorf("PF with a DOWN port = %s, want unhealthy", inventorytest.Describe(pf))
	}
	for _, line := range inventorytest.Render(t, snap.Allocatable(inventory.DefaultResourceNames())) {
		if strings.HasPrefix(line, "koordinator.sh/rdma") {
			t.Errorf("allocatable lists a VF of an unhealthy PF: %s", line)
		}
	}
}

func TestSysfsRDMANICWithoutVFsIsAllocatableByItsAddress(t *testing.T) {
	node := newTwoNUMANode(t)
	// A second port of class InfiniBand whose driver is not loaded: no
	// infiniband/ directory, no VFs, no NUMA affinity.
	dev := filepath.Join(node.Sys, "devices", "pci0000:d7", "0000:d7:00.0", "0000:d8:00.1")
	inventorytest.WriteFile(t, filepath.Join(dev, "vendor"), "0x15b3\n")
	inventorytest.WriteFile(t, filepath.Join(dev, "class"), "0x020700\n")
	inventorytest.WriteFile(t, filepath.Join(dev, "numa_node"), "-1\n")
	if err := os.Symlink("../../../devices/pci0000:d7/0000:d7:00.0/0000:d8:00.1", node.pci("0000:d8:00.1")); err != nil {
		t.Fatal(err)
	}
	lines := inventorytest.Render(t, inventory.NewSnapshot(inventorytest.Load(t, node.source(nil))).Allocatable(inventory.DefaultResourceNames()))
	inventorytest.EqualLines(t, "RDMA entries", lines[:3], []string{
		"koordinator.sh/rdma 0000:d8:00.1 numa=nil",
		"koordinator.sh/rdma 0000:d8:00.2 numa=1",
		"koordinator.sh/rdma 0000:d8:00.3 numa=1",
	})
}

func TestSysfsAMDGPUIsNamedByItsAddress(t *testing.T) {
	node := newTwoNUMANode(t)
	dev := filepath.Join(node.Sys, "devices", "pci0000:00", "0000:00:01.1", "0000:c1:00.0")
	inventorytest.WriteFile(t, filepath.Join(dev, "vendor"), "0x1002\n")
	inventorytest.WriteFile(t, filepath.Join(dev, "class"), "0x038000\n")
	inventorytest.WriteFile(t, filepath.Join(dev, "numa_node"), "0\n")
	if err := os.Symlink("../../../devices/pci0000:00/0000:00:01.1/0000:c1:00.0", node.pci("0000:c1:00.0")); err != nil {
		t.Fatal(err)
	}
	snap := inventory.NewSnapshot(inventorytest.Load(t, node.source(nil)))
	gpu, ok := snap.Lookup("0000:c1:00.0")
	if !ok || gpu.ID != "0000:c1:00.0" || gpu.Vendor != inventory.VendorAMD || gpu.Index != nil {
		t.Fatalf("AMD GPU = %s, %v", inventorytest.Describe(gpu), ok)
	}
	names := inventory.DefaultResourceNames()
	names["gpu/amd"] = "amd.com/gpu"
	lines := inventorytest.Render(t, snap.Allocatable(names))
	if lines[0] != "amd.com/gpu 0000:c1:00.0 numa=0" {
		t.Errorf("allocatable = %q, want the AMD GPU under amd.com/gpu first", lines)
	}
}

func TestSysfsMissingTreeIsAnError(t *testing.T) {
	src := New(Options{SysfsRoot: filepath.Join(t.TempDir(), "nothing")})
	if _, err := src.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "listing PCI devices") {
		t.Errorf("Load() error = %v, want one about listing PCI devices", err)
	}
}
