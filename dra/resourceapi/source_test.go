package resourceapi

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/podres-proxy/podres-proxy/dra"
)

const (
	node   = "node-1"
	token  = "sa-token"
	driver = "gpu.example.com"
)

// fakeAPIServer serves resource.k8s.io/v1 lists and gets as the API server
// does: the field selector spec.nodeName filters slices, limit and
// continue page them, a missing token is 401, a resource the test forbids
// is 403, and down answers 503.
type fakeAPIServer struct {
	mu        sync.Mutex
	slices    []resourcev1.ResourceSlice
	classes   []resourcev1.DeviceClass
	claims    map[string]resourcev1.ResourceClaim // namespace/name
	forbidden string
	down      bool
	// listed is told of each DeviceClass list, the last read of a load.
	listed chan struct{}
}

func (f *fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+token {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	if f.down {
		http.Error(w, "etcd is away", http.StatusServiceUnavailable)
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/apis/resource.k8s.io/v1/"), "/")
	resource := parts[len(parts)-1]
	if len(parts) == 4 {
		resource = parts[2]
	}
	if resource == f.forbidden {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	switch {
	case len(parts) == 1 && parts[0] == "resourceslices":
		var items []resourcev1.ResourceSlice
		sel := r.URL.Query().Get("fieldSelector")
		for _, s := range f.slices {
			if sel == "" || (s.Spec.NodeName != nil && sel == "spec.nodeName="+*s.Spec.NodeName) {
				items = append(items, s)
			}
		}
		page(w, r, "ResourceSliceList", items)
	case len(parts) == 1 && parts[0] == "deviceclasses":
		page(w, r, "DeviceClassList", f.classes)
		if f.listed != nil {
			select {
			case f.listed <- struct{}{}:
			default:
			}
		}
	case len(parts) == 4 && parts[0] == "namespaces" && parts[2] == "resourceclaims":
		c, ok := f.claims[parts[1]+"/"+parts[3]]
		if !ok {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		c.Kind = "ResourceClaim"
		_ = json.NewEncoder(w).Encode(c)
	default:
		http.NotFound(w, r)
	}
}

// page writes one page of items as a list of kind, limit items from the
// offset continue names.
func page[T any](w http.ResponseWriter, r *http.Request, kind string, items []T) {
	from, _ := strconv.Atoi(r.URL.Query().Get("continue"))
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	to, next := len(items), ""
	if limit > 0 && from+limit < len(items) {
		to, next = from+limit, strconv.Itoa(from+limit)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": kind, "apiVersion": "resource.k8s.io/v1", "metadata": map[string]any{"continue": next}, "items": items[from:to]})
}

func start(t *testing.T, f *fakeAPIServer) *Source {
	t.Helper()
	srv := httptest.NewTLSServer(f)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{APIServer: srv.URL, TokenFile: tok, CAFile: ca, NodeName: node})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func gpuSlice(nodeName, pool string, generation int64, devices ...resourcev1.Device) resourcev1.ResourceSlice {
	return resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-" + pool + "-" + strconv.FormatInt(generation, 10)},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourcev1.ResourcePool{Name: pool, Generation: generation, ResourceSliceCount: 1},
			NodeName: ptr.To(nodeName),
			Devices:  devices,
		},
	}
}

func gpuDevice(name, uuid, pci string, numa int64) resourcev1.Device {
	d := resourcev1.Device{Name: name, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(pci)},
		"numaNode":                        {IntValue: ptr.To(numa)},
	}}
	if uuid != "" {
		d.Attributes[driver+"/uuid"] = resourcev1.DeviceAttribute{StringValue: ptr.To(uuid)}
	}
	return d
}

func ref(pool, device string) dra.DeviceRef {
	return dra.DeviceRef{Driver: driver, Pool: pool, Device: device}
}

// The node's devices come from its own slices only, across pages, each
// pool's newest generation only, with the id consumers match (the
// driver's uuid, else the PCI address as sysfs spells it) and the NUMA
// node; a class selecting the driver makes them allocatable.
func TestTheNodesDevicesAreReadFromItsSlices(t *testing.T) {
	f := &fakeAPIServer{classes: []resourcev1.DeviceClass{{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: resourcev1.DeviceClassSpec{
			ExtendedResourceName: ptr.To("example.com/gpu"),
			Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}},
		},
	}}}
	for i := range 600 { // more than one page
		f.slices = append(f.slices, gpuSlice("node-2", "node-2", 1, gpuDevice("gpu-"+strconv.Itoa(i), "GPU-other", "0000:01:00.0", 0)))
	}
	f.slices = append(f.slices,
		gpuSlice(node, node, 1, gpuDevice("gpu-0", "GPU-stale", "0000:3b:00.0", 0)),
		gpuSlice(node, node, 2, gpuDevice("gpu-0", "GPU-0a1b", "0000:3B:00.0", 1), gpuDevice("vf-0", "", "3b:02.1", 0)),
	)
	s := start(t, f)
	if err := s.Load(t.Context()); err != nil {
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

// While the API server is away the last good lists keep answering.
func TestTheLastGoodListsAnswerWhileTheAPIServerIsAway(t *testing.T) {
	f := &fakeAPIServer{slices: []resourcev1.ResourceSlice{gpuSlice(node, node, 1, gpuDevice("gpu-0", "GPU-0a1b", "0000:3b:00.0", 1))}}
	s := start(t, f)
	if err := s.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.down = true
	f.mu.Unlock()
	if err := s.Load(t.Context()); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("load with the API server down: %v", err)
	}
	if d := s.Facts().Devices[ref(node, "gpu-0")]; d.ID != "GPU-0a1b" {
		t.Errorf("device while the API server is away: %+v", d)
	}
}

// Refresh makes Run list again without waiting for the interval.
func TestRefreshListsAgain(t *testing.T) {
	f := &fakeAPIServer{listed: make(chan struct{}, 1)}
	s := start(t, f)
	s.opts.Interval, s.opts.MinRefresh = 1<<40, 1
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	f.mu.Lock()
	f.slices = []resourcev1.ResourceSlice{gpuSlice(node, node, 1, gpuDevice("gpu-0", "GPU-new", "0000:3b:00.0", 0))}
	f.mu.Unlock()
	// Each list ends with the classes; the facts are stored just after,
	// so a list may end before the facts show it: wait for the next.
	for s.Facts().Devices[ref(node, "gpu-0")].ID != "GPU-new" {
		s.Refresh()
		select {
		case err := <-done:
			t.Fatalf("Run ended: %v", err)
		case <-f.listed:
		}
	}
}

func TestAClaimsAllocationIsReadByRequest(t *testing.T) {
	f := &fakeAPIServer{claims: map[string]resourcev1.ResourceClaim{"ml/trainer-extended-resources-x7k2p": {
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "trainer-extended-resources-x7k2p"},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{
				{Request: "container-0-request-0", Driver: driver, Pool: node, Device: "gpu-0"},
				{Request: "container-0-request-0", Driver: driver, Pool: node, Device: "gpu-1"},
				{Request: "container-1-request-0/small", Driver: driver, Pool: node, Device: "gpu-2"},
			},
		}}},
	}, "ml/pending": {ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "pending"}}}}
	s := start(t, f)
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
	f.forbidden = "resourceclaims"
	if _, err := s.Allocation(t.Context(), "ml", "trainer-extended-resources-x7k2p"); err == nil || !strings.Contains(err.Error(), `resources: ["resourceclaims"], verbs: ["get"]`) {
		t.Errorf("forbidden: %v, want the RBAC rule named", err)
	}
}
