package inventorytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTwoNUMANodeHasTheDevicesItNamesBehindBusLinks(t *testing.T) {
	n := TwoNUMANode(t)
	for addr, numa := range map[string]string{GPU0BusID: "0", GPU1BusID: "1", RDMAPF: "1", RDMAVF0: "1", RDMAVF1: "1"} {
		if fi, err := os.Lstat(n.PCI(addr)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s: not a link under bus/pci/devices, as in sysfs: %v", addr, err)
		}
		b, err := os.ReadFile(filepath.Join(n.PCI(addr), "numa_node"))
		if err != nil || strings.TrimSpace(string(b)) != numa {
			t.Errorf("%s: numa_node %q (%v), want %s", addr, b, err, numa)
		}
	}
	for gpu, uuid := range map[string]string{GPU0BusID: GPU0, GPU1BusID: GPU1} {
		b, err := os.ReadFile(filepath.Join(n.Proc, "driver", "nvidia", "gpus", gpu, "information"))
		if err != nil || !strings.Contains(string(b), "GPU UUID: \t "+uuid) {
			t.Errorf("%s: NVIDIA's procfs does not give UUID %s: %v", gpu, uuid, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(n.PCI(RDMAPF), "virtfn1")); err != nil || target != "../"+RDMAVF1 {
		t.Errorf("the PF's virtfn1 is %q (%v), want a link to its VF", target, err)
	}
}
