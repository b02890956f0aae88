package proxy_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

const (
	draDriver = "gpu.example.com"
	draClaim  = "trainer-extended-resources-x7k2p"
	draGPU    = "GPU-5d7a0b1c-dra0-4c4c-9d9d-0123456789ab"
)

// withDRAPod is a pod whose nvidia.com/gpu request a DRA driver satisfied:
// the kubelet lists the device under the container's dynamic_resources
// only, and /pods gives the pod's extended resource claim status.
func withDRAPod() fk.PodOption {
	return func(p *fk.Pod) {
		p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{
			ResourceClaimName: draClaim,
			RequestMappings:   []corev1.ContainerExtendedResourceRequest{{ContainerName: "main", ResourceName: "nvidia.com/gpu", RequestName: "container-1-request-0"}},
		}
		p.DynamicResources = map[string][]*v1.DynamicResource{"main": {{
			ClaimName: draClaim, ClaimNamespace: p.Namespace,
			ClaimResources: []*v1.ClaimResource{{DriverName: draDriver, PoolName: "node-1", DeviceName: "gpu-0", CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=gpu-0"}}}},
		}}}
	}
}

// withLegacyView serves the legacy view (merge.Legacy), folding with a
// dra.View whose pod facts come from the fake kubelet's /pods and whose
// node has the DRA GPU on NUMA node 1.
func withLegacyView() option {
	return withLegacyViewOf(legacyFacts{
		devices: map[dra.DeviceRef]dra.Device{{Driver: draDriver, Pool: "node-1", Device: "gpu-0"}: {ID: draGPU, NUMANode: 1}},
	})
}

// legacyFacts are what withLegacyViewOf's dra.View knows besides /pods:
// the node's devices, and where claims' allocations are read (nil: none).
type legacyFacts struct {
	devices    map[dra.DeviceRef]dra.Device
	allocation func(ctx context.Context, namespace, name string) (dra.Allocation, error)
}

// withLegacyViewOf serves the legacy view, folding with a dra.View of f
// and the fake kubelet's /pods, whose background reads run until the test
// ends.
func withLegacyViewOf(f legacyFacts) option {
	return func(h *harness) {
		withViews(merge.Legacy)(h)
		h.providers = append(h.providers, func(p *proxy.Providers) {
			client, err := kubeletpods.NewClient(kubeletpods.Config{URL: h.k.PodsURL, TokenFile: h.k.TokenFile, CAFile: h.k.CAFile})
			if err != nil {
				h.t.Fatal(err)
			}
			view := dra.NewView(dra.ViewOptions{
				Pods: func(ctx context.Context, keys []model.PodKey) (map[model.PodKey]*model.ExtendedResourceClaim, error) {
					pods, err := client.Pods(ctx)
					if err != nil {
						return nil, err
					}
					list := kubeletpods.NewPodList(time.Now(), pods)
					out := map[model.PodKey]*model.ExtendedResourceClaim{}
					for _, k := range keys {
						if p, ok := list.Lookup(k); ok {
							out[k] = p.ExtendedResourceClaim
						}
					}
					return out, nil
				},
				Facts: func() dra.Facts {
					return dra.Facts{Devices: f.devices, ClassResources: map[string]string{draDriver: "nvidia.com/gpu"}}
				},
				Allocation: f.allocation,
				Metrics:    p.Metrics,
				Log:        quiet,
			})
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				_ = view.Run(ctx)
			}()
			h.t.Cleanup(func() {
				cancel()
				<-stopped
			})
			p.Fold = view
		})
	}
}

// quiet is the dra.View's log: the tests read the counts.
var quiet = func() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}()

// legacyClient dials the legacy view's socket.
func legacyClient(t *testing.T, h *harness) v1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+h.views[merge.Legacy], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return v1.NewPodResourcesListerClient(conn)
}

// NFD, RTE and nri-plugins read only devices: on the folded socket they
// see the DRA GPU under the container's devices with its UUID and NUMA
// node, in List, Get and GetAllocatableResources. Kata reads both and
// rejects a device listed twice: the default socket is the kubelet's
// answer, and the folded one lists the GPU only under devices.
func TestTheLegacyViewShowsDRADevicesUnderDevicesOnce(t *testing.T) {
	h := newHarness(t, withLegacyView())
	h.k.SetPods(fk.NewPod("ml", "trainer", "uid-1", fk.WithSidecar("proxy", nil), fk.WithContainer("main", map[string]string{"nvidia.com/gpu": "1"}), withDRAPod()))
	folded := legacyClient(t, h)

	// Get first: it waits for the pod's facts from /pods, which a List,
	// answering with what the view knows, never does.
	get, err := folded.Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "trainer"})
	if err != nil {
		t.Fatal(err)
	}
	list, err := folded.List(ctx(t), &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for what, pod := range map[string]*v1.PodResources{"List": findPod(list, "ml", "trainer"), "Get": get.GetPodResources()} {
		main := container(t, pod, "main")
		if len(main.GetDevices()) != 1 || main.Devices[0].GetResourceName() != "nvidia.com/gpu" || main.Devices[0].GetDeviceIds()[0] != draGPU ||
			main.Devices[0].GetTopology().GetNodes()[0].GetID() != 1 {
			t.Errorf("folded %s: main's devices %v, want the DRA GPU %s on NUMA node 1", what, main.GetDevices(), draGPU)
		}
		if len(main.GetDynamicResources()) != 0 {
			t.Errorf("folded %s: the GPU is also under dynamic_resources: %v", what, main.GetDynamicResources())
		}
		if side := container(t, pod, "proxy"); len(side.GetDevices()) != 0 {
			t.Errorf("folded %s: the sidecar got %v", what, side.GetDevices())
		}
	}

	main := container(t, findPod(h.list(), "ml", "trainer"), "main")
	if len(main.GetDevices()) != 0 || len(main.GetDynamicResources()) != 1 {
		t.Errorf("default socket: main has devices %v and dynamic_resources %v, want the kubelet's answer", main.GetDevices(), main.GetDynamicResources())
	}

	alloc, err := folded.GetAllocatableResources(ctx(t), &v1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := alloc.GetDevices(); len(d) != 1 || d[0].GetDeviceIds()[0] != draGPU {
		t.Errorf("folded allocatable %v, want the DRA GPU", d)
	}
	def, err := h.v1().GetAllocatableResources(ctx(t), &v1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(def.GetDevices()) != 0 {
		t.Errorf("default allocatable %v, want the kubelet's (no DRA device)", def.GetDevices())
	}
}

func container(t *testing.T, pod *v1.PodResources, name string) *v1.ContainerResources {
	t.Helper()
	for _, c := range pod.GetContainers() {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("pod %s has no container %s", pod.GetName(), name)
	return nil
}
