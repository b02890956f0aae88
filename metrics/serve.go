package metrics

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/podres-proxy/podres-proxy/internal/unixsock"
)

// Serve serves reg on /metrics, with /healthz (the process answers) and
// /readyz (ready says the PodResources socket is being served), on addr
// until ctx is done. The port is bound with SO_REUSEPORT, so that the new
// instance of a rolling update serves it beside the old one (the kernel
// spreads connections between them); only a process of the same user can
// bind it too.
func Serve(ctx context.Context, addr string, reg *prometheus.Registry, ready func() bool, log logrus.FieldLogger) error {
	mux := healthMux(ready)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	lc := net.ListenConfig{Control: reusePort}
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	log.WithField("addr", l.Addr().String()).Info("serving /metrics, /healthz and /readyz")
	return serveHTTP(ctx, l, mux)
}

// ServeProbes serves /healthz and /readyz, as Serve does, on the unix
// socket path until ctx is done. The socket is this process's alone (each
// pod's directory is its own), so the kubelet's probes ask this instance,
// never another one serving the same node beside it.
func ServeProbes(ctx context.Context, path string, ready func() bool, log logrus.FieldLogger) error {
	l, err := unixsock.Listen(path, "")
	if err != nil {
		return fmt.Errorf("probe socket: %w", err)
	}
	log.WithField("socket", path).Info("serving /healthz and /readyz for this instance's probes")
	return serveHTTP(ctx, l, healthMux(ready))
}

func healthMux(ready func() bool) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "the PodResources socket is not served yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}

// serveHTTP serves h on l until ctx is done, then closes l.
func serveHTTP(ctx context.Context, l net.Listener, h http.Handler) error {
	return runServer(ctx, l, &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second})
}

// runServer runs hs on l until ctx is done, then shuts it down.
func runServer(ctx context.Context, l net.Listener, hs *http.Server) error {
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return nil
}

// reusePort sets SO_REUSEPORT on a socket before it is bound.
func reusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	return serr
}
