package resourceapi

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/podres-proxy/podres-proxy/dra"
	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/test/apitest"
)

const (
	node   = "node-1"
	driver = "gpu.example.com"

	slicesPath  = "/apis/resource.k8s.io/v1/resourceslices"
	classesPath = "/apis/resource.k8s.io/v1/deviceclasses"
	claimsPath  = "/apis/resource.k8s.io/v1/resourceclaims"
)

// newAPIServer serves the DRA API: slices, classes and claims.
func newAPIServer(t *testing.T) *apitest.Server {
	return apitest.New(t, map[string]string{slicesPath: "ResourceSliceList", classesPath: "DeviceClassList", claimsPath: "ResourceClaimList"})
}

// start returns a running source of node-1's facts from api.
func start(t *testing.T, api *apitest.Server) *Source {
	t.Helper()
	cfg, err := apiclient.Config(apiclient.Options{Server: api.URL, TokenFile: api.TokenFile, CAFile: api.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Config: cfg, NodeName: node, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// put stores a typed object on api.
func put(t *testing.T, api *apitest.Server, collection string, obj any) {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	api.Put(collection, string(b))
}

func gpuSlice(name, nodeName, pool string, generation int64, devices ...resourcev1.Device) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourcev1.ResourcePool{Name: pool, Generation: generation, ResourceSliceCount: 1},
			NodeName: ptr.To(nodeName),
			Devices:  devices,
		},
	}
}

func gpuDevice(name, uuid, pci string, numa int64) resourcev1.Device {
	attrs := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"numaNode":                        {IntValue: ptr.To(numa)},
		"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(pci)},
		"productName":                     {StringValue: ptr.To("a long product name the folding never reads")},
	}
	if uuid != "" {
		attrs["uuid"] = resourcev1.DeviceAttribute{StringValue: ptr.To(uuid)}
	}
	return resourcev1.Device{Name: name, Attributes: attrs}
}

func gpuClass() *resourcev1.DeviceClass {
	return &resourcev1.DeviceClass{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: resourcev1.DeviceClassSpec{
			ExtendedResourceName: ptr.To("example.com/gpu"),
			Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}},
		},
	}
}

func ref(pool, device string) dra.DeviceRef {
	return dra.DeviceRef{Driver: driver, Pool: pool, Device: device}
}

// waitFacts waits, at each change the watches bring, until ok says the
// facts are the ones awaited, failing after 10 s. It makes the facts
// itself, as Run does at the same change.
func waitFacts(t *testing.T, s *Source, what string, ok func(dra.Facts) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		sc, cc := s.slices.Changed(), s.classes.Changed()
		s.rebuild()
		if ok(s.Facts()) {
			return
		}
		select {
		case <-sc:
		case <-cc:
		case <-deadline:
			t.Fatalf("%s: not within 10 s; the facts: %+v", what, s.Facts())
		}
	}
}

