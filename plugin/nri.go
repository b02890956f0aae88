package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podres-proxy/podres-proxy/state"
)

// Defaults for Options.
const (
	DefaultSocket     = api.DefaultSocketPath // /var/run/nri/nri.sock
	DefaultName       = "podres-proxy"
	DefaultIndex      = "90"
	DefaultMinBackoff = 500 * time.Millisecond
	DefaultMaxBackoff = 30 * time.Second
	// DefaultConfigureTimeout bounds the time from dialling the runtime to
	// its Configure. Runtimes register a plugin within 5 s (their
	// registration timeout) and configure it at once.
	DefaultConfigureTimeout = 15 * time.Second
	// abandonWait bounds how long Run waits for an abandoned stub to give
	// up, so that shutdown never waits on a stub that hangs.
	abandonWait = 2 * time.Second
)

// Options configure a Plugin. Zero values mean the defaults.
type Options struct {
	// Socket is the runtime's NRI socket.
	Socket string
	// Name is the name the plugin registers under. Ignored when the
	// runtime pre-launched the plugin (NRI_PLUGIN_NAME is set).
	Name string
	// Index orders the plugin among the runtime's NRI plugins. The default,
	// 90, makes the plugin one of the last to see each event, so a pod
	// that another plugin vetoes is never recorded as running. Ignored
	// when the runtime pre-launched the plugin (NRI_PLUGIN_IDX is set).
	Index string
	// Log receives the plugin's messages; nil means logrus's standard logger.
	Log logrus.FieldLogger
	// MinBackoff and MaxBackoff bound the wait between connection attempts.
	MinBackoff, MaxBackoff time.Duration
	// ConfigureTimeout bounds registration and configuration: a runtime
	// that has not configured the plugin this long after it connected
	// (it died right after RegisterPlugin, say) is given up on and dialled
	// again. 0 means DefaultConfigureTimeout.
	ConfigureTimeout time.Duration
	// Metrics receives counters; nil discards them.
	Metrics Metrics
	// OnSynchronized, when set, is called after each Synchronize has been
	// applied to the store (once per connection), off the request path.
	// The daemon uses it to trigger a CRI reconcile, which knows the
	// sandbox states that Synchronize leaves out.
	OnSynchronized func()
}

// Plugin is the NRI lifecycle recorder. It is created by New and connected
// by Run.
type Plugin struct {
	opts        Options
	handlers    *handlers
	preLaunched bool
	// stubOptions are added to every stub; tests use them to capture the
	// connection.
	stubOptions []stub.Option
}

// New returns a plugin that records into store.
func New(store *state.Store, opts Options) (*Plugin, error) {
	if store == nil {
		return nil, errors.New("creating NRI plugin: nil state store")
	}
	opts.Socket = cmp.Or(opts.Socket, DefaultSocket)
	opts.Name = cmp.Or(opts.Name, DefaultName)
	opts.Index = cmp.Or(opts.Index, DefaultIndex)
	opts.Log = cmp.Or[logrus.FieldLogger](opts.Log, logrus.StandardLogger())
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	if opts.ConfigureTimeout <= 0 {
		opts.ConfigureTimeout = DefaultConfigureTimeout
	}
	if opts.MaxBackoff < opts.MinBackoff {
		return nil, fmt.Errorf("creating NRI plugin: max backoff %s is below min backoff %s", opts.MaxBackoff, opts.MinBackoff)
	}
	if err := api.CheckPluginName(opts.Name); err != nil {
		return nil, fmt.Errorf("creating NRI plugin: %w", err)
	}
	if err := api.CheckPluginIndex(opts.Index); err != nil {
		return nil, fmt.Errorf("creating NRI plugin: %w", err)
	}
	p := &Plugin{
		opts:        opts,
		handlers:    newHandlers(store, opts.Log, opts.Metrics, opts.OnSynchronized),
		preLaunched: os.Getenv(api.PluginSocketEnvVar) != "",
	}
	// Build one stub now so that whatever it rejects is reported here,
	// not at the first connection.
	if _, _, err := p.newStub(); err != nil {
		return nil, err
	}
	return p, nil
}

// Run connects to the runtime and records its events until ctx is done, then
// returns nil. When the connection drops (the runtime restarted) or cannot
// be made, it tries again with exponential backoff; every new connection
// starts with a Synchronize. A pre-launched plugin cannot redial the
// connection the runtime handed over, so Run returns an error when that
// connection closes. Run must not be called again while it is running.
func (p *Plugin) Run(ctx context.Context) error {
	log := p.opts.Log.WithField("socket", p.opts.Socket)
	if p.preLaunched {
		log = p.opts.Log.WithField("socket", "pre-connected by the runtime")
	}
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: p.opts.MinBackoff, Factor: 2, Cap: p.opts.MaxBackoff, Steps: math.MaxInt32}
	}
	backoff := newBackoff()
	failures := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			p.opts.Metrics.NRIReconnect()
		}
		s, conn, err := p.newStub()
		if err != nil {
			return err // New built one with the same options, so this is unexpected
		}
		err = p.runStub(ctx, s, conn, p.handlers.connecting())
		wasSynced := p.handlers.disconnected()
		p.opts.Metrics.NRIConnected(false)
		if ctx.Err() != nil {
			log.Info("Left the runtime's NRI")
			return nil
		}
		if p.preLaunched {
			return fmt.Errorf("NRI connection handed over by the runtime closed: %w", err)
		}
		switch {
		case wasSynced:
			backoff, failures = newBackoff(), 0
			log.WithError(err).Infof("Lost the NRI connection (runtime restarting?); reconnecting in %s", backoff.Duration)
		case failures == 0:
			log.WithError(err).Warnf("Cannot connect to NRI; retrying with backoff up to %s", p.opts.MaxBackoff)
		default:
			log.WithError(err).Debugf("Cannot connect to NRI; retrying in %s", backoff.Duration)
		}
		delay := backoff.Duration // a lost connection is retried at once at the minimum
		if !wasSynced {
			failures++
			delay = backoff.Step() // and failures wait twice as long each time
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
	}
}

