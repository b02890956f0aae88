// Package bearer is the HTTPS client of the kubelet's /pods reads, which
// send a bearer token. The API server is spoken to through client-go only
// (internal/apiclient, which keeps the same rules for the token and the CA).
//
// The rule: the token file and the CA file are read again at every request
// (each is a few KiB, read through the projected volume's ..data link, so a
// rotation is seen at the next request), and the HTTP client is rebuilt only
// when the CA file's content changed, so that connections are kept across
// requests. The CA file is read once at New too, so a wrong path is an error
// at start-up.
// The token is sent over https only, and redirects are never followed, so
// it never travels anywhere but the URL asked.
//
// Every read is one bounded GET (Get): its deadline is the caller's
// context, and its body never yields more than the limit it was given.
package bearer

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/podres-proxy/podres-proxy/internal/credfile"
)

// Config says how to authenticate to a server and verify it.
type Config struct {
	// What names the server in errors ("kubelet", "API server").
	What string
	// TokenFile holds the bearer token; "" sends none.
	TokenFile string
	// CAFile is a PEM bundle to verify the server with; "" means the
	// system roots.
	CAFile string
	// InsecureTLS skips verification of the server's certificate.
	InsecureTLS bool
	// HandshakeTimeout bounds a TLS handshake; 0 means 10 s.
	HandshakeTimeout time.Duration
	// Proxy is the transport's proxy function; nil connects directly.
	Proxy func(*http.Request) (*url.URL, error)
}

// Client does requests with the token and the CA files' current contents.
// It is safe for concurrent use.
type Client struct {
	cfg Config

	mu    sync.Mutex
	caPEM []byte // the CA file's content the client was built with
	http  *http.Client
}

// New returns a client, loading the CA file now.
func New(cfg Config) (*Client, error) {
	cfg.HandshakeTimeout = cmp.Or(cfg.HandshakeTimeout, 10*time.Second)
	if cfg.InsecureTLS {
		cfg.CAFile = "" // nothing to verify with
	}
	c := &Client{cfg: cfg}
	if _, err := c.client(); err != nil {
		return nil, err
	}
	return c, nil
}

// Roots says what verifies the server, for errors.
func (c *Client) Roots() string {
	if c.cfg.CAFile == "" {
		return "the system roots"
	}
	return "the CAs of " + c.cfg.CAFile
}

// do sends req with the token (over https only) and returns the response.
func (c *Client) do(req *http.Request) (*http.Response, error) {
	client, err := c.client()
	if err != nil {
		return nil, err
	}
	if c.cfg.TokenFile != "" && req.URL.Scheme == "https" {
		b, err := credfile.Read(c.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("%s token file: %w", c.cfg.What, err)
		}
		token := strings.TrimSpace(string(b))
		if token == "" {
			return nil, fmt.Errorf("%s token file %s is empty", c.cfg.What, c.cfg.TokenFile)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return client.Do(req)
}

// ErrTooLarge is what reading an answer's body past Get's limit returns.
var ErrTooLarge = errors.New("answer larger than the limit")

// Get sends one GET of url, asking for JSON, and returns the answer. Its
// Body yields at most limit bytes and then fails with ErrTooLarge if the
// answer goes on, so that a cut answer is never taken for a whole one. ctx
// bounds both the request and the reading of the body.
func (c *Client) Get(ctx context.Context, url string, limit int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("building the %s request: %w", c.cfg.What, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "podres-proxy")
	resp, err := c.do(req)
	if err != nil {
		return nil, err
	}
	resp.Body = &boundedBody{ReadCloser: resp.Body, left: limit}
	return resp, nil
}

// boundedBody is an answer's body cut at a limit.
type boundedBody struct {
	io.ReadCloser
	left int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly the limit from a longer one.
		var one [1]byte
		if _, err := io.ReadFull(b.ReadCloser, one[:]); err != nil {
			return 0, err
		}
		return 0, ErrTooLarge
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// client returns the HTTP client for the CA file's current content,
// rebuilding it when that changed (a rotated CA).
func (c *Client) client() (*http.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var pem []byte
	if c.cfg.CAFile != "" {
		b, err := credfile.Read(c.cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read %s CA file: %w", c.cfg.What, err)
		}
		pem = b
	}
	if c.http != nil && bytes.Equal(pem, c.caPEM) {
		return c.http, nil
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.cfg.InsecureTLS}
	if c.cfg.CAFile != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s CA file %s: no PEM certificate in it", c.cfg.What, c.cfg.CAFile)
		}
		tlsConfig.RootCAs = pool
	}
	if c.http != nil {
		c.http.CloseIdleConnections()
	}
	c.caPEM = pem
	c.http = &http.Client{
		CheckRedirect: func(req *http.Request, _ []*http.Request) error {
			return fmt.Errorf("redirected to %s: not followed (the %s never redirects; the token stays here)", req.URL.Redacted(), c.cfg.What)
		},
		Transport: &http.Transport{
			Proxy:               c.cfg.Proxy,
			DialContext:         (&net.Dialer{KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:     tlsConfig,
			TLSHandshakeTimeout: c.cfg.HandshakeTimeout,
			MaxIdleConns:        2,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	return c.http, nil
}
