package plugin

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/net/multiplex"
	"github.com/containerd/ttrpc"

	"github.com/podres-proxy/podres-proxy/state"
)

// brokenRuntime is an NRI runtime that answers RegisterPlugin and then
// either dies at once (closes the connection right after its answer) or
// never configures the plugin. Every connection behaves the same, and each
// registration is reported on registered.
type brokenRuntime struct {
	dies       bool
	registered chan struct{}

	mu    sync.Mutex
	conns []net.Conn
}

func startBrokenRuntime(t *testing.T, socket string, dies bool) *brokenRuntime {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	rt := &brokenRuntime{dies: dies, registered: make(chan struct{}, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		l.Close()
		rt.mu.Lock()
		for _, c := range rt.conns {
			c.Close()
		}
		rt.mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			trunk := &dyingConn{Conn: conn}
			rt.mu.Lock()
			rt.conns = append(rt.conns, conn)
			rt.mu.Unlock()
			mux := multiplex.Multiplex(trunk)
			rl, err := mux.Listen(multiplex.RuntimeServiceConn)
			if err != nil {
				t.Error(err)
				return
			}
			srv, err := ttrpc.NewServer()
			if err != nil {
				t.Error(err)
				return
			}
			api.RegisterRuntimeService(srv, &brokenRuntimeService{rt: rt, trunk: trunk})
			wg.Add(1)
			go func() {
				defer wg.Done()
				srv.Serve(ctx, rl)
			}()
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ctx.Done()
				srv.Close()
				mux.Close()
			}()
		}
	}()
	return rt
}

// dyingConn closes itself once it has written the answer it was armed for:
// nri's multiplexer writes a frame's header and its payload separately, so
// the answer is the two writes after arm.
type dyingConn struct {
	net.Conn
	mu   sync.Mutex
	left int // writes before dying; 0: not armed
}

func (c *dyingConn) arm() {
	c.mu.Lock()
	c.left = 2
	c.mu.Unlock()
}

func (c *dyingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	die := false
	if c.left > 0 {
		c.left--
		die = c.left == 0
	}
	c.mu.Unlock()
	if die {
		c.Conn.Close()
	}
	return n, err
}

type brokenRuntimeService struct {
	rt    *brokenRuntime
	trunk *dyingConn
}

func (s *brokenRuntimeService) RegisterPlugin(context.Context, *api.RegisterPluginRequest) (*api.Empty, error) {
	if s.rt.dies {
		s.trunk.arm() // the answer is the last thing this runtime writes
	}
	s.rt.registered <- struct{}{}
	return &api.Empty{}, nil
}

func (s *brokenRuntimeService) UpdateContainers(context.Context, *api.UpdateContainersRequest) (*api.UpdateContainersResponse, error) {
	return &api.UpdateContainersResponse{}, nil
}

func TestARuntimeThatRegistersButNeverConfiguresIsGivenUpAndRedialled(t *testing.T) {
	for _, tc := range []struct {
		name string
		dies bool
	}{{"dies after RegisterPlugin", true}, {"never configures", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := shortTempDir(t)
			rt := startBrokenRuntime(t, filepath.Join(dir, "nri.sock"), tc.dies)
			p, err := New(state.New(state.Options{}), Options{
				Socket:     filepath.Join(dir, "nri.sock"),
				Log:        testLog(),
				MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
				// A bound, not a measurement: how soon the plugin gives up.
				ConfigureTimeout: 50 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- p.Run(ctx) }()
			// Two registrations: the first stub was given up on and a new
			// one dialled.
			for i := range 2 {
				select {
				case <-rt.registered:
				case <-time.After(hangGuard):
					cancel()
					t.Fatalf("registration %d never came: the plugin hangs on a runtime that %s", i+1, tc.name)
				}
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v at shutdown, want nil", err)
				}
			case <-time.After(hangGuard):
				t.Fatal("Run did not return at shutdown")
			}
		})
	}
}
