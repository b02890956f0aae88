package inventory_test

import (
	"context"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
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
		got, ok := inventory.CanonicalPCIAddress(in)
		if got != want || ok != (want != "") {
			t.Errorf("CanonicalPCIAddress(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestMergedInventoryTakesEachFieldFromTheFirstSourceThatKnowsIt(t *testing.T) {
	deviceCR := inventorytest.NewFakeSource(inventory.SourceDeviceCR, 0)
	file := inventorytest.NewFakeSource(inventory.SourceFile, 0)
	sysfs := inventorytest.NewFakeSource(inventory.SourceSysfs, 0)
	deviceCR.Answers <- inventorytest.Answer{Devices: []inventory.Device{
		// Koordinator knows the UUID and that the GPU is broken, not its node.
		{Type: inventory.TypeGPU, ID: inventorytest.GPU0, Minor: new(int64(2)), BusID: "0000:3b:00.0", Healthy: false},
		{Type: inventory.TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", Healthy: true,
			VFs: []inventory.VF{{BusID: "0000:d8:00.2"}}},
	}}
	file.Answers <- inventorytest.Answer{Devices: []inventory.Device{
		// The operator wrote the index and the node, and a second id spelling.
		{Type: inventory.TypeGPU, ID: "gpu-5F1D6B3C-8A2E-4F0B-9C1D-2E3F4A5B6C7D", Index: new(int64(7)), NUMANode: new(int64(0)), Healthy: true},
		{Type: inventory.TypeFPGA, ID: "fpga-0", Healthy: true},
	}}
	sysfs.Answers <- inventorytest.Answer{Devices: []inventory.Device{
		// sysfs disagrees on the node (too late) and knows the vendor; it
		// found the GPU by address only.
		{Type: inventory.TypeGPU, BusID: "0000:3b:00.0", Vendor: inventory.VendorNVIDIA, NUMANode: new(int64(1)), Minor: new(int64(9)), Healthy: true},
		{Type: inventory.TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", NUMANode: new(int64(1)), Minor: new(int64(0)), Healthy: true,
			VFs: []inventory.VF{{BusID: "0000:d8:00.2", NUMANode: new(int64(1))}, {BusID: "0000:d8:00.3", NUMANode: new(int64(1))}}},
		{Type: inventory.TypeGPU, ID: inventorytest.GPU1, BusID: "0000:af:00.0", NUMANode: new(int64(1)), Healthy: true},
	}}
	inv := inventory.New(inventory.Options{Sources: []inventory.Source{deviceCR, file, sysfs}, Logger: logrus.New()})
	inv.Refresh(context.Background())

	inventorytest.EqualLines(t, "devices", inventorytest.DescribeAll(inv.Snapshot().Devices()), []string{
		"fpga id=fpga-0 vendor= minor=? index=? bus= numa=? healthy=true vfs=[] source=file",
		"gpu id=" + inventorytest.GPU0 + " vendor=nvidia minor=2 index=7 bus=0000:3b:00.0 numa=0 healthy=false vfs=[] source=device-cr",
		"gpu id=" + inventorytest.GPU1 + " vendor= minor=? index=? bus=0000:af:00.0 numa=1 healthy=true vfs=[] source=sysfs",
		"rdma id=0000:d8:00.0 vendor= minor=0 index=? bus=0000:d8:00.0 numa=1 healthy=true vfs=[0000:d8:00.2@1 0000:d8:00.3@1] source=device-cr",
	})
}

func TestLookupFindsDevicesByIDAddressAndVFAddress(t *testing.T) {
	snap := inventory.NewSnapshot([]inventory.Device{
		{Type: inventory.TypeGPU, ID: inventorytest.GPU0, Minor: new(int64(2)), Index: new(int64(0)), BusID: "0000:3b:00.0", NUMANode: new(int64(0)), Healthy: true, Source: inventory.SourceSysfs},
		{Type: inventory.TypeRDMA, ID: "0000:d8:00.0", Minor: new(int64(0)), BusID: "0000:d8:00.0", NUMANode: new(int64(1)), Healthy: true, Source: inventory.SourceSysfs,
			VFs: []inventory.VF{{BusID: "0000:d8:00.3"}, {BusID: "0000:d8:00.2", NUMANode: new(int64(0))}}},
	})
	for _, tc := range []struct{ query, want string }{
		{"GPU-5F1D6B3C-8A2E-4F0B-9C1D-2E3F4A5B6C7D", "gpu id=" + inventorytest.GPU0},
		{"00000000:3B:00.0", "gpu id=" + inventorytest.GPU0},
		{"d8:00.0", "rdma id=0000:d8:00.0"},
		// A VF is described as a device of its own, on its own node, or
		// else its PF's.
		{"0000:d8:00.2", "rdma id=0000:d8:00.2 vendor= minor=? index=? bus=0000:d8:00.2 numa=0 healthy=true vfs=[] source=sysfs physfn=0000:d8:00.0"},
		{"0000:d8:00.3", "rdma id=0000:d8:00.3 vendor= minor=? index=? bus=0000:d8:00.3 numa=1 healthy=true vfs=[] source=sysfs physfn=0000:d8:00.0"},
	} {
		d, ok := snap.Lookup(tc.query)
		if got := inventorytest.Describe(d); !ok || len(got) < len(tc.want) || got[:len(tc.want)] != tc.want {
			t.Errorf("Lookup(%q) = %s, %v; want %s...", tc.query, got, ok, tc.want)
		}
	}
	if d, ok := snap.Lookup("GPU-nope"); ok {
		t.Errorf("Lookup(GPU-nope) = %s", inventorytest.Describe(d))
	}
	if d, ok := snap.ByMinor(inventory.TypeRDMA, 0); !ok || d.ID != "0000:d8:00.0" {
		t.Errorf("ByMinor(rdma, 0) = %s, %v", inventorytest.Describe(d), ok)
	}
	if d, ok := snap.ByMinor(inventory.TypeGPU, 0); ok {
		t.Errorf("ByMinor(gpu, 0) = %s: minors are per type", inventorytest.Describe(d))
	}
	if d, ok := snap.ByIndex(inventory.TypeGPU, 0); !ok || d.ID != inventorytest.GPU0 {
		t.Errorf("ByIndex(gpu, 0) = %s, %v", inventorytest.Describe(d), ok)
	}
	if pf, _ := snap.Lookup("0000:d8:00.0"); pf.VFs[0].BusID != "0000:d8:00.2" {
		t.Errorf("VFs are not in address order: %s", inventorytest.Describe(pf))
	}
}

func TestContainerDevicesHasTheKubeletsShape(t *testing.T) {
	snap := inventory.NewSnapshot([]inventory.Device{{Type: inventory.TypeGPU, ID: inventorytest.GPU0, NUMANode: new(int64(1)), Healthy: true}})
	inventorytest.EqualLines(t, "known device", inventorytest.Render(t, snap.ContainerDevices("nvidia.com/gpu", inventorytest.GPU0)), []string{"nvidia.com/gpu " + inventorytest.GPU0 + " numa=1"})
	unknown := snap.ContainerDevices("nvidia.com/gpu", inventorytest.GPU1)
	inventorytest.EqualLines(t, "unknown device", inventorytest.Render(t, unknown), []string{"nvidia.com/gpu " + inventorytest.GPU1 + " numa=nil"})
	if unknown[0].Topology != nil {
		t.Errorf("unknown device has topology %v, want nil (not an empty TopologyInfo)", unknown[0].Topology)
	}
}

func TestAllocatableListsHealthyNamedDevicesOnceEach(t *testing.T) {
	snap := inventory.NewSnapshot([]inventory.Device{
		{Type: inventory.TypeGPU, ID: inventorytest.GPU0, NUMANode: new(int64(0)), Healthy: true},
		{Type: inventory.TypeGPU, ID: inventorytest.GPU1, NUMANode: new(int64(1)), Healthy: false},                    // unhealthy
		{Type: inventory.TypeGPU, BusID: "0000:5e:00.0", NUMANode: new(int64(0)), Healthy: true},                      // no id
		{Type: "npu", ID: "npu-0", Healthy: true},                                                                     // no resource name
		{Type: inventory.TypeRDMA, ID: "0000:d8:00.0", BusID: "0000:d8:00.0", NUMANode: new(int64(1)), Healthy: true}, // no VFs
		{Type: inventory.TypeRDMA, ID: "0000:d8:00.1", BusID: "0000:d8:00.1", NUMANode: new(int64(1)), Healthy: true,
			VFs: []inventory.VF{{BusID: "0000:d8:01.2", NUMANode: new(int64(1))}, {BusID: "0000:d8:01.3"}}},
		{Type: inventory.TypeFPGA, ID: "fpga-0", Vendor: "xilinx", Healthy: true},
		{Type: inventory.TypeFPGA, ID: "FPGA-0", Healthy: true}, // the same id again
	})
	names := inventory.DefaultResourceNames()
	names["fpga/xilinx"] = "xilinx.com/fpga"
	inventorytest.EqualLines(t, "allocatable", inventorytest.Render(t, snap.Allocatable(names)), []string{
		"koordinator.sh/fpga FPGA-0 numa=nil",
		"koordinator.sh/rdma 0000:d8:00.0 numa=1",
		"koordinator.sh/rdma 0000:d8:01.2 numa=1",
		"koordinator.sh/rdma 0000:d8:01.3 numa=1",
		"nvidia.com/gpu " + inventorytest.GPU0 + " numa=0",
		"xilinx.com/fpga fpga-0 numa=nil",
	})
}

func TestSnapshotDoesNotShareStateWithItsInput(t *testing.T) {
	in := []inventory.Device{{Type: inventory.TypeGPU, ID: inventorytest.GPU0, NUMANode: new(int64(0)), VFs: []inventory.VF{{BusID: "0000:3b:00.4"}}}}
	snap := inventory.NewSnapshot(in)
	*in[0].NUMANode = 5
	in[0].VFs[0].BusID = "0000:3b:00.5"
	if got := inventorytest.Describe(snap.Devices()[0]); got != "gpu id="+inventorytest.GPU0+" vendor= minor=? index=? bus= numa=0 healthy=false vfs=[0000:3b:00.4@?] source=" {
		t.Errorf("snapshot changed with its input: %s", got)
	}
}
