package query

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
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

func TestQueryEscapesDeviceIDsForTheTerminal(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc-") // not t.TempDir(): socket paths are limited to 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "evil.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(srv, evilLister{})
	go srv.Serve(l)
	defer srv.Stop()
	var out, errOut bytes.Buffer
	if code := cmdline.ExitCode("query", Run(context.Background(), []string{"list", "--socket", sock}, &out, &errOut), &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if strings.Contains(out.String(), "\x1b") || !strings.Contains(out.String(), `GPU-\x1b[31mEVIL\x1b[2A`) {
		t.Errorf("query list does not show the id escaped:\n%q", out.String())
	}
}
