package metrics

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"golang.org/x/net/netutil"
)

// The bounds of the secure listener: connections at once (Prometheus holds
// one per target), the request's headers, and each request's time.
const (
	secureMaxConnections = 64
	secureMaxHeaderBytes = 16 << 10
)

// ServeSecure serves reg on /metrics only, over TLS with tlsConfig, to the
// requests authorize lets through (internal/apiauth: the API server decides
// who may get /metrics), on addr until ctx is done. Every other path is 404,
// without asking the API server; /healthz and /readyz stay on Serve's
// address and the probe socket. The port is bound with SO_REUSEPORT, as
// Serve's, so both instances of a rolling update serve it. Connections,
// headers and the time of each request are bounded.
func ServeSecure(ctx context.Context, addr string, reg *prometheus.Registry, tlsConfig *tls.Config, authorize func(http.Handler) http.Handler, log logrus.FieldLogger) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", authorize(promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})))
	lc := net.ListenConfig{Control: reusePort}
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	log.WithField("addr", l.Addr().String()).Info("serving /metrics over HTTPS to the callers the API server allows")
	tlsConfig = tlsConfig.Clone()
	tlsConfig.NextProtos = []string{"http/1.1"} // no HTTP/2: one request per scrape needs none
	return runServer(ctx, tls.NewListener(netutil.LimitListener(l, secureMaxConnections), tlsConfig), &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second, // the TLS handshake included
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    secureMaxHeaderBytes,
	})
}
