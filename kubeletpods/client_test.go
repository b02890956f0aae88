package kubeletpods

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/podstest"
	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

// fakeKubelet serves /pods like the kubelet's secure port: a bearer token
// is required when token is set, and the answer is podstest's pod list.
type fakeKubelet struct {
	*httptest.Server
	token   atomic.Value // string; "" accepts any request
	body    atomic.Value // []byte
	newConn atomic.Int32

	mu       sync.Mutex
	requests []*http.Request
}

func newFakeKubelet(t *testing.T, useTLS bool) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{}
	k.token.Store("")
	k.body.Store(podstest.PodListJSON(3, nil))
	k.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.mu.Lock()
		k.requests = append(k.requests, r)
		k.mu.Unlock()
		if want := k.token.Load().(string); want != "" && r.Header.Get("Authorization") != "Bearer "+want {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(k.body.Load().([]byte))
	}))
	k.Config.ErrorLog = log.New(io.Discard, "", 0) // handshakes the tests make fail
	k.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			k.newConn.Add(1)
		}
	}
	if useTLS {
		k.StartTLS()
	} else {
		k.Start()
	}
	t.Cleanup(k.Close)
	return k
}

func (k *fakeKubelet) lastRequest(t *testing.T) *http.Request {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.requests) == 0 {
		t.Fatal("the kubelet got no request")
	}
	return k.requests[len(k.requests)-1]
}

// caFile writes the fake kubelet's self-signed serving certificate as a CA
// bundle.
func (k *fakeKubelet) caFile(t *testing.T) string {
	t.Helper()
	return tlstest.WriteCert(t, filepath.Join(t.TempDir(), "ca.crt"), k.Certificate().Raw)
}

func writeToken(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newTestClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	if cfg.Log == nil {
		logger, _ := logtest.NewNullLogger()
		cfg.Log = logger
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func assertErrorSays(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one saying %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not say %q", err, p)
		}
	}
}

func TestPodsOverVerifiedTLSWithAToken(t *testing.T) {
	k := newFakeKubelet(t, true)
	k.token.Store("s3cret")
	c := newTestClient(t, Config{URL: k.URL + "/pods", TokenFile: writeToken(t, "s3cret"), CAFile: k.caFile(t)})

	pods, err := c.Pods(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 3 || pods[0].UID != podstest.UID(0) {
		t.Errorf("got %d pods (first %+v), want podstest's 3", len(pods), pods[0])
	}
	r := k.lastRequest(t)
	if got := r.Header.Get("Accept"); got != "application/json" {
		t.Errorf("Accept %q, want application/json", got)
	}
	if r.URL.Path != "/pods" || r.Method != http.MethodGet {
		t.Errorf("request %s %s, want GET /pods", r.Method, r.URL.Path)
	}
}

func TestPodsWithAWrongTokenFailsWithTheStatusAndBody(t *testing.T) {
	k := newFakeKubelet(t, true)
	k.token.Store("right")
	c := newTestClient(t, Config{URL: k.URL + "/pods", TokenFile: writeToken(t, "wrong"), CAFile: k.caFile(t)})

	_, err := c.Pods(t.Context())
	assertErrorSays(t, err, "read kubelet pods from "+k.URL+"/pods: ", "401 Unauthorized: Unauthorized")
}

// Projected service-account tokens live behind a ..data symlink that the
// kubelet swaps to a new directory when the token rotates.
func TestPodsPicksUpATokenRotatedBySymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	writeVersion := func(version, token string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, version), 0o700); err != nil {
			t.Fatal(err)
		}
		// Same length, written within the same second: only the inode
		// tells the files apart.
		if err := os.WriteFile(filepath.Join(dir, version, "token"), []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(version, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	writeVersion("..2026_11_21_10_00_00.1", "token-one")
	tokenPath := filepath.Join(dir, "token")
	if err := os.Symlink("..data/token", tokenPath); err != nil {
		t.Fatal(err)
	}

	k := newFakeKubelet(t, true)
	c := newTestClient(t, Config{URL: k.URL + "/pods", TokenFile: tokenPath, CAFile: k.caFile(t)})
	k.token.Store("token-one")
	if _, err := c.Pods(t.Context()); err != nil {
		t.Fatal(err)
	}

	writeVersion("..2026_11_21_11_00_00.2", "token-two")
	k.token.Store("token-two")
	if _, err := c.Pods(t.Context()); err != nil {
		t.Fatalf("after rotation: %v", err)
	}
	if got := k.lastRequest(t).Header.Get("Authorization"); got != "Bearer token-two" {
		t.Errorf("sent %q, want the rotated token", got)
	}
}

func TestPodsFailsClearlyWhenTheTokenFileIsMissingOrEmpty(t *testing.T) {
	k := newFakeKubelet(t, true)
	missing := filepath.Join(t.TempDir(), "token")
	c := newTestClient(t, Config{URL: k.URL + "/pods", TokenFile: missing, CAFile: k.caFile(t)})
	_, err := c.Pods(t.Context())
	assertErrorSays(t, err, "read kubelet pods from", "kubelet token file", missing, "no such file")

	empty := writeToken(t, "  ")
	c = newTestClient(t, Config{URL: k.URL + "/pods", TokenFile: empty, CAFile: k.caFile(t)})
	_, err = c.Pods(t.Context())
	assertErrorSays(t, err, "kubelet token file "+empty+" is empty")
}

func TestPodsRejectsACertificateNotSignedByTheCAFile(t *testing.T) {
	k := newFakeKubelet(t, true)
	ca := tlstest.OtherCA(t, filepath.Join(t.TempDir(), "other-ca.crt"))
	c := newTestClient(t, Config{URL: k.URL + "/pods", CAFile: ca})
	_, err := c.Pods(t.Context())
	assertErrorSays(t, err, "read kubelet pods from "+k.URL+"/pods: ",
		"the kubelet's serving certificate is not signed by the CAs of "+ca, "x509")
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); !ok {
		t.Errorf("error %v does not wrap x509.UnknownAuthorityError", err)
	}
}

