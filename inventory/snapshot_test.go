package inventory

import (
	"context"
	"testing"

	"github.com/sirupsen/logrus"
)

func TestCanonicalPCIAddressAcceptsTheFormsToolsPrint(t *testing.T) {
	for in, want := range map[string]string{
		"0000:3b:00.0":      "0000:3b:00.0",
		"00000000:3B:00.0":  "0000:3b:00.0", // NVML
		"3b:00.0":           "0000:3b:00.0", // lspci
		" 0000:d8:00.7\n":   "0000:d8:00.7",
		"10000:e1:00.0":     "10000:e1:00.0", // VMD domain
		"00010000:E1:00.0":  "10000:e1:00.0",
		"0000:3b:00.8":      "", // functions are 0-7
		"0000:3b:20.0":      "", // devices are 0-1f
		"0000:3b:0.0":       "",
		"3b:00":             "",
		"GPU-5f1d6b3c-8a2e": "",
		"":                  "",
		"000000000:3b:00.0": "", // nine-digit domain
		"0000:3b:00.0.1":    "",
		"0000:3g:00.0":      "",
	} {
		got, ok := CanonicalPCIAddress(in)
		if got != want || ok != (want != "") {
			t.Errorf("CanonicalPCIAddress(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestMergedInventoryTakesEachFieldFromTheFirstSourceThatKnowsIt(t *testing.T) {
	deviceCR := newFakeSource(SourceDeviceCR, 0)
	file := newFakeSource(SourceFile, 0)
	sysfs := newFakeSource(SourceSysfs, 0)
	deviceCR.answers <- answer{devices: []Device{
		// Koordinator knows the UUID and that the GPU is broken, not its node.
		{Type: TypeGPU, ID: uuid0, Minor: ptr(2), BusID: "0000:3b:00.0", Healthy: false},
		{Type: TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", Healthy: true,
			VFs: []VF{{BusID: "0000:d8:00.2"}}},
	}}
	file.answers <- answer{devices: []Device{
		// The operator wrote the index and the node, and a second id spelling.
		{Type: TypeGPU, ID: "gpu-5F1D6B3C-8A2E-4F0B-9C1D-2E3F4A5B6C7D", Index: ptr(7), NUMANode: ptr(0), Healthy: true},
		{Type: TypeFPGA, ID: "fpga-0", Healthy: true},
	}}
	sysfs.answers <- answer{devices: []Device{
		// sysfs disagrees on the node (too late) and knows the vendor; it
		// found the GPU by address only.
		{Type: TypeGPU, BusID: "0000:3b:00.0", Vendor: VendorNVIDIA, NUMANode: ptr(1), Minor: ptr(9), Healthy: true},
		{Type: TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", NUMANode: ptr(1), Minor: ptr(0), Healthy: true,
			VFs: []VF{{BusID: "0000:d8:00.2", NUMANode: ptr(1)}, {BusID: "0000:d8:00.3", NUMANode: ptr(1)}}},
		{Type: TypeGPU, ID: uuid1, BusID: "0000:af:00.0", NUMANode: ptr(1), Healthy: true},
	}}
	inv := New(Options{Sources: []Source{deviceCR, file, sysfs}, Logger: logrus.New()})
	inv.Refresh(context.Background())

	equalLines(t, "devices", describeAll(inv.Devices()), []string{
		"fpga id=fpga-0 vendor= minor=? index=? bus= numa=? healthy=true vfs=[] source=file",
		"gpu id=" + uuid0 + " vendor=nvidia minor=2 index=7 bus=0000:3b:00.0 numa=0 healthy=false vfs=[] source=device-cr",
		"gpu id=" + uuid1 + " vendor= minor=? index=? bus=0000:af:00.0 numa=1 healthy=true vfs=[] source=sysfs",
		"rdma id=0000:d8:00.0 vendor= minor=0 index=? bus=0000:d8:00.0 numa=1 healthy=true vfs=[0000:d8:00.2@1 0000:d8:00.3@1] source=device-cr",
	})
}

func TestLookupFindsDevicesByIDAddressAndVFAddress(t *testing.T) {
	snap := NewSnapshot([]Device{
		{Type: TypeGPU, ID: uuid0, Minor: ptr(2), Index: ptr(0), BusID: "0000:3b:00.0", NUMANode: ptr(0), Healthy: true, Source: SourceSysfs},
		{Type: TypeRDMA, ID: "0000:d8:00.0", Minor: ptr(0), BusID: "0000:d8:00.0", NUMANode: ptr(1), Healthy: true, Source: SourceSysfs,
			VFs: []VF{{BusID: "0000:d8:00.3"}, {BusID: "0000:d8:00.2", NUMANode: ptr(0)}}},
	})
	for _, tc := range []struct{ query, want string }{
		{"GPU-5F1D6B3C-8A2E-4F0B-9C1D-2E3F4A5B6C7D", "gpu id=" + uuid0},
		{"00000000:3B:00.0", "gpu id=" + uuid0},
		{"d8:00.0", "rdma id=0000:d8:00.0"},
		// A VF is described as a device of its own, on its own node, or
		// else its PF's.
		{"0000:d8:00.2", "rdma id=0000:d8:00.2 vendor= minor=? index=? bus=0000:d8:00.2 numa=0 healthy=true vfs=[] source=sysfs physfn=0000:d8:00.0"},
		{"0000:d8:00.3", "rdma id=0000:d8:00.3 vendor= minor=? index=? bus=0000:d8:00.3 numa=1 healthy=true vfs=[] source=sysfs physfn=0000:d8:00.0"},
	} {
		d, ok := snap.Lookup(tc.query)
		if got := describe(d); !ok || len(got) < len(tc.want) || got[:len(tc.want)] != tc.want {
			t.Errorf("Lookup(%q) = %s, %v; want %s...", tc.query, got, ok, tc.want)
		}
	}
	if d, ok := snap.Lookup("GPU-nope"); ok {
		t.Errorf("Lookup(GPU-nope) = %s", describe(d))
	}
	if d, ok := snap.ByMinor(TypeRDMA, 0); !ok || d.ID != "0000:d8:00.0" {
		t.Errorf("ByMinor(rdma, 0) = %s, %v", describe(d), ok)
	}
	if d, ok := snap.ByMinor(TypeGPU, 0); ok {
		t.Errorf("ByMinor(gpu, 0) = %s: minors are per type", describe(d))
	}
	if d, ok := snap.ByIndex(TypeGPU, 0); !ok || d.ID != uuid0 {
		t.Errorf("ByIndex(gpu, 0) = %s, %v", describe(d), ok)
	}
	if pf, _ := snap.Lookup("0000:d8:00.0"); pf.VFs[0].BusID != "0000:d8:00.2" {
		t.Errorf("VFs are not in address order: %s", describe(pf))
	}
}

func TestContainerDevicesHasTheKubeletsShape(t *testing.T) {
	snap := NewSnapshot([]Device{{Type: TypeGPU, ID: uuid0, NUMANode: ptr(1), Healthy: true}})
	equalLines(t, "known device", render(t, snap.ContainerDevices("nvidia.com/gpu", uuid0)), []string{"nvidia.com/gpu " + uuid0 + " numa=1"})
	unknown := snap.ContainerDevices("nvidia.com/gpu", uuid1)
	equalLines(t, "unknown device", render(t, unknown), []string{"nvidia.com/gpu " + uuid1 + " numa=nil"})
	if unknown[0].Topology != nil {
		t.Errorf("unknown device has topology %v, want nil (not an empty TopologyInfo)", unknown[0].Topology)
	}
}

func TestAllocatableListsHealthyNamedDevicesOnceEach(t *testing.T) {
	snap := NewSnapshot([]Device{
		{Type: TypeGPU, ID: uuid0, NUMANode: ptr(0), Healthy: true},
		{Type: TypeGPU, ID: uuid1, NUMANode: ptr(1), Healthy: false},                                 // unhealthy
		{Type: TypeGPU, BusID: "0000:5e:00.0", NUMANode: ptr(0), Healthy: true},                      // no id
		{Type: "npu", ID: "npu-0", Healthy: true},                                                    // no resource name
		{Type: TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", NUMANode: ptr(1), Healthy: true}, // no VFs
		{Type: TypeRDMA, ID: "0000:d8:00.1", BusID: "0000:d8:00.1", NUMANode: ptr(1), Healthy: true,
			VFs: []VF{{BusID: "0000:d8:01.2", NUMANode: ptr(1)}, {BusID: "0000:d8:01.3"}}},
		{Type: TypeFPGA, ID: "fpga-0", Vendor: "xilinx", Healthy: true},
		{Type: TypeFPGA, ID: "FPGA-0", Healthy: true}, // the same id again
	})
	names := DefaultResourceNames()
	names["fpga/xilinx"] = "xilinx.com/fpga"
	equalLines(t, "allocatable", render(t, snap.Allocatable(names)), []string{
		"koordinator.sh/fpga FPGA-0 numa=nil",
		"koordinator.sh/rdma 0000:d8:00.0 numa=1",
		"koordinator.sh/rdma 0000:d8:01.2 numa=1",
		"koordinator.sh/rdma 0000:d8:01.3 numa=1",
		"nvidia.com/gpu " + uuid0 + " numa=0",
		"xilinx.com/fpga fpga-0 numa=nil",
	})
}

func TestSnapshotDoesNotShareStateWithItsInput(t *testing.T) {
	in := []Device{{Type: TypeGPU, ID: uuid0, NUMANode: ptr(0), VFs: []VF{{BusID: "0000:3b:00.4"}}}}
	snap := NewSnapshot(in)
	*in[0].NUMANode = 5
	in[0].VFs[0].BusID = "0000:3b:00.5"
	if got := describe(snap.Devices()[0]); got != "gpu id="+uuid0+" vendor= minor=? index=? bus= numa=0 healthy=false vfs=[0000:3b:00.4@?] source=" {
		t.Errorf("snapshot changed with its input: %s", got)
	}
}
