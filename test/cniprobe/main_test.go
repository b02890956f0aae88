package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// fakeLister answers List with a fixed answer or error.
type fakeLister struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	resp *podresourcesapi.ListPodResourcesResponse
	err  error
}

func (f *fakeLister) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	return f.resp, f.err
}

// serve starts a PodResources server on a socket in a temp dir.
func serve(t *testing.T, l *fakeLister) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, l)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return sock
}

func dev(resource string, ids ...string) *podresourcesapi.ContainerDevices {
	return &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: ids}
}

func TestPodDevicesTakesTheResourcesIDsInContainerOrder(t *testing.T) {
	sock := serve(t, &fakeLister{resp: &podresourcesapi.ListPodResourcesResponse{PodResources: []*podresourcesapi.PodResources{
		{Namespace: "other", Name: "pod", Containers: []*podresourcesapi.ContainerResources{
			{Name: "c", Devices: []*podresourcesapi.ContainerDevices{dev("koordinator.sh/rdma", "0000:99:00.1")}},
		}},
		{Namespace: "ns", Name: "pod", Containers: []*podresourcesapi.ContainerResources{
			{Name: "sidecar"},
			{Name: "a", Devices: []*podresourcesapi.ContainerDevices{dev("koordinator.sh/rdma", "0000:3b:02.1")}},
			{Name: "b", Devices: []*podresourcesapi.ContainerDevices{dev("nvidia.com/gpu", "GPU-1"), dev("koordinator.sh/rdma", "0000:3b:02.2")}},
		}},
	}}})
	found, ids, err := podDevices(context.Background(), sock, "ns", "pod", "koordinator.sh/rdma")
	if err != nil || !found {
		t.Fatalf("podDevices = %v, %v, %v; want the pod found", found, ids, err)
	}
	if want := []string{"0000:3b:02.1", "0000:3b:02.2"}; !slices.Equal(ids, want) {
		t.Errorf("ids = %v, want %v", ids, want)
	}
}

func TestPodDevicesOfAnUnlistedPodIsEmptyWithoutError(t *testing.T) {
	sock := serve(t, &fakeLister{resp: &podresourcesapi.ListPodResourcesResponse{}})
	found, ids, err := podDevices(context.Background(), sock, "ns", "pod", "koordinator.sh/rdma")
	if err != nil || found || len(ids) != 0 {
		t.Errorf("podDevices = %v, %v, %v; want not found, no ids, no error (as Multus)", found, ids, err)
	}
}

func TestPodDevicesFailsWhenTheSocketErrs(t *testing.T) {
	sock := serve(t, &fakeLister{err: status.Error(codes.Unavailable, "kubelet is restarting")})
	if _, _, err := podDevices(context.Background(), sock, "ns", "pod", "r"); err == nil || !strings.Contains(err.Error(), "kubelet is restarting") {
		t.Errorf("podDevices error = %v, want the server's error", err)
	}
	missing := filepath.Join(t.TempDir(), "kubelet.sock")
	if _, _, err := podDevices(context.Background(), missing, "ns", "pod", "r"); err == nil {
		t.Error("podDevices on a missing socket succeeded")
	}
	if _, _, err := podDevices(context.Background(), sock, "", "", "r"); err == nil {
		t.Error("podDevices without a pod name succeeded")
	}
}

func TestDelegateConfCarriesNetworkAndDeviceID(t *testing.T) {
	c := &conf{Delegate: map[string]any{"type": "bridge", "bridge": "br0"}}
	c.CNIVersion, c.Name = "1.0.0", "net"
	b, typ, err := c.delegateConf("0000:3b:02.1")
	if err != nil || typ != "bridge" {
		t.Fatalf("delegateConf = %s, %q, %v", b, typ, err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"cniVersion": "1.0.0", "name": "net", "bridge": "br0", "deviceID": "0000:3b:02.1", "pciBusID": "0000:3b:02.1"} {
		if got[k] != want {
			t.Errorf("delegate %s = %v, want %q", k, got[k], want)
		}
	}
	if _, ok := c.Delegate["deviceID"]; ok {
		t.Error("delegateConf modified the probe's own config")
	}
	b, _, _ = c.delegateConf("")
	if strings.Contains(string(b), "deviceID") {
		t.Errorf("delegate config without a device has a deviceID: %s", b)
	}
}

// The probe reads the device-info file of the device it hands on where
// Multus does, and records what Multus would copy into network-status.
func TestDeviceInfoIsReadWhereMultusReadsIt(t *testing.T) {
	dir := t.TempDir()
	const content = `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:02.1"}}`
	if err := os.WriteFile(filepath.Join(dir, "koordinator.sh-rdma-0000:3b:02.1-device.json"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := deviceInfo(dir, "koordinator.sh/rdma", "0000:3b:02.1")
	if err != nil || string(got) != content {
		t.Errorf("deviceInfo = %s, %v; want the file's content", got, err)
	}
	if got, err := deviceInfo(dir, "koordinator.sh/rdma", "0000:3b:02.2"); got != nil || err != nil {
		t.Errorf("no file: deviceInfo = %s, %v; want nothing, no error (Multus only logs it)", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "r-x-device.json"), []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := deviceInfo(dir, "r", "x"); err == nil {
		t.Error("a file that is not JSON was taken")
	}
}