func TestPodsVerifiesAgainstTheSystemRootsWithoutACAFile(t *testing.T) {
	k := newFakeKubelet(t, true)
	c := newTestClient(t, Config{URL: k.URL + "/pods"})
	_, err := c.Pods(t.Context())
	assertErrorSays(t, err, "not signed by the system roots")
}

func TestInsecureTLSSkipsVerificationAndWarns(t *testing.T) {
	k := newFakeKubelet(t, true)
	logger, hook := logtest.NewNullLogger()
	c := newTestClient(t, Config{URL: k.URL + "/pods", InsecureTLS: true, CAFile: tlstest.OtherCA(t, filepath.Join(t.TempDir(), "other-ca.crt")), Log: logger})
	if _, err := c.Pods(t.Context()); err != nil {
		t.Fatal(err)
	}
	var warned bool
	for _, e := range hook.AllEntries() {
		warned = warned || (e.Level == logrus.WarnLevel && strings.Contains(e.Message, "Not verifying"))
	}
	if !warned {
		t.Errorf("no warning about insecure TLS in %v", hook.AllEntries())
	}
}

func TestPodsOverPlainHTTPSendsNoToken(t *testing.T) {
	k := newFakeKubelet(t, false)
	c := newTestClient(t, Config{URL: k.URL + "/pods", TokenFile: writeToken(t, "s3cret")})
	if _, err := c.Pods(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := k.lastRequest(t).Header.Get("Authorization"); got != "" {
		t.Errorf("sent Authorization %q over plain http", got)
	}
}

func TestPodsRejectsAnAnswerLargerThanTheLimit(t *testing.T) {
	body := podstest.PodListJSON(3, nil)
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"with Content-Length", func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }},
		{"chunked", func(w http.ResponseWriter, _ *http.Request) {
			w.Write(body[:100])
			w.(http.Flusher).Flush() // no Content-Length from here on
			w.Write(body[100:])
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			limit := int64(len(body) - 1)
			c := newTestClient(t, Config{URL: srv.URL + "/pods", MaxBodyBytes: limit})
			_, err := c.Pods(t.Context())
			assertErrorSays(t, err, fmt.Sprintf("larger than the limit of %d bytes", limit))

			c = newTestClient(t, Config{URL: srv.URL + "/pods", MaxBodyBytes: int64(len(body))})
			if _, err := c.Pods(t.Context()); err != nil {
				t.Errorf("an answer of exactly the limit: %v", err)
			}
		})
	}
}

func TestPodsGivesUpOnASlowKubeletAtTheTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	defer close(release)

	c := newTestClient(t, Config{URL: srv.URL + "/pods", Timeout: 50 * time.Millisecond})
	_, err := c.Pods(t.Context())
	assertErrorSays(t, err, "read kubelet pods from", "no answer within 50ms")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v is not a context.DeadlineExceeded", err)
	}

	// The caller's context ends the read too.
	c = newTestClient(t, Config{URL: srv.URL + "/pods", Timeout: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	cancelled := make(chan error, 1)
	go func() {
		_, err := c.Pods(ctx)
		cancelled <- err
	}()
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

func TestPodsReportsAMalformedAnswer(t *testing.T) {
	k := newFakeKubelet(t, false)
	k.body.Store([]byte(`{"kind":"PodList","items":[{"metadata":`))
	c := newTestClient(t, Config{URL: k.URL + "/pods"})
	_, err := c.Pods(t.Context())
	assertErrorSays(t, err, "read kubelet pods from", "bytes of application/json", "decode kubelet pods")
}

func TestPodsReportsAServerErrorWithTheStartOfItsBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "internal error:\x00 "+strings.Repeat("x", 1000), http.StatusInternalServerError)
	}))
	defer srv.Close()
	c := newTestClient(t, Config{URL: srv.URL + "/pods"})
	_, err := c.Pods(t.Context())
	assertErrorSays(t, err, "500 Internal Server Error: internal error:  xxx", "x...")
	if len(err.Error()) > 400 {
		t.Errorf("error of %d bytes, want the start of the body only", len(err.Error()))
	}
}

