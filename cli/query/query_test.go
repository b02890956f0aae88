package query

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/internal/cmdline"
)

// evilID is a device id a tenant could write in an annotation: it turns an
// operator's terminal red and moves the cursor.
const evilID = "GPU-\x1b[31mEVIL\x1b[2A"

type evilLister struct {
	v1.UnimplementedPodResourcesListerServer
}

func (evilLister) List(context.Context, *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	return &v1.ListPodResourcesResponse{PodResources: []*v1.PodResources{{
		Name: "evil", Namespace: "ml",
		Containers: []*v1.ContainerResources{{Name: "app", Devices: []*v1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{evilID}},
		}}},
	}}}, nil
}

// serve answers PodResources with lister on a new socket until the test
// ends, and returns the socket's path.
func serve(t *testing.T, lister v1.PodResourcesListerServer) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "prc-") // not t.TempDir(): socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "podres.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(srv, lister)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return sock
}

// query runs `podres-proxy query args...` and returns what it printed.
func query(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := cmdline.ExitCode("query", Run(context.Background(), args, &out, &errOut), &errOut); code != 0 {
		t.Fatalf("query %v: exit %d: %s", args, code, errOut.String())
	}
	return out.String()
}

func TestQueryEscapesDeviceIDsForTheTerminal(t *testing.T) {
	sock := serve(t, evilLister{})
	out := query(t, "list", "--socket", sock)
	if strings.Contains(out, "\x1b") || !strings.Contains(out, `GPU-\x1b[31mEVIL\x1b[2A`) {
		t.Errorf("query list does not show the id escaped:\n%q", out)
	}
}

// podLevelLister answers like a 1.37 kubelet for a pod with pod-level
// resources: the pod's own CPUs and memory beside its container's.
type podLevelLister struct {
	v1.UnimplementedPodResourcesListerServer
}

func (podLevelLister) pod() *v1.PodResources {
	return &v1.PodResources{
		Name: "train", Namespace: "ml",
		CpuIds: []int64{2, 3, 4, 5},
		Memory: []*v1.ContainerMemory{
			{MemoryType: "memory", Size: 2 << 30, Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 0}}}},
			{MemoryType: "hugepages-1Gi", Size: 1 << 30, Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 1}}}},
		},
		Containers: []*v1.ContainerResources{{Name: "app", CpuIds: []int64{2, 3}, Devices: []*v1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-8f3b2a1c-5d6e-4f70-8a9b-0c1d2e3f4a5b"}, Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: 0}}}},
		}}},
	}
}

func (l podLevelLister) List(context.Context, *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	return &v1.ListPodResourcesResponse{PodResources: []*v1.PodResources{l.pod(), {Name: "cpus-only", Namespace: "ml", CpuIds: []int64{7}}}}, nil
}

func (l podLevelLister) Get(context.Context, *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	return &v1.GetPodResourcesResponse{PodResources: l.pod()}, nil
}

// A pod with pod-level resources (Kubernetes 1.37) has CPUs and memory of
// its own, beside its containers': query's table shows them on the pod's
// own rows (CONTAINER <pod>), a row per memory type.
func TestQueryShowsThePodsOwnCPUsAndMemory(t *testing.T) {
	sock := serve(t, podLevelLister{})
	want := [][]string{
		{"ml", "train", "<pod>", "memory", "2Gi", "0", "2,3,4,5"},
		{"ml", "train", "<pod>", "hugepages-1Gi", "1Gi", "1"},
		{"ml", "train", "app", "nvidia.com/gpu", "GPU-8f3b2a1c-5d6e-4f70-8a9b-0c1d2e3f4a5b", "0", "2,3"},
	}
	for _, args := range [][]string{{"list"}, {"get", "ml/train"}} {
		out := query(t, append(args, "--socket", sock)...)
		var rows [][]string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
			rows = append(rows, strings.Fields(line))
		}
		w := want
		if args[0] == "list" {
			w = append([][]string{{"ml", "cpus-only", "<pod>", "<none>", "7"}}, want...)
		}
		if !slices.EqualFunc(rows, w, slices.Equal) {
			t.Errorf("query %s shows\n%s\nwant the rows %q", args[0], out, w)
		}
	}
}
