package kubeletpods

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"time"
	"unicode"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/internal/bearer"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsjson"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
)

// Defaults for Config.
const (
	DefaultTimeout = 5 * time.Second
	// DefaultMaxBodyBytes bounds the answer when the Go memory limit
	// (GOMEMLIMIT) is not set. The answer is decoded as a stream, so its
	// size costs time, not memory: the bound stops an endless answer. The
	// kubelet lists finished pods until they are deleted, so /pods can be
	// far larger than the pods that matter.
	DefaultMaxBodyBytes = 256 << 20
)

// memoryBounds fits the bounds of a read to the Go runtime's soft memory
// limit (GOMEMLIMIT, which the DaemonSet sets under the container's
// limit): the body may be twice it, at least 64 MiB (it streams through a
// buffer of about one pod), and what the decoder keeps of the live pods
// (their allocator annotations and container resources) a quarter of it
// (a reader's list and the store's records of it both live while the next
// read decodes). Without a limit: DefaultMaxBodyBytes and 32 MiB.
func memoryBounds() (body, kept int64) {
	l := debug.SetMemoryLimit(-1)
	if l <= 0 || l == math.MaxInt64 {
		return DefaultMaxBodyBytes, 32 << 20
	}
	return max(2*l, 64<<20), l / 4
}

// Config says how to reach the kubelet's /pods endpoint.
type Config struct {
	// URL is the endpoint, https://NODE_IP:10250/pods (authenticated) or
	// http://127.0.0.1:10255/pods (the read-only port, when enabled).
	URL string
	// TokenFile holds the bearer token sent over https, usually the
	// service-account token. It is re-read whenever the file changes:
	// projected tokens rotate hourly by a symlink swap. Empty sends no
	// token. The token is never sent over plain http.
	TokenFile string
	// CAFile is a PEM bundle to verify the kubelet's serving certificate
	// with; empty means the system roots.
	CAFile string
	// InsecureTLS skips verification of the kubelet's certificate. It is
	// an explicit opt-in for kubelets with self-signed serving
	// certificates, and is logged as a warning.
	InsecureTLS bool
	// Timeout bounds one read, connection included; 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// MaxBodyBytes bounds the answer; a larger one fails the read (and
	// only the reads: the answer is never held whole). 0 means twice
	// GOMEMLIMIT when it is set (at least 64 MiB), else DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxAnnotationBytes says which pod annotations a read keeps (the
	// allocators' own) and how large each may be: it returns the bound
	// of the key's value, 0 for a key not kept; a value over its bound,
	// or over what is left of the pod's annotationbound.MaxPodBytes, is kept
	// as model.OversizedAnnotation, which its allocator refuses as
	// malformed. Other annotations, such as kubectl's
	// last-applied-configuration, are skipped unread. nil keeps every
	// annotation whole (tools and tests), within what a read may keep.
	MaxAnnotationBytes func(key string) int
	// Log receives the warnings about the configuration; nil means
	// logrus's standard logger.
	Log logrus.FieldLogger
}

// Client reads the kubelet's /pods. It is safe for concurrent use and keeps
// its connection to the kubelet open between reads.
type Client struct {
	url      string // for requests
	redacted string // for errors and logs
	timeout  time.Duration
	maxBody  int64
	bounds   podsjson.Bounds
	http     *bearer.Client
}

