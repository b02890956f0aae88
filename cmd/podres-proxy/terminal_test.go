package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

// evilID is a device id a tenant could write in an annotation: it turns an
// operator's terminal red and moves the cursor.
const evilID = "GPU-\x1b[31mEVIL\x1b[2A"

func assertEscaped(t *testing.T, what, out string) {
	t.Helper()
	if strings.Contains(out, "\x1b") {
		t.Errorf("%s printed a raw ESC:\n%q", what, out)
	}
	if !strings.Contains(out, `GPU-\x1b[31mEVIL\x1b[2A`) {
		t.Errorf("%s does not show the id escaped:\n%q", what, out)
	}
}

func TestInspectEscapesDeviceIDsForTheTerminal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := state.Open(dir, state.Options{Decoder: gpuDecoder{}})
	if err != nil {
		t.Fatal(err)
	}
	s.ObserveSandbox(state.OriginNRI, model.Sandbox{ID: "sb1", UID: "uid-1", Namespace: "ml", Name: "evil",
		Annotations: map[string]string{"example.com/gpu": evilID}, Ready: true})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "inspect", "--state-dir", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertEscaped(t, "inspect", out)
}

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

func TestQueryEscapesDeviceIDsForTheTerminal(t *testing.T) {
	sock := filepath.Join(shortTempDir(t), "evil.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(srv, evilLister{})
	go srv.Serve(l)
	defer srv.Stop()
	code, out, errOut := runCmd(t, "query", "list", "--socket", sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	assertEscaped(t, "query list", out)
}
