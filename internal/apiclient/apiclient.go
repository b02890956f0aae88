// Package apiclient turns serve's API server flags (--api-server,
// --api-token-file, --api-ca-file) into the client-go configuration every
// API server conversation of the daemon uses: informers, typed and dynamic
// clients, Events.
//
// Config's requests keep the rules the daemon's own client kept: the CA
// file is read again when a connection is made and its change rebuilds the
// transport (a rotated CA is used at the next request), the token file is
// client-go's (re-read every minute), the token is sent over https only, and
// a request to any host but the API server's is refused, so a redirect
// never carries the token elsewhere.
package apiclient

import (
	"bytes"
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/rest"

	"github.com/podres-proxy/podres-proxy/internal/credfile"
)

// The in-cluster service account's files, the defaults of TokenFile and
// CAFile.
const (
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// UserAgent is the user agent of every request, so that the API server's
// audit log and request counters tell the daemon's requests apart.
const UserAgent = "podres-proxy"

// Options say where the API server is and how to authenticate to it.
type Options struct {
	// Server is the API server's URL; "" means the one a pod finds in its
	// environment (KUBERNETES_SERVICE_HOST and _PORT).
	Server string
	// TokenFile holds the bearer token; "" means DefaultTokenFile. It is
	// sent over https only.
	TokenFile string
	// CAFile is the PEM bundle the server is verified with; "" means
	// DefaultCAFile.
	CAFile string
	// QPS and Burst are the client-side rate limit; 0 means client-go's
	// defaults (5 and 10).
	QPS   float32
	Burst int
}

// Server returns the API server's URL: server when given, else the one a pod
// finds in its environment, checked to be an http(s) URL with a host. It
// fails when neither is there (not in a pod).
func Server(server string) (string, error) {
	if server == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host == "" || port == "" {
			return "", errors.New("no API server URL given and KUBERNETES_SERVICE_HOST/PORT are not set (not running in a pod?)")
		}
		server = "https://" + net.JoinHostPort(host, port)
	}
	if u, err := url.Parse(server); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return "", fmt.Errorf("API server URL %q: want https://host:port", server)
	}
	return server, nil
}

// Config returns the client-go configuration for o. It fails when the server
// cannot be found (Server) or the CA file cannot be read or holds no
// certificate; the token file is read at the first request, so a token
// mounted late is no error here.
func Config(o Options) (*rest.Config, error) {
	server, err := Server(o.Server)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(server) // checked by Server
	cfg := &rest.Config{
		Host:      server,
		UserAgent: UserAgent,
		QPS:       o.QPS,
		Burst:     o.Burst,
	}
	if u.Scheme == "https" {
		cfg.BearerTokenFile = cmp.Or(o.TokenFile, DefaultTokenFile)
		rt := &caTransport{caFile: cmp.Or(o.CAFile, DefaultCAFile), host: u.Host}
		if _, err := rt.transport(); err != nil {
			return nil, err
		}
		cfg.Transport = rt
	} else {
		cfg.Transport = &caTransport{host: u.Host, plain: &http.Transport{
			DialContext:     (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
			IdleConnTimeout: 90 * time.Second,
		}}
	}
	return cfg, nil
}

// caTransport is the transport under client-go's authentication: TLS
// verified with the CA file's current content, to the API server's host only.
type caTransport struct {
	caFile string
	host   string
	plain  *http.Transport // an http:// server's transport; nil for https

	mu    sync.Mutex
	caPEM []byte
	tr    *http.Transport
}

// RoundTrip sends req over the transport for the CA file's current content.
// It refuses a request to a host other than the API server's.
func (c *caTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Host != c.host {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("request to %s refused: the daemon speaks only to the API server at %s (a redirect is never followed with its token)", req.URL.Redacted(), c.host)
	}
	if c.plain != nil {
		return c.plain.RoundTrip(req)
	}
	tr, err := c.transport()
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return tr.RoundTrip(req)
}

// CloseIdleConnections closes the idle connections of the transport in use.
func (c *caTransport) CloseIdleConnections() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
	if c.plain != nil {
		c.plain.CloseIdleConnections()
	}
}

// transport returns the transport for the CA file's current content,
// rebuilding it when the content changed (a rotated CA).
func (c *caTransport) transport() (*http.Transport, error) {
	pem, err := credfile.Read(c.caFile)
	if err != nil {
		return nil, fmt.Errorf("read the API server's CA file: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tr != nil && bytes.Equal(pem, c.caPEM) {
		return c.tr, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("API server CA file %s: no PEM certificate in it", c.caFile)
	}
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
	c.caPEM = pem
	c.tr = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool},
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
	}
	return c.tr, nil
}
