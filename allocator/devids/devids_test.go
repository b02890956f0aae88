package devids_test

import (
	"slices"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/model"
)

func TestNormalizeIDSpellsIDsAsConsumersMatchThem(t *testing.T) {
	for in, want := range map[string]string{
		"gpu-2C1B5E0F-77aa-4a4a-9b9b-123456789abc":         "GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc", // DCGM matches GPU- only
		"GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc":         "GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc",
		"mig-2c1b5e0f-77aa-4a4a-9b9b-123456789abc":         "MIG-2c1b5e0f-77aa-4a4a-9b9b-123456789abc",
		"mig-gpu-2C1B5E0F-77aa-4a4a-9b9b-123456789abc/1/0": "MIG-GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc/1/0",
		"0000:1F:00.0":   "0000:1f:00.0", // sysfs names are lower-case
		"3b:02.1":        "0000:3b:02.1", // with the domain
		"10000:3B:02.1":  "10000:3b:02.1",
		"gpu-not-a-uuid": "gpu-not-a-uuid", // no known shape: the allocator's
		"GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc\x1b[2J": "GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc\x1b[2J", // the gate must see it as written
		"mlu-3": "mlu-3",
		"":      "",
	} {
		if got := devids.NormalizeID(in); got != want {
			t.Errorf("NormalizeID(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNormalizeIDsCopiesOnlyWhatChanges(t *testing.T) {
	devs := []model.Device{
		{Resource: "nvidia.com/gpu", IDs: []string{"GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"}},
		{Resource: "koordinator.sh/rdma", IDs: []string{"0000:3B:02.1", "0000:3b:02.2"}},
	}
	if got := devids.NormalizeIDs(devs[:1]); &got[0] != &devs[0] {
		t.Error("nothing to change, yet the devices were copied")
	}
	got := devids.NormalizeIDs(devs)
	if !slices.Equal(got[1].IDs, []string{"0000:3b:02.1", "0000:3b:02.2"}) {
		t.Errorf("VFs = %q", got[1].IDs)
	}
	if devs[1].IDs[0] != "0000:3B:02.1" {
		t.Error("the record's devices were modified")
	}
}

func TestMIGResourceRenamesMIGInstancesOnly(t *testing.T) {
	i := 0
	devs := []model.Device{
		{Allocator: "hami", Type: "NVIDIA", Resource: "nvidia.com/gpu", IDs: []string{"MIG-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"}, Replace: true, ContainerIndex: &i},
		{Allocator: "hami", Type: "NVIDIA", Resource: "nvidia.com/gpu", IDs: []string{"GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"}, Replace: true, ContainerIndex: &i},
	}
	if got := devids.MIGResource(devs, ""); &got[0] != &devs[0] {
		t.Error("no MIG resource configured, yet the devices were copied")
	}
	got := devids.MIGResource(devs, "nvidia.com/mig-1g.10gb")
	var summary []string
	for _, d := range got {
		summary = append(summary, d.Resource+"="+slices.Concat(d.IDs, []string{""})[0])
	}
	want := []string{"nvidia.com/gpu=", "nvidia.com/mig-1g.10gb=MIG-2c1b5e0f-77aa-4a4a-9b9b-123456789abc", "nvidia.com/gpu=GPU-2c1b5e0f-77aa-4a4a-9b9b-123456789abc"}
	if !slices.Equal(summary, want) {
		t.Errorf("got %q, want %q (the empty one keeps replacing the kubelet's nvidia.com/gpu ids)", summary, want)
	}
	if devs[0].Resource != "nvidia.com/gpu" {
		t.Error("the input was modified")
	}
}
