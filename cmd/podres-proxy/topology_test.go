package main

import (
	"context"
	"maps"
	"os"
	"testing"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/test/clients"
	"github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/inventorytest"
)

const (
	koordAnnotation = "scheduling.koordinator.sh/device-allocated"
	// devicePluginResource is a device the kubelet's own device manager
	// allocates (a device plugin's), on both NUMA nodes.
	devicePluginResource = "example.com/dev"
)

// koordGPUAndVF is koord-scheduler's annotation for one GPU and one VF of
// the two-NUMA node's RDMA PF, named as koordlet's Device object names them.
func koordGPUAndVF(gpu, vf string) string {
	return `{"gpu":[{"minor":2,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"},"id":"` + gpu + `"}],` +
		`"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"` + inventorytest.RDMAPF + `","extension":{"vfs":[{"minor":-1,"busID":"` + vf + `"}]}}]}`
}

// twoNUMAKubelet is a fake kubelet on the two-NUMA node: its device plugin
// has dev-0 on NUMA 0 and dev-1 on NUMA 1; pod ml/trainer got dev-1 from
// it and, from Koordinator, GPU0 (NUMA 0) and VF0 (NUMA 1); pod web/front
// has nothing.
func twoNUMAKubelet(t *testing.T, dir string) *fakekubelet.Kubelet {
	t.Helper()
	k := fakekubelet.Start(t, dir)
	k.SetAllocatable(&v1.AllocatableResourcesResponse{
		Devices: []*v1.ContainerDevices{
			{ResourceName: devicePluginResource, DeviceIds: []string{"dev-0"}, Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 0}}}},
			{ResourceName: devicePluginResource, DeviceIds: []string{"dev-1"}, Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 1}}}},
		},
		CpuIds: []int64{0, 1, 2, 3},
	})
	k.SetPods(
		fakekubelet.NewPod("ml", "trainer", "uid-trainer",
			fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation(koordAnnotation, koordGPUAndVF(inventorytest.GPU0, inventorytest.RDMAVF0)),
			fakekubelet.WithSidecar("logs", nil),
			fakekubelet.WithContainer("train", map[string]string{
				"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "1", devicePluginResource: "1"}),
			fakekubelet.WithKubeletDevices("train", devicePluginResource, 1, "dev-1")),
		fakekubelet.NewPod("web", "front", "uid-front", fakekubelet.WithContainer("nginx", nil)),
	)
	return k
}

// serveOnTwoNUMANode runs serve against the kubelet with the two-NUMA
// node's sysfs as its only inventory source, and returns its socket and
// state directory.
func serveOnTwoNUMANode(t *testing.T, k *fakekubelet.Kubelet, dir string, node inventorytest.Node, extra ...string) (socket, stateDir string) {
	t.Helper()
	srv := startServe(t, k, dir, append([]string{
		"--device-cr=false", "--sysfs-root", node.Sys, "--procfs-root", node.Proc}, extra...)...)
	return srv.socket, srv.stateDir
}

func shortTempDir(t *testing.T) string {
	t.Helper()
	// Unix socket paths are limited to 108 bytes: not t.TempDir().
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestNFDAndRTECountFreeDevicesPerNUMANodeThroughServeOnASysfsNode(t *testing.T) {
	dir := shortTempDir(t)
	k := twoNUMAKubelet(t, dir)
	socket, _ := serveOnTwoNUMANode(t, k, dir, inventorytest.TwoNUMANode(t))

	// The node: GPU0 on NUMA 0; GPU1, VF0 and VF1 on NUMA 1; dev-0 and
	// dev-1 on 0 and 1. Used: GPU0, VF0 (Koordinator), dev-1 (kubelet).
	want := map[clients.NUMAKey]int{
		{Resource: "nvidia.com/gpu", NUMA: 0}:      0,
		{Resource: "nvidia.com/gpu", NUMA: 1}:      1,
		{Resource: "koordinator.sh/rdma", NUMA: 1}: 1,
		{Resource: devicePluginResource, NUMA: 0}:  1,
		{Resource: devicePluginResource, NUMA: 1}:  0,
	}

	free, unknown, err := clients.NFDFreePerNUMA(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown) != 0 {
		t.Errorf("NFD would log %v as unknown resources: every listed id must be in GetAllocatableResources with its NUMA node", unknown)
	}
	if !maps.Equal(free, want) {
		t.Errorf("NFD's free devices per NUMA node:\n got %v\nwant %v", free, want)
	}

	available, clamped, err := clients.RTEAvailablePerNUMA(context.Background(), socket)
	if err != nil {
		t.Fatal(err)
	}
	if len(clamped) != 0 {
		t.Errorf("RTE would clamp %v at 0: List puts more devices on a node than GetAllocatableResources has there", clamped)
	}
	if !maps.Equal(available, want) {
		t.Errorf("RTE's available devices per NUMA node:\n got %v\nwant %v", available, want)
	}

	// Without the proxy both see the Koordinator devices as free: that is
	// what the proxy is for.
	free, _, err = clients.NFDFreePerNUMA(context.Background(), k.Socket)
	if err != nil {
		t.Fatal(err)
	}
	kubeletOnly := map[clients.NUMAKey]int{{Resource: devicePluginResource, NUMA: 0}: 1, {Resource: devicePluginResource, NUMA: 1}: 0}
	if !maps.Equal(free, kubeletOnly) {
		t.Errorf("the kubelet alone gives %v; want only the device plugin's resource, %v", free, kubeletOnly)
	}
}
