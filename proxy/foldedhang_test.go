package proxy_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/prototext"
	corev1 "k8s.io/api/core/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/dra/resourceapi"
	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/test/apitest"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

const draGPU2 = "GPU-5d7a0b1c-dra1-4c4c-9d9d-0123456789ab"

// withSharedDRAClaim is a pod whose two containers each asked for one
// nvidia.com/gpu, both answered by one DRA claim: the kubelet lists the
// claim's two devices under both containers, and only the claim's
// allocation (from the API server) says which is whose.
func withSharedDRAClaim() fk.PodOption {
	return func(p *fk.Pod) {
		p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{
			ResourceClaimName: draClaim,
			RequestMappings: []corev1.ContainerExtendedResourceRequest{
				{ContainerName: "main", ResourceName: "nvidia.com/gpu", RequestName: "container-0-request-0"},
				{ContainerName: "helper", ResourceName: "nvidia.com/gpu", RequestName: "container-1-request-0"},
			},
		}
		both := func() []*v1.DynamicResource {
			return []*v1.DynamicResource{{ClaimName: draClaim, ClaimNamespace: p.Namespace, ClaimResources: []*v1.ClaimResource{
				{DriverName: draDriver, PoolName: "node-1", DeviceName: "gpu-0"},
				{DriverName: draDriver, PoolName: "node-1", DeviceName: "gpu-1"},
			}}}
		}
		p.DynamicResources = map[string][]*v1.DynamicResource{"main": both(), "helper": both()}
	}
}

// sharedClaim is the pod's claim as the API server sends it.
const sharedClaim = `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"namespace":"ml","name":"` + draClaim + `"},"status":{"allocation":{"devices":{"results":[` +
	`{"request":"container-0-request-0","driver":"` + draDriver + `","pool":"node-1","device":"gpu-0"},` +
	`{"request":"container-1-request-0","driver":"` + draDriver + `","pool":"node-1","device":"gpu-1"}]}}}}`

// hungAPIServer is an API server that accepts every request and answers
// none until release is called; then it answers the pod's claim. It
// returns the reader of claims the daemon builds against it.
func hungAPIServer(t *testing.T) (claims *resourceapi.Source, release func()) {
	const collection = "/apis/resource.k8s.io/v1/resourceclaims"
	api := apitest.New(t, map[string]string{collection: "ResourceClaimList"})
	api.Put(collection, sharedClaim)
	api.Hang()
	cfg, err := apiclient.Config(apiclient.Options{Server: api.URL, TokenFile: api.TokenFile, CAFile: api.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	claims, err = resourceapi.New(resourceapi.Options{Config: cfg, NodeName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	return claims, api.Release
}

// An API server that accepts and never answers holds no answer on any
// socket: List and Get answer well within the claim read's 10 s deadline
// (the 2 s bound is what the daemon stalled past, not a measurement), and
// the legacy view leaves the claim's devices under dynamic_resources,
// counted. Once the API server answers, a later List folds them.
func TestAHungAPIServerHoldsNoAnswer(t *testing.T) {
	claims, release := hungAPIServer(t)
	h := newHarness(t, withLegacyViewOf(legacyFacts{
		devices: map[dra.DeviceRef]dra.Device{
			{Driver: draDriver, Pool: "node-1", Device: "gpu-0"}: {ID: draGPU, NUMANode: 1},
			{Driver: draDriver, Pool: "node-1", Device: "gpu-1"}: {ID: draGPU2, NUMANode: 0},
		},
		allocation: claims.Allocation,
	}))
	h.k.SetPods(fk.NewPod("ml", "trainer", "uid-1",
		fk.WithContainer("main", map[string]string{"nvidia.com/gpu": "1"}), fk.WithContainer("helper", map[string]string{"nvidia.com/gpu": "1"}),
		withSharedDRAClaim()))
	sockets := map[string]v1.PodResourcesListerClient{"default": h.v1(), "legacy": legacyClient(t, h)}
	soon := func() context.Context {
		c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	unfolded := func() float64 {
		return h.counter("podres_proxy_dra_unfolded_total", "reason", dra.ReasonUnattributed)
	}

	// The default socket's List is built in the call that builds the
	// legacy view's; the legacy Get waits for the pod's facts (the
	// kubelet's /pods, not the API server), after which the claim's read
	// hangs.
	for _, name := range []string{"default", "legacy"} {
		get, err := sockets[name].Get(soon(), &v1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "trainer"})
		if err != nil {
			t.Fatalf("%s Get with the API server hanging: %v", name, err)
		}
		list, err := sockets[name].List(soon(), &v1.ListPodResourcesRequest{})
		if err != nil {
			t.Fatalf("%s List with the API server hanging: %v", name, err)
		}
		for what, pod := range map[string]*v1.PodResources{"Get": get.GetPodResources(), "List": findPod(list, "ml", "trainer")} {
			for _, c := range []string{"main", "helper"} {
				got := container(t, pod, c)
				if len(got.GetDevices()) != 0 || len(got.GetDynamicResources()) != 1 || len(got.GetDynamicResources()[0].GetClaimResources()) != 2 {
					t.Errorf("%s %s: %s has devices %v and dynamic_resources %v, want both GPUs under dynamic_resources only", name, what, c, got.GetDevices(), got.GetDynamicResources())
				}
			}
		}
	}
	if n := unfolded(); n != 4 {
		t.Errorf("dra_unfolded_total{reason=%q} = %v, want each container's 2 devices, once", dra.ReasonUnattributed, n)
	}

	release()
	legacy := sockets["legacy"]
	var last *v1.PodResources
	poll.UntilWith(t, "a legacy List folding the claim once the API server answers", func() bool {
		list, err := legacy.List(ctx(t), &v1.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		last = findPod(list, "ml", "trainer")
		main, helper := container(t, last, "main"), container(t, last, "helper")
		return len(main.GetDevices()) == 1 && main.Devices[0].GetDeviceIds()[0] == draGPU &&
			len(helper.GetDevices()) == 1 && helper.Devices[0].GetDeviceIds()[0] == draGPU2 &&
			len(main.GetDynamicResources())+len(helper.GetDynamicResources()) == 0
	}, func() string { return "last answer: " + prototext.Format(last) })
}