// NewClient checks cfg and returns a client. It loads the CA bundle now, so
// that a wrong path or a file without certificates is an error at start-up
// rather than at the first query; the token file is read at each read (it
// may not exist yet, and it rotates).
func NewClient(cfg Config) (*Client, error) {
	log := cfg.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("kubelet pods URL %q: %w", cfg.URL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("kubelet pods URL %q: scheme must be http or https", cfg.URL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("kubelet pods URL %q: no host", cfg.URL)
	}
	if strings.Contains(u.Host, "$") {
		return nil, fmt.Errorf("kubelet pods URL %q: host has an unexpanded variable", cfg.URL)
	}
	if cfg.Timeout < 0 || cfg.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("kubelet pods client: negative timeout (%v) or body limit (%d)", cfg.Timeout, cfg.MaxBodyBytes)
	}
	maxBody, maxKept := memoryBounds()
	c := &Client{
		url:      u.String(),
		redacted: u.Redacted(),
		timeout:  cmp.Or(cfg.Timeout, DefaultTimeout),
		maxBody:  cmp.Or(cfg.MaxBodyBytes, maxBody),
		bounds:   podsjson.Bounds{Bounds: annotationbound.Allocators(cfg.MaxAnnotationBytes), Kept: maxKept},
	}

	tokenFile := cfg.TokenFile
	if u.Scheme == "https" && cfg.InsecureTLS {
		log.WithField("url", c.redacted).Warn("Not verifying the kubelet's serving certificate (insecure TLS was asked for)")
		if cfg.CAFile != "" {
			log.WithField("caFile", cfg.CAFile).Warn("Kubelet CA file ignored: insecure TLS was asked for")
		}
	}
	if u.Scheme != "https" && cfg.TokenFile != "" {
		// The read-only port authenticates nobody; a token sent there
		// would only travel in clear text.
		log.WithField("url", c.redacted).Info("Not sending the kubelet token over plain http")
		tokenFile = ""
	}
	// The kubelet is on this node: an HTTP(S)_PROXY set for the daemon's
	// other traffic must not carry the kubelet's (Proxy nil).
	c.http, err = bearer.New(bearer.Config{
		What:             "kubelet",
		TokenFile:        tokenFile,
		CAFile:           cfg.CAFile,
		InsecureTLS:      cfg.InsecureTLS,
		HandshakeTimeout: c.timeout,
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Pods reads the kubelet's pods. They come oldest first (by
// creationTimestamp; pods created in the same second keep the kubelet's
// order, which is arbitrary): the kubelet answers in no particular order,
// and this makes the last of several pods with one name the newest one.
// The read is bounded by ctx and by the configured timeout.
func (c *Client) Pods(ctx context.Context) ([]model.KubeletPod, error) {
	pods, err := c.pods(ctx)
	if err != nil {
		return nil, fmt.Errorf("read kubelet pods from %s: %w", c.redacted, err)
	}
	return pods, nil
}

func (c *Client) pods(ctx context.Context) ([]model.KubeletPod, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, c.timeout,
		fmt.Errorf("no answer within %v: %w", c.timeout, context.DeadlineExceeded))
	defer cancel()

	resp, err := c.http.Get(ctx, c.url, c.maxBody)
	if err != nil {
		return nil, c.explain(ctx, err)
	}
	defer resp.Body.Close()

	if resp.StatusCode != http.StatusOK {
		head, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("%s: %s", resp.Status, printable(head, 200))
	}
	if resp.ContentLength > c.maxBody {
		return nil, fmt.Errorf("answer of %d bytes is larger than the limit of %d bytes", resp.ContentLength, c.maxBody)
	}

	body := &readBody{r: resp.Body}
	pods, err := podsjson.DecodeFrom(body, c.bounds)
	if errors.Is(body.err, bearer.ErrTooLarge) {
		return nil, fmt.Errorf("answer is larger than the limit of %d bytes", c.maxBody)
	}
	if err != nil {
		if body.err != nil && !errors.Is(body.err, io.EOF) {
			return nil, fmt.Errorf("read answer: %w", c.explain(ctx, body.err))
		}
		return nil, fmt.Errorf("%d bytes of %s: %w", body.n, cmp.Or(resp.Header.Get("Content-Type"), "no Content-Type"), err)
	}
	return pods, nil
}

// readBody remembers how much of an answer was read and why reading
// stopped, so that an answer cut by the limit or by the connection is not
// reported as malformed JSON.
type readBody struct {
	r   io.Reader
	n   int64
	err error // the first read error, io.EOF at the end
}

func (b *readBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil && b.err == nil {
		b.err = err
	}
	return n, err
}

// explain makes a transport error say what happened in a few words: the
// request's URL is already in the caller's message, a timeout names the
// timeout, and a certificate from an unknown CA names the CAs it was
// checked against.
func (c *Client) explain(ctx context.Context, err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		err = ue.Err
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return fmt.Errorf("the kubelet's serving certificate is not signed by %s: %w", c.http.Roots(), err)
	}
	return err
}

// printable returns the start of an error body fit for one log line.
func printable(b []byte, max int) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, strings.TrimSpace(string(b)))
	if r := []rune(s); len(r) > max {
		s = string(r[:max]) + "..."
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}