// The node's devices come from its own slices only, each pool's newest
// generation only, with the id consumers match (the driver's uuid, else
// the PCI address as sysfs spells it) and the NUMA node; a class selecting
// the driver makes them allocatable.
func TestTheNodesDevicesAreReadFromItsSlices(t *testing.T) {
	api := newAPIServer(t)
	put(t, api, classesPath, gpuClass())
	for i := range 600 {
		put(t, api, slicesPath, gpuSlice("other-"+strconv.Itoa(i), "node-2", "node-2", 1, gpuDevice("gpu-"+strconv.Itoa(i), "GPU-other", "0000:01:00.0", 0)))
	}
	put(t, api, slicesPath, gpuSlice("stale", node, node, 1, gpuDevice("gpu-0", "GPU-stale", "0000:3b:00.0", 0)))
	put(t, api, slicesPath, gpuSlice("new", node, node, 2, gpuDevice("gpu-0", "GPU-0a1b", "0000:3B:00.0", 1), gpuDevice("vf-0", "", "3b:02.1", 0)))
	s := start(t, api)
	if err := s.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := s.Facts()
	want := dra.Facts{
		Devices: map[dra.DeviceRef]dra.Device{
			ref(node, "gpu-0"): {ID: "GPU-0a1b", NUMANode: 1},
			ref(node, "vf-0"):  {ID: "0000:3b:02.1", NUMANode: 0},
		},
		ClassResources: map[string]string{driver: "example.com/gpu"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("facts %+v\nwant %+v", got, want)
	}
}

// A device a driver publishes is folded as soon as the watch brings it,
// without another list.
func TestANewDeviceIsSeenWithoutAskingAgain(t *testing.T) {
	api := newAPIServer(t)
	put(t, api, slicesPath, gpuSlice("s", node, node, 1, gpuDevice("gpu-0", "GPU-0", "0000:3b:00.0", 1)))
	s := start(t, api)
	if err := s.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	put(t, api, slicesPath, gpuSlice("s", node, node, 1, gpuDevice("gpu-0", "GPU-0", "0000:3b:00.0", 1), gpuDevice("gpu-1", "GPU-1", "0000:3c:00.0", 0)))
	waitFacts(t, s, "the new device", func(f dra.Facts) bool { return f.Devices[ref(node, "gpu-1")].ID == "GPU-1" })
	if n := api.Count("list", slicesPath); n != 1 {
		t.Errorf("%d lists of the slices, want 1", n)
	}
}

// An API server without the DRA API (or that forbids it) fails Wait at
// once; the facts are empty, nothing else fails.
func TestAnAPIServerWithoutDRAFailsWaitAtOnce(t *testing.T) {
	api := apitest.New(t, map[string]string{})
	s := start(t, api)
	begin := time.Now()
	if err := s.Wait(t.Context()); err == nil {
		t.Fatal("Wait succeeded without the DRA API")
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Wait took %s", d)
	}
	if f := s.Facts(); len(f.Devices) != 0 || len(f.ClassResources) != 0 {
		t.Errorf("facts without the DRA API: %+v", f)
	}
}

func TestAForbiddenListNamesTheRBACRule(t *testing.T) {
	api := newAPIServer(t)
	api.Refuse(http.StatusForbidden)
	s := start(t, api)
	err := s.Wait(t.Context())
	if err == nil || !strings.Contains(err.Error(), `resources: ["resourceslices"], verbs: ["list", "watch"]`) {
		t.Errorf("Wait: %v, want the RBAC rule named", err)
	}
}

// A slice past the API's bound of devices keeps the first 128; devices past
// maxDevices on the node are dropped too, and the facts say so nowhere
// else than the log.
func TestDevicesPastTheBoundsAreDropped(t *testing.T) {
	var devices []resourcev1.Device
	for i := range maxSliceDevices + 5 {
		devices = append(devices, gpuDevice("gpu-"+strconv.Itoa(i), "GPU-"+strconv.Itoa(i), "0000:3b:00.0", 0))
	}
	kept, dropped := trimSlice(gpuSlice("big", node, node, 1, devices...), DefaultAttributes)
	if len(kept.devices) != maxSliceDevices || dropped != 5 {
		t.Errorf("kept %d, dropped %d", len(kept.devices), dropped)
	}
	if d := kept.devices[7]; d.name != "gpu-7" || d.device != (dra.Device{ID: "GPU-7", NUMANode: 0}) {
		t.Errorf("kept device %+v", d)
	}
	got, dropped := nodeDevices([]*slice{kept}, node, 100)
	if len(got) != 100 || dropped != maxSliceDevices-100 {
		t.Errorf("node devices %d, dropped %d", len(got), dropped)
	}
}

func TestAClaimsAllocationIsReadByRequest(t *testing.T) {
	api := newAPIServer(t)
	put(t, api, claimsPath, &resourcev1.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "trainer-extended-resources-x7k2p"},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{
				{Request: "container-0-request-0", Driver: driver, Pool: node, Device: "gpu-0"},
				{Request: "container-0-request-0", Driver: driver, Pool: node, Device: "gpu-1"},
				{Request: "container-1-request-0/small", Driver: driver, Pool: node, Device: "gpu-2"},
			},
		}}},
	})
	put(t, api, claimsPath, &resourcev1.ResourceClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "pending"},
	})
	s := start(t, api)
	got, err := s.Allocation(t.Context(), "ml", "trainer-extended-resources-x7k2p")
	if err != nil {
		t.Fatal(err)
	}
	want := dra.Allocation{
		"container-0-request-0": {ref(node, "gpu-0"), ref(node, "gpu-1")},
		"container-1-request-0": {ref(node, "gpu-2")},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("allocation %v, want %v", got, want)
	}
	if _, err := s.Allocation(t.Context(), "ml", "pending"); err == nil {
		t.Error("a claim without allocation gave one")
	}
	api.Refuse(http.StatusForbidden)
	if _, err := s.Allocation(t.Context(), "ml", "trainer-extended-resources-x7k2p"); err == nil || !strings.Contains(err.Error(), `resources: ["resourceclaims"], verbs: ["get"]`) {
		t.Errorf("forbidden: %v, want the RBAC rule named", err)
	}
}

