package proxy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/test/clients"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// A TensorFusion pod: its scheduler's lower-case gpu-<uuid> is answered as
// GPU-<uuid>, which DCGM matches, on the GPU's NUMA node, in List and Get
// (TensorFusion's own proxy has List only); the kubelet's dummy
// tensor-fusion.ai/index_0 entry stays as the kubelet reported it.
func TestTensorFusionPodIsAnsweredAsDCGMMatchesIt(t *testing.T) {
	h := sharingNode(t)
	h.k.SetPods(fk.NewPod("ml", "tf", "uid-tf", fk.WithSchedulerName("tensor-fusion-scheduler"),
		fk.WithAnnotation("tensor-fusion.ai/gpu-ids", strings.ToLower(gpuUUID)),
		fk.WithContainer("main", map[string]string{"tensor-fusion.ai/index_0": "1"}),
		fk.WithKubeletDevices("main", "tensor-fusion.ai/index_0", -1, "1")))
	owners, err := clients.DCGMDeviceToPod(ctx(t), h.socket)
	if err != nil {
		t.Fatal(err)
	}
	if o := owners[gpuUUID]; o.Pod != "tf" || o.Container != "main" {
		t.Errorf("DCGM labels %s with %+v, want ml/tf main", gpuUUID, o)
	}
	hints, err := clients.NRIPluginsTopologyHints(ctx(t), h.socket, "ml", "tf", "main")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(hints["nvidia.com/gpu"], []int64{1}) {
		t.Errorf("Get: topology hints %v, want the GPU on NUMA node 1", hints)
	}
	if ids := devicesOf(h.get("ml", "tf"), "main")["tensor-fusion.ai/index_0"]; !slices.Equal(ids, []string{"1"}) {
		t.Errorf("the kubelet's own entry became %v", ids)
	}
}
