// Package deviceplugin is a tiny kubelet device plugin for the e2e suite: it
// advertises a few fake devices of one extended resource so the kubelet
// allocates devices of its own. The suite runs two: example.com/dev, whose
// ids must survive podres-proxy's merge next to the devices it adds from
// annotations, and one that advertises ids the way HAMi's NVIDIA device
// plugin does (HAMiDeviceIDs), which the proxy must replace with the GPUs
// HAMi's scheduler recorded.
//
// It registers with the kubelet in one of two ways:
//
//   - through the plugin watcher (RegistrationDir, normally
//     <kubelet root-dir>/plugins_registry): one socket serves the plugin
//     registration API and the device plugin API; the kubelet finds it by
//     itself, also after a restart. This works under any --root-dir.
//   - through the device manager's registration socket (KubeletSocket): the
//     kubelet v1.36 hard-codes it to /var/lib/kubelet/device-plugins/kubelet.sock
//     whatever its --root-dir; the plugin registers again whenever the
//     kubelet restarts (the kubelet then removes the plugin's socket).
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// HAMiDeviceIDs returns the ids HAMi's NVIDIA device plugin advertises for
// GPUs each split split ways: <uuid>-0 .. <uuid>-<split-1> per GPU, one per
// vGPU slot. The kubelet allocates these, but HAMi's scheduler records the
// GPU's own UUID in the pod's hami.io/vgpu-devices-allocated annotation and
// HAMi's Allocate follows the annotation, not the ids it was given: the ids
// the kubelet reports name no real GPU, and DCGM exporter cannot match them.
func HAMiDeviceIDs(uuids []string, split int) []string {
	ids := make([]string, 0, len(uuids)*max(split, 0))
	for _, uuid := range uuids {
		for i := range split {
			ids = append(ids, fmt.Sprintf("%s-%d", uuid, i))
		}
	}
	return ids
}

// Options configure a Plugin. Exactly one of RegistrationDir and
// KubeletSocket must be set.
type Options struct {
	// ResourceName is the extended resource, e.g. "example.com/dev". It
	// also names the plugin's socket, so plugins of different resources
	// can share a directory.
	ResourceName string
	// DeviceIDs are the devices advertised, all healthy (HAMiDeviceIDs for
	// HAMi-style ids).
	DeviceIDs []string
	// RegistrationDir is the kubelet's plugin watcher directory.
	RegistrationDir string
	// KubeletSocket is the device manager's registration socket.
	KubeletSocket string
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// Plugin is a running device plugin.
type Plugin struct {
	opts    Options
	socket  string
	mu      sync.Mutex
	allocs  [][]string
	regs    int
	lastErr error
}

// New checks opts and returns a plugin ready to Run.
func New(opts Options) (*Plugin, error) {
	if opts.ResourceName == "" || len(opts.DeviceIDs) == 0 {
		return nil, errors.New("device plugin needs a resource name and devices")
	}
	if (opts.RegistrationDir == "") == (opts.KubeletSocket == "") {
		return nil, errors.New("device plugin needs exactly one of RegistrationDir and KubeletSocket")
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	name := strings.NewReplacer("/", "-", ".", "-").Replace(opts.ResourceName) + ".sock"
	dir := opts.RegistrationDir
	if dir == "" {
		dir = filepath.Dir(opts.KubeletSocket)
	}
	return &Plugin{opts: opts, socket: filepath.Join(dir, name)}, nil
}

// Socket is the plugin's own socket.
func (p *Plugin) Socket() string { return p.socket }

// Allocations returns the device ids of every Allocate call so far, one
// entry per container request.
func (p *Plugin) Allocations() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.allocs)
}

// Registrations counts how often the kubelet accepted the plugin.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.regs
}

// LastError is the last serving or registration error, if any.
func (p *Plugin) LastError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastErr
}

// Run serves until ctx ends, serving again (and, with KubeletSocket,
// registering again) whenever the kubelet removed the plugin's socket.
func (p *Plugin) Run(ctx context.Context) error {
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	for {
		err := p.serveOnce(ctx, ticker.C)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			p.setErr(err)
			p.opts.Logf("device plugin %s: %v; retrying", p.opts.ResourceName, err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
	}
}

// serveOnce serves on a fresh socket until ctx ends or the socket is gone.
func (p *Plugin) serveOnce(ctx context.Context, tick <-chan time.Time) error {
	if err := os.MkdirAll(filepath.Dir(p.socket), 0o750); err != nil {
		return fmt.Errorf("create plugin directory: %w", err)
	}
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale plugin socket: %w", err)
	}
	lis, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", p.socket, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, &devicePluginServer{p: p})
	if p.opts.RegistrationDir != "" {
		registerapi.RegisterRegistrationServer(srv, &registrationServer{p: p})
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-done
	}()
	p.opts.Logf("device plugin %s: serving on %s", p.opts.ResourceName, p.socket)

	if p.opts.KubeletSocket != "" {
		if err := p.register(ctx); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-done:
			done <- err
			return fmt.Errorf("serve: %w", err)
		case <-tick:
			if _, err := os.Stat(p.socket); err != nil {
				p.opts.Logf("device plugin %s: socket removed (kubelet restarted?)", p.opts.ResourceName)
				return nil
			}
		}
	}
}

// register asks the device manager to use the plugin.
func (p *Plugin) register(ctx context.Context) error {
	conn, err := grpc.NewClient("unix://"+p.opts.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to kubelet %s: %w", p.opts.KubeletSocket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket),
		ResourceName: p.opts.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet: %w", p.opts.ResourceName, err)
	}
	p.registered()
	return nil
}

func (p *Plugin) registered() {
	p.mu.Lock()
	p.regs++
	p.lastErr = nil
	p.mu.Unlock()
	p.opts.Logf("device plugin %s: registered with the kubelet", p.opts.ResourceName)
}

func (p *Plugin) setErr(err error) {
	p.mu.Lock()
	p.lastErr = err
	p.mu.Unlock()
}

// registrationServer answers the kubelet's plugin watcher.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	p *Plugin
}

func (r *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DevicePlugin,
		Name:              r.p.opts.ResourceName,
		SupportedVersions: []string{pluginapi.Version},
	}, nil
}

func (r *registrationServer) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.GetPluginRegistered() {
		r.p.registered()
	} else {
		err := fmt.Errorf("kubelet refused the plugin: %s", s.GetError())
		r.p.setErr(err)
		r.p.opts.Logf("device plugin %s: %v", r.p.opts.ResourceName, err)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// devicePluginServer is the device plugin API.
type devicePluginServer struct {
	pluginapi.UnimplementedDevicePluginServer
	p *Plugin
}

func (d *devicePluginServer) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the devices once and holds the stream open until the
// kubelet closes it or the plugin's server stops.
func (d *devicePluginServer) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range d.p.opts.DeviceIDs {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return fmt.Errorf("send devices: %w", err)
	}
	<-stream.Context().Done()
	return nil
}

func (d *devicePluginServer) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// Allocate records the ids and hands them to the container in an
// environment variable, as a real plugin hands device nodes.
func (d *devicePluginServer) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	d.p.mu.Lock()
	defer d.p.mu.Unlock()
	for _, c := range req.GetContainerRequests() {
		ids := slices.Clone(c.GetDevicesIds())
		d.p.allocs = append(d.p.allocs, ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"EXAMPLE_DEV_IDS": strings.Join(ids, ",")},
		})
	}
	return resp, nil
}

func (d *devicePluginServer) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