// runStub runs one stub until its connection ends or ctx is done, bounding
// its registration and configuration.
//
// The nri v0.12.5 stub waits for Configure with no timeout, holding its
// lock, while the handler of a lost connection waits for that lock: when
// the runtime dies right after RegisterPlugin, the stub's Run never
// returns and ignores ctx. So the stub runs in a goroutine; if it is not
// configured within ConfigureTimeout, or ctx ends first, the connection is
// abandoned: its Configure is made to fail (the stub's own Configure is
// called with the handler refusing), which makes the stub's Start return
// and close the connection. Run then dials a new stub. Configure is called
// only once the stub has sent RegisterPlugin on conn, and after taking
// conn's lock, which orders it after everything Start did before sending.
func (p *Plugin) runStub(ctx context.Context, s stub.Stub, conn *trackedDial, configured <-chan struct{}) error {
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	timer := time.NewTimer(p.opts.ConfigureTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-configured:
		return <-done // the stub stops on its own when ctx ends
	case <-timer.C:
	case <-ctx.Done():
	}
	select {
	case <-configured: // just now: the stub runs normally
		return <-done
	default:
	}
	p.handlers.abandon()
	if c, ok := s.(configurer); ok && conn.sent() {
		// Unblocks a Start waiting for Configure. Its reply goes nowhere.
		go c.Configure(context.Background(), &api.ConfigureRequest{})
	}
	bound := time.NewTimer(abandonWait)
	defer bound.Stop()
	select {
	case err := <-done:
		if ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("not configured by the runtime within %s: connection given up (%v)", p.opts.ConfigureTimeout, err)
	case <-bound.C:
		// Never seen with nri v0.12.5; the stub's goroutine is left.
		p.opts.Log.Errorf("An NRI stub given up on did not stop within %s; leaving it", abandonWait)
		return fmt.Errorf("not configured by the runtime within %s: connection given up", p.opts.ConfigureTimeout)
	}
}

// configurer is the nri stub's own Configure request handler, which runtimes
// call through ttrpc; runStub calls it to unblock a stub it gives up on.
type configurer interface {
	Configure(context.Context, *api.ConfigureRequest) (*api.ConfigureResponse, error)
}

// trackedDial dials the runtime for one stub and records whether the stub
// has written to the connection yet (RegisterPlugin is its first write).
type trackedDial struct {
	mu      sync.Mutex
	written bool
}

func (d *trackedDial) dial(path string) (net.Conn, error) {
	c, err := net.Dial("unix", path)
	if err != nil {
		return nil, err
	}
	return &trackedConn{Conn: c, d: d}, nil
}

func (d *trackedDial) sent() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.written
}

type trackedConn struct {
	net.Conn
	d *trackedDial
}

func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.d.mu.Lock()
	c.d.written = true
	c.d.mu.Unlock()
	return n, err
}

// newStub returns a stub for one connection. Each connection gets a new
// stub: a stub whose registration failed keeps its dead connection and
// would never redial.
func (p *Plugin) newStub() (stub.Stub, *trackedDial, error) {
	conn := &trackedDial{}
	opts := []stub.Option{
		stub.WithDialer(conn.dial),
		stub.WithLogger(nriLogger{p.opts.Log.WithField("component", "nri-stub")}),
		stub.WithSocketPath(p.opts.Socket),
		// Runtimes with nri v0.12.4 or later keep a plugin that missed a
		// request timeout registered instead of dropping it; older ones
		// ignore this. Never FailRequest: an observer must not fail pods.
		stub.WithFailurePolicy(&api.FailurePolicy{KeepConnected: true}),
	}
	// The runtime's environment names a pre-launched plugin, and the stub
	// refuses an index set twice.
	if os.Getenv(api.PluginNameEnvVar) == "" {
		opts = append(opts, stub.WithPluginName(p.opts.Name))
	}
	if os.Getenv(api.PluginIdxEnvVar) == "" {
		opts = append(opts, stub.WithPluginIdx(p.opts.Index))
	}
	s, err := stub.New(p.handlers, append(opts, p.stubOptions...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("creating NRI plugin stub: %w", err)
	}
	return s, conn, nil
}

// nriLogger routes the NRI stub's messages to the plugin's logger. The stub
// reports every connection step at info level; Run reports the connection
// state itself, so those steps are debug details here.
type nriLogger struct{ log logrus.FieldLogger }

func (l nriLogger) Debugf(_ context.Context, format string, args ...any) {
	l.log.Debugf(format, args...)
}

func (l nriLogger) Infof(_ context.Context, format string, args ...any) {
	l.log.Debugf(format, args...)
}

func (l nriLogger) Warnf(_ context.Context, format string, args ...any) {
	l.log.Warnf(format, args...)
}

func (l nriLogger) Errorf(_ context.Context, format string, args ...any) {
	l.log.Errorf(format, args...)
}
