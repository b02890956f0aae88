package allocator_test

import (
	"fmt"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
)

// A pod with a service-mesh sidecar and a trainer that requested a whole GPU
// and an RDMA VF: the devices go to the trainer, not to the sidecar the
// kubelet lists first.
func ExampleSet_Assign() {
	set := allocator.NewSet(nil, nil, // the daemon counts malformed annotations in its metrics.Metrics
		koordinator.New(koordinator.Options{}))

	pod := model.PodRef{UID: "6f1c", Namespace: "ml", Name: "train-0"}
	devices, errs := set.Decode(pod, map[string]string{
		koordinator.Annotation: `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"},"id":"GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"}],
		  "rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:01:00.0","extension":{"vfs":[{"minor":-1,"busID":"0000:01:00.2"}]}}]}`,
	})
	if errs != nil {
		fmt.Println(errs)
		return
	}
	spec := &model.PodSpec{Containers: []model.ContainerSpec{
		{Name: "istio-proxy", Kind: model.KindSidecar},
		{Name: "trainer", Kind: model.KindApp, Requests: map[string]string{
			"koordinator.sh/gpu-core": "100", "koordinator.sh/gpu-memory-ratio": "100", "koordinator.sh/rdma": "100"}},
	}}
	assignment, ok := set.Assign(spec, devices)
	fmt.Println(ok)
	for _, d := range assignment["trainer"] {
		fmt.Println("trainer", d.Resource, d.IDs)
	}
	fmt.Println("istio-proxy", len(assignment["istio-proxy"]))
	// Output:
	// true
	// trainer nvidia.com/gpu [GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a]
	// trainer koordinator.sh/rdma [0000:01:00.2]
	// istio-proxy 0
}

// A pod scheduled by Volcano's gpushare names its GPU by nvidia-smi index;
// the proxy translates it through the node's inventory when it answers,
// leaving the stored record as it is.
func ExampleTranslate() {
	set := allocator.NewSet(nil, nil, volcano.NewGPUShare(volcano.GPUShareOptions{}))
	devices, _ := set.Decode(model.PodRef{UID: "9a0e", Namespace: "ml", Name: "infer-0"},
		map[string]string{volcano.GPUShareAnnotation: "1"})

	index, minor := int64(1), int64(3)
	node := inventory.NewSnapshot([]inventory.Device{
		{Type: "gpu", ID: "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", Index: &index, Minor: &minor, Healthy: true},
	})
	answered, problems := allocator.Translate(devices, node)
	fmt.Println(answered[0].Resource, answered[0].IDs, len(problems))
	fmt.Println("record keeps", devices[0].IDs)
	// Output:
	// nvidia.com/gpu [GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a] 0
	// record keeps []
}