func TestPodsReusesTheConnection(t *testing.T) {
	k := newFakeKubelet(t, true)
	c := newTestClient(t, Config{URL: k.URL + "/pods", CAFile: k.caFile(t)})
	for range 3 {
		if _, err := c.Pods(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if n := k.newConn.Load(); n != 1 {
		t.Errorf("3 reads opened %d connections, want 1", n)
	}
}

func TestNewClientRejectsABadConfig(t *testing.T) {
	garbage := filepath.Join(t.TempDir(), "garbage.crt")
	if err := os.WriteFile(garbage, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no URL", Config{}, "scheme must be http or https"},
		{"other scheme", Config{URL: "unix:///var/lib/kubelet/pods"}, "scheme must be http or https"},
		{"no host", Config{URL: "https:///pods"}, "no host"},
		{"unexpanded variable", Config{URL: "https://$NODE_IP:10250/pods"}, "unexpanded variable"},
		{"negative timeout", Config{URL: "https://10.0.0.1:10250/pods", Timeout: -1}, "negative"},
		{"missing CA file", Config{URL: "https://10.0.0.1:10250/pods", CAFile: "/nonexistent/ca.crt"}, "read kubelet CA file: open /nonexistent/ca.crt"},
		{"CA file without certificates", Config{URL: "https://10.0.0.1:10250/pods", CAFile: garbage}, "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Log, _ = logtest.NewNullLogger()
			_, err := NewClient(tc.cfg)
			assertErrorSays(t, err, tc.want)
		})
	}
}

func TestClientPodsIsAFetchForTheReader(t *testing.T) {
	k := newFakeKubelet(t, false)
	c := newTestClient(t, Config{URL: k.URL + "/pods"})
	r := NewReader(c.Pods, ReaderOptions{})
	s, err := r.ReadAfter(t.Context(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key := model.PodKey{Namespace: podstest.Namespace(1), Name: podstest.Name(1)}
	if p, ok := s.Lookup(key); !ok || p.UID != podstest.UID(1) {
		t.Errorf("Lookup = %v, %v; want podstest's pod 1", p, ok)
	}
}

func TestTheTokenNeverFollowsARedirectToPlainHTTP(t *testing.T) {
	plain := newFakeKubelet(t, false) // where a hostile redirect points
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, plain.URL+"/pods", http.StatusFound)
	}))
	defer secure.Close()
	ca := tlstest.WriteCert(t, filepath.Join(t.TempDir(), "ca.crt"), secure.Certificate().Raw)
	c := newTestClient(t, Config{URL: secure.URL + "/pods", TokenFile: writeToken(t, "s3cret"), CAFile: ca})
	_, err := c.Pods(context.Background())
	assertErrorSays(t, err, "redirected", "not followed")
	plain.mu.Lock()
	defer plain.mu.Unlock()
	for _, r := range plain.requests {
		t.Errorf("the redirect was followed over plain http, Authorization %q", r.Header.Get("Authorization"))
	}
}

// A pod whose allocation is over its bound is refused as malformed, on
// that pod only, as its decoding errors (a record's decodeErrors) say; the
// read and the other pods' allocations are untouched.
func TestAnOversizedAllocationIsRefusedOnItsPodOnly(t *testing.T) {
	huge := `{"gpu":[` + strings.Repeat(`{"minor":0,"id":"GPU-x"},`, 4000) + `{"minor":0,"id":"GPU-x"}]}`
	k := newFakeKubelet(t, false)
	k.body.Store(podstest.PodListJSON(3, func(i int) map[string]string {
		if i == 0 {
			return map[string]string{koordinator.Annotation: huge}
		}
		return map[string]string{koordinator.Annotation: podstest.NewPodAllocation}
	}))
	log, hook := logtest.NewNullLogger()
	set := allocator.NewSet(log, nil, must(registry.NewFormats(registry.Names(), registry.Options{}))...)
	set.LimitDevicesPerPod(10000) // so that only the size refuses pod 0
	c := newTestClient(t, Config{URL: k.URL + "/pods", MaxAnnotationBytes: set.MaxAnnotationBytes})
	pods, err := c.Pods(t.Context())
	if err != nil {
		t.Fatalf("one pod's oversized allocation failed the read: %v", err)
	}
	for _, p := range pods {
		devs, errs := set.Decode(model.PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}, p.Annotations)
		switch p.Name {
		case podstest.Name(0):
			if len(devs) != 0 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "refused as malformed: 1") {
				t.Errorf("pod 0: devices %v, errors %v; want none and the size named", devs, errs)
			}
		default:
			if len(devs) != 1 || !slices.Equal(devs[0].IDs, []string{podstest.NewPodGPU}) || errs != nil {
				t.Errorf("pod %s: devices %v, errors %v; want its GPU", p.Name, devs, errs)
			}
		}
	}
	if n := len(hook.AllEntries()); n != 1 {
		t.Errorf("%d warnings; want one, naming pod 0", n)
	}
}
