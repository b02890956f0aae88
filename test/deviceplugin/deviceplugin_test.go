package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/podres-proxy/podres-proxy/test/poll"
)

// fakeRegistry is the device manager's registration service.
type fakeRegistry struct {
	pluginapi.UnimplementedRegistrationServer
	mu   sync.Mutex
	reqs []*pluginapi.RegisterRequest
}

func (f *fakeRegistry) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, r)
	return &pluginapi.Empty{}, nil
}

func (f *fakeRegistry) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.reqs)
}

// runPlugin runs p until the test ends.
func runPlugin(t *testing.T, p *Plugin) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func connect(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestPluginRegistersServesDevicesAndRegistersAgainAfterKubeletRestart(t *testing.T) {
	dir := t.TempDir()
	kubeletSock := filepath.Join(dir, "kubelet.sock")
	lis, err := net.Listen("unix", kubeletSock)
	if err != nil {
		t.Fatal(err)
	}
	reg := &fakeRegistry{}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	p, err := New(Options{ResourceName: "example.com/dev", DeviceIDs: []string{"dev-0", "dev-1"}, KubeletSocket: kubeletSock})
	if err != nil {
		t.Fatal(err)
	}
	runPlugin(t, p)
	poll.Until(t, "registration", func() bool { return reg.count() == 1 })
	r := reg.reqs[0]
	if r.ResourceName != "example.com/dev" || r.Version != pluginapi.Version || filepath.Join(dir, r.Endpoint) != p.Socket() {
		t.Errorf("registration %v, want example.com/dev at %s", r, p.Socket())
	}

	client := pluginapi.NewDevicePluginClient(connect(t, p.Socket()))
	stream, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range devs.GetDevices() {
		if d.GetHealth() != pluginapi.Healthy {
			t.Errorf("device %s is %s", d.GetID(), d.GetHealth())
		}
		ids = append(ids, d.GetID())
	}
	if !slices.Equal(ids, []string{"dev-0", "dev-1"}) {
		t.Errorf("devices %v", ids)
	}
	resp, err := client.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"dev-1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetContainerResponses()[0].GetEnvs()["EXAMPLE_DEV_IDS"]; got != "dev-1" {
		t.Errorf("Allocate env = %q, want dev-1", got)
	}
	if got := p.Allocations(); len(got) != 1 || !slices.Equal(got[0], []string{"dev-1"}) {
		t.Errorf("Allocations = %v", got)
	}

	// A restarting kubelet removes the plugin sockets: the plugin serves
	// and registers again.
	if err := os.Remove(p.Socket()); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "registration after the socket was removed", func() bool { return reg.count() == 2 })
	poll.Until(t, "the socket again", func() bool { _, err := os.Stat(p.Socket()); return err == nil })
}

func TestPluginAnswersThePluginWatcher(t *testing.T) {
	dir := t.TempDir()
	p, err := New(Options{ResourceName: "example.com/dev", DeviceIDs: []string{"dev-0"}, RegistrationDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	runPlugin(t, p)
	poll.Until(t, "the plugin socket", func() bool { _, err := os.Stat(p.Socket()); return err == nil })
	if filepath.Dir(p.Socket()) != dir {
		t.Errorf("socket %s is not in the registration dir %s", p.Socket(), dir)
	}
	reg := registerapi.NewRegistrationClient(connect(t, p.Socket()))
	info, err := reg.GetInfo(context.Background(), &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetType() != registerapi.DevicePlugin || info.GetName() != "example.com/dev" || !slices.Contains(info.GetSupportedVersions(), pluginapi.Version) {
		t.Errorf("GetInfo = %v", info)
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if p.Registrations() != 1 {
		t.Errorf("Registrations = %d, want 1", p.Registrations())
	}
	if _, err := reg.NotifyRegistrationStatus(context.Background(), &registerapi.RegistrationStatus{Error: "bad"}); err != nil {
		t.Fatal(err)
	}
	if p.LastError() == nil {
		t.Error("a refused registration left no error")
	}
}

func TestNewRejectsIncompleteOptions(t *testing.T) {
	for _, o := range []Options{
		{DeviceIDs: []string{"a"}, RegistrationDir: "/x"},
		{ResourceName: "example.com/dev", RegistrationDir: "/x"},
		{ResourceName: "example.com/dev", DeviceIDs: []string{"a"}},
		{ResourceName: "example.com/dev", DeviceIDs: []string{"a"}, RegistrationDir: "/x", KubeletSocket: "/y"},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

func TestHAMiDeviceIDsNameEverySlotOfEveryGPU(t *testing.T) {
	got := HAMiDeviceIDs([]string{"GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76", "GPU-0b1c"}, 2)
	want := []string{
		"GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76-0", "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76-1",
		"GPU-0b1c-0", "GPU-0b1c-1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("HAMiDeviceIDs = %v, want %v", got, want)
	}
	if got := HAMiDeviceIDs([]string{"GPU-0b1c"}, 0); len(got) != 0 {
		t.Errorf("HAMiDeviceIDs with no split = %v, want none", got)
	}
}

// TestPluginsOfTwoResourcesShareARegistrationDir: the e2e suite runs two
// plugins in the kubelet's plugin watcher directory; each must have its own
// socket and tell the kubelet its own resource and devices.
func TestPluginsOfTwoResourcesShareARegistrationDir(t *testing.T) {
	dir := t.TempDir()
	want := map[string][]string{
		"example.com/dev": {"dev-0", "dev-1"},
		"nvidia.com/vgpu": HAMiDeviceIDs([]string{"GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"}, 2),
	}
	sockets := map[string]bool{}
	for resource, ids := range want {
		p, err := New(Options{ResourceName: resource, DeviceIDs: ids, RegistrationDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if sockets[p.Socket()] {
			t.Fatalf("two plugins on socket %s", p.Socket())
		}
		sockets[p.Socket()] = true
		runPlugin(t, p)
		poll.Until(t, "the socket of "+resource, func() bool { _, err := os.Stat(p.Socket()); return err == nil })
	}
	for socket := range sockets {
		conn := connect(t, socket)
		info, err := registerapi.NewRegistrationClient(conn).GetInfo(context.Background(), &registerapi.InfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		devs, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range devs.GetDevices() {
			ids = append(ids, d.GetID())
		}
		if w, ok := want[info.GetName()]; !ok || !slices.Equal(ids, w) {
			t.Errorf("the plugin on %s says it is %q with devices %v; want one of %v", socket, info.GetName(), ids, want)
		}
		delete(want, info.GetName())
	}
	if len(want) != 0 {
		t.Errorf("no plugin answered for %v", want)
	}
}