// An API server that hangs, then answers, then refuses and drops its
// watches, then forgets its history: the facts answer at once throughout
// and are never other than what the API server last said; a claim's read
// ends at its deadline; the watches resume, and relist when they must.
func TestTheWatchesOutliveAHungRefusingAndForgetfulAPIServer(t *testing.T) {
	api := newAPIServer(t)
	put(t, api, classesPath, gpuClass())
	put(t, api, slicesPath, gpuSlice("s", node, node, 1, gpuDevice("gpu-0", "GPU-0", "0000:3b:00.0", 1)))
	s := start(t, api)
	if err := s.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	devices := func(names ...string) func(dra.Facts) bool {
		return func(f dra.Facts) bool {
			return slices.Equal(slices.Sorted(func(yield func(string) bool) {
				for r := range f.Devices {
					if !yield(r.Device) {
						return
					}
				}
			}), names) && f.ClassResources[driver] == "example.com/gpu"
		}
	}
	answersAtOnce := func(phase string, want func(dra.Facts) bool) {
		t.Helper()
		begin := time.Now()
		f := s.Facts()
		if d := time.Since(begin); d > 50*time.Millisecond {
			t.Errorf("%s: Facts took %s", phase, d)
		}
		if !want(f) {
			t.Errorf("%s: facts %+v", phase, f)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		begin = time.Now()
		_, err := s.Allocation(ctx, "ml", "missing")
		if d := time.Since(begin); err == nil || d > 2*time.Second {
			t.Errorf("%s: a claim's read ended after %s with %v", phase, d, err)
		}
	}
	answersAtOnce("serving", devices("gpu-0"))

	api.Hang()
	put(t, api, slicesPath, gpuSlice("s", node, node, 1, gpuDevice("gpu-0", "GPU-0", "0000:3b:00.0", 1), gpuDevice("gpu-1", "GPU-1", "0000:3c:00.0", 0)))
	answersAtOnce("hung", devices("gpu-0"))
	api.Release()
	waitFacts(t, s, "the device written while the API server hung", devices("gpu-0", "gpu-1"))

	lists := api.Count("list", slicesPath)
	api.Refuse(http.StatusServiceUnavailable)
	api.DropWatches()
	answersAtOnce("refusing", devices("gpu-0", "gpu-1"))
	// The refused watch is retried; the next relist is refused too.
	for deadline := time.After(20 * time.Second); s.slices.Err() == nil; {
		select {
		case <-s.slices.Changed():
		case <-deadline:
			t.Fatal("no list was refused within 20 s")
		}
	}
	answersAtOnce("refusing", devices("gpu-0", "gpu-1"))
	api.Delete(slicesPath, "s")
	put(t, api, slicesPath, gpuSlice("t", node, node, 1, gpuDevice("gpu-2", "GPU-2", "0000:3d:00.0", 0)))
	answersAtOnce("refusing", devices("gpu-0", "gpu-1"))
	api.Refuse(0)
	waitFacts(t, s, "the slices written while the API server refused", devices("gpu-2"))
	if api.Count("list", slicesPath) <= lists {
		t.Error("the slices were not listed again after the refusals")
	}

	lists = api.Count("list", slicesPath)
	api.Compact()
	api.DropWatches()
	put(t, api, slicesPath, gpuSlice("t", node, node, 1, gpuDevice("gpu-2", "GPU-2", "0000:3d:00.0", 0), gpuDevice("gpu-3", "GPU-3", "0000:3e:00.0", 1)))
	waitFacts(t, s, "the device written after the API server forgot its history", devices("gpu-2", "gpu-3"))
	answersAtOnce("serving again", devices("gpu-2", "gpu-3"))
	if api.Count("list", slicesPath) > lists+1 {
		t.Errorf("%d lists after the history was forgotten, want at most one", api.Count("list", slicesPath)-lists)
	}
}
