package proxy_test

import (
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/test/clients"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// These tests call the proxy the way each real consumer does and check that
// it, unmodified, sees the scheduler's devices.

func TestMultusGetsTheVFDuringCNIAdd(t *testing.T) {
	h := newHarness(t)
	// Multus asks during CNI ADD: the sandbox does not exist, the store has
	// never heard of the pod, only /pods has its annotation.
	h.k.SetPods(
		fk.NewPod("default", "neighbour", "uid-0", byKoord, fk.WithAnnotation(koordKey, oneGPU), koordApp),
		fk.NewPod("team", "rdma-pod", "uid-1", byKoord, fk.WithAnnotation(koordKey, gpuAndVF),
			fk.WithContainer("main", map[string]string{"koordinator.sh/rdma": "1", "koordinator.sh/gpu-core": "100"})))
	ids, err := clients.MultusDeviceIDs(ctx(t), h.socket, "team", "rdma-pod", "koordinator.sh/rdma")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{vfAddr}) {
		t.Fatalf("Multus would hand deviceID %v to sriov-cni, want the VF %s", ids, vfAddr)
	}
}

func TestMultusFailsTheAddWhenThePodIsUnknownAndPodsIsDown(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("team", "rdma-pod", "uid-1", byKoord, fk.WithAnnotation(koordKey, gpuAndVF), koordApp))
	h.k.SetPodsDown(true)
	if ids, err := clients.MultusDeviceIDs(ctx(t), h.socket, "team", "rdma-pod", "koordinator.sh/rdma"); err == nil {
		t.Fatalf("Multus got %v without error; an empty deviceID would be configured silently", ids)
	}
}

func TestDCGMExporterLabelsTheGPUWithTheRequestingContainer(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("ml", "train", "uid-1", byKoord, fk.WithAnnotation(koordKey, twoGPUs),
		fk.WithSidecar("log-shipper", nil),
		fk.WithContainer("trainer", map[string]string{"koordinator.sh/gpu-core": "200"})))
	for name, f := range map[string]func() (map[string]clients.GPUOwner, error){
		"v1":       func() (map[string]clients.GPUOwner, error) { return clients.DCGMDeviceToPod(ctx(t), h.socket) },
		"v1alpha1": func() (map[string]clients.GPUOwner, error) { return clients.DCGMV1alpha1DeviceToPod(ctx(t), h.socket) },
	} {
		m, err := f()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := clients.GPUOwner{Namespace: "ml", Pod: "train", Container: "trainer"}
		for _, id := range []string{gpuUUID, gpuUUID2} {
			if m[id] != want {
				t.Errorf("%s: GPU %s labelled %+v, want %+v", name, id, m[id], want)
			}
		}
	}
}

func TestNRIPluginsAndKataGetDevicesThroughGet(t *testing.T) {
	one := int64(1)
	h := newHarness(t, withInventory(inventory.Device{Type: inventory.TypeGPU, ID: gpuUUID, NUMANode: &one, Healthy: true}))
	h.k.SetPods(fk.NewPod("default", "vm", "uid-1", byKoord, fk.WithAnnotation(koordKey, gpuAndVF),
		fk.WithContainer("guest", map[string]string{"nvidia.com/gpu": "1", "koordinator.sh/rdma": "1"})))
	hints, err := clients.NRIPluginsTopologyHints(ctx(t), h.socket, "default", "vm", "guest")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(hints["nvidia.com/gpu"], []int64{1}) {
		t.Errorf("nri-plugins hints = %v, want GPU on NUMA 1", hints)
	}
	cdi, err := clients.KataCDIDevices(ctx(t), h.socket, "default", "vm")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(cdi)
	want := []string{"koordinator.sh/rdma=" + vfAddr, "nvidia.com/gpu=" + gpuUUID}
	if !slices.Equal(cdi, want) {
		t.Errorf("Kata would cold-plug %v, want %v", cdi, want)
	}
}

