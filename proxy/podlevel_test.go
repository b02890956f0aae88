package proxy_test

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// From Kubernetes 1.37 the kubelet reports a pod with pod-level resources
// with its own cpu_ids and memory, beside its containers'. Consumers that
// place work by NUMA node (RTE, NFD) read them: List and Get carry them as
// the kubelet gave them, on a pod whose devices the proxy adds to as on one
// it leaves alone.
func TestPodLevelCPUsAndMemoryPassThrough(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(
		fk.NewPod("ml", "train", "uid-train", byKoord,
			fk.WithAnnotation(koordKey, oneGPU),
			fk.WithContainer("app", map[string]string{"nvidia.com/gpu": "1"}),
			fk.WithCPUs("app", 2, 3),
			fk.WithPodCPUs(2, 3, 4, 5),
			fk.WithPodMemory("memory", 2<<30, 0),
			fk.WithPodMemory("hugepages-1Gi", 1<<30, 1)),
		fk.NewPod("ml", "plain", "uid-plain", fk.WithPodCPUs(6), fk.WithPodMemory("memory", 1<<30, -1)))
	want := map[string]*v1.PodResources{
		"train": {CpuIds: []int64{2, 3, 4, 5}, Memory: []*v1.ContainerMemory{
			{MemoryType: "memory", Size: 2 << 30, Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 0}}}},
			{MemoryType: "hugepages-1Gi", Size: 1 << 30, Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 1}}}},
		}},
		"plain": {CpuIds: []int64{6}, Memory: []*v1.ContainerMemory{{MemoryType: "memory", Size: 1 << 30}}},
	}
	list := h.list()
	for name, w := range want {
		for how, p := range map[string]*v1.PodResources{"List": findPod(list, "ml", name), "Get": h.get("ml", name)} {
			if p == nil {
				t.Fatalf("%s has no pod ml/%s", how, name)
			}
			got := &v1.PodResources{CpuIds: p.GetCpuIds(), Memory: p.GetMemory()}
			if !proto.Equal(got, w) {
				t.Errorf("%s: ml/%s pod-level cpu_ids and memory = %v, want the kubelet's %v", how, name, got, w)
			}
		}
	}
	if got := devicesOf(findPod(list, "ml", "train"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("the GPU the proxy adds = %v, want %s", got, gpuUUID)
	}
}