func TestNFDCountsAddedDevicesPerNUMANode(t *testing.T) {
	zero, one := int64(0), int64(1)
	h := newHarness(t, withInventory(
		inventory.Device{Type: inventory.TypeGPU, ID: gpuUUID, NUMANode: &zero, Healthy: true},
		inventory.Device{Type: inventory.TypeGPU, ID: gpuUUID2, NUMANode: &one, Healthy: true}))
	h.k.SetAllocatable(&v1.AllocatableResourcesResponse{
		Devices: []*v1.ContainerDevices{{ResourceName: "example.com/dev", DeviceIds: []string{"dev-0"},
			Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 0}}}}},
		CpuIds: []int64{0, 1, 2, 3},
	})
	h.k.SetPods(fk.NewPod("default", "gpu", "uid-1", byKoord, fk.WithAnnotation(koordKey, oneGPU), koordApp))
	free, unknown, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 0 {
		t.Errorf("NFD would log unknown resources %v: every listed id must be allocatable", unknown)
	}
	want := map[clients.NUMAKey]int{
		{Resource: "nvidia.com/gpu", NUMA: 0}:  0,
		{Resource: "nvidia.com/gpu", NUMA: 1}:  1,
		{Resource: "example.com/dev", NUMA: 0}: 1,
	}
	for k, v := range want {
		if free[k] != v {
			t.Errorf("free %v = %d, want %d (all: %v)", k, free[k], v, free)
		}
	}
}

func TestAntreaSeesTheVFOnTheFirstAsk(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(fk.NewPod("net", "sriov", "uid-1", byKoord, fk.WithAnnotation(koordKey, gpuAndVF),
		fk.WithContainer("app", map[string]string{"koordinator.sh/rdma": "1"})))
	ids, err := clients.AntreaVFDeviceIDs(ctx(t), h.socket, "net", "sriov", "koordinator.sh/rdma")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{vfAddr}) {
		t.Fatalf("Antrea got %v on its first (cached) ask, want the VF", ids)
	}
}

// On a HAMi node the kubelet's allocatable lists HAMi's fake ids
// (<uuid>-<n>) while List, through the proxy, names the real GPUs. NFD
// subtracts List from allocatable per resource: allocatable must list the
// real GPUs instead, or NFD finds List's ids unknown and counts every fake
// id as a free device.
func TestNFDCountsHAMiGPUsByTheirRealIDs(t *testing.T) {
	zero, one := int64(0), int64(1)
	gpus := []inventory.Device{
		{Type: inventory.TypeGPU, ID: gpuUUID, NUMANode: &zero, Healthy: true},
		{Type: inventory.TypeGPU, ID: gpuUUID2, NUMANode: &one, Healthy: true},
	}
	h := newHarness(t, withInventory(gpus...))
	var fake []*v1.ContainerDevices
	for _, uuid := range []string{gpuUUID, gpuUUID2} {
		for n := range 4 {
			fake = append(fake, &v1.ContainerDevices{ResourceName: "nvidia.com/gpu", DeviceIds: []string{fmt.Sprintf("%s-%d", uuid, n)}})
		}
	}
	h.k.SetAllocatable(&v1.AllocatableResourcesResponse{Devices: fake})
	h.k.SetPods(fk.NewPod("default", "vgpu", "uid-1", byHAMi,
		fk.WithAnnotation("hami.io/vgpu-devices-allocated", gpuUUID2+",NVIDIA,3000,30:;"),
		fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"}),
		fk.WithKubeletDevices("app", "nvidia.com/gpu", -1, gpuUUID2+"-2")))

	free, unknown, err := clients.NFDFreePerNUMA(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 0 {
		t.Errorf("NFD would log unknown resources %v", unknown)
	}
	want := map[clients.NUMAKey]int{{Resource: "nvidia.com/gpu", NUMA: 0}: 1, {Resource: "nvidia.com/gpu", NUMA: 1}: 0}
	for k, v := range want {
		if free[k] != v {
			t.Errorf("free %v = %d, want %d (all: %v)", k, free[k], v, free)
		}
	}
	resp, err := h.v1().GetAllocatableResources(ctx(t), &v1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range resp.Devices {
		for _, id := range d.DeviceIds {
			if id != gpuUUID && id != gpuUUID2 {
				t.Errorf("allocatable still lists the kubelet's fake id %s", id)
			}
		}
	}
}
