package apiauth

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// fakeAPIServer answers TokenReviews and SubjectAccessReviews as a real API
// server does: tokens maps a token to its user, allowed the users that may
// get /metrics. hang, when set, holds every review until it is closed.
type fakeAPIServer struct {
	srv     *httptest.Server
	tokens  map[string]string
	allowed map[string]bool
	hang    chan struct{}

	tokenReviews, accessReviews atomic.Int64
	mu                          sync.Mutex
	lastSAR                     authzv1.SubjectAccessReviewSpec
}

const daemonToken = "the-daemons-own-token"

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	t.Helper()
	f := &fakeAPIServer{
		tokens:  map[string]string{"scraper-token": "system:serviceaccount:podres-proxy:podres-proxy-scraper", "other-token": "system:serviceaccount:default:default"},
		allowed: map[string]bool{"system:serviceaccount:podres-proxy:podres-proxy-scraper": true},
	}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+daemonToken || r.Method != http.MethodPost {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	if f.hang != nil {
		select {
		case <-f.hang:
		case <-r.Context().Done():
			return
		}
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/apis/authentication.k8s.io/v1/tokenreviews":
		f.tokenReviews.Add(1)
		var tr authnv1.TokenReview
		if err := decode(body, &tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if user, ok := f.tokens[tr.Spec.Token]; ok {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{
				Username: user, UID: "uid-" + user, Groups: []string{"system:serviceaccounts"},
				Extra: map[string]authnv1.ExtraValue{"authentication.kubernetes.io/node-name": {"node-1"}}}}
		}
		tr.Kind, tr.APIVersion = "TokenReview", "authentication.k8s.io/v1"
		_ = json.NewEncoder(w).Encode(&tr)
	case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
		f.accessReviews.Add(1)
		var sar authzv1.SubjectAccessReview
		if err := decode(body, &sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.lastSAR = sar.Spec
		f.mu.Unlock()
		na := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = f.allowed[sar.Spec.User] && na != nil && na.Path == "/metrics" && na.Verb == "get"
		sar.Kind, sar.APIVersion = "SubjectAccessReview", "authorization.k8s.io/v1"
		_ = json.NewEncoder(w).Encode(&sar)
	default:
		http.NotFound(w, r)
	}
}

// decode decodes a request body in whichever encoding client-go sent
// (protobuf for built-in types); the answers are JSON, which it accepts too.
func decode(body []byte, into kruntime.Object) error {
	_, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, into)
	return err
}

// authorizer returns an Authorizer that reviews through f, with the
// client-go configuration serve builds (internal/apiclient).
func (f *fakeAPIServer) authorizer(t *testing.T, o Options) *Authorizer {
	t.Helper()
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(daemonToken), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := apiclient.Config(apiclient.Options{Server: f.srv.URL, TokenFile: filepath.Join(dir, "token"), CAFile: filepath.Join(dir, "ca.crt"), QPS: 1000, Burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// scrape serves GET path through a's Wrap with token, and returns the
// status.
func scrape(a *Authorizer, method, path, token string) *httptest.ResponseRecorder {
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "metrics") }))
	r := httptest.NewRequest(method, "https://node:9478"+path, nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestOnlyTheGrantedServiceAccountReadsMetrics(t *testing.T) {
	f := newFakeAPIServer(t)
	a := f.authorizer(t, Options{})
	for _, tc := range []struct {
		name, method, token string
		want                int
	}{
		{"no token", http.MethodGet, "", http.StatusUnauthorized},
		{"a token the API server does not know", http.MethodGet, "forged", http.StatusUnauthorized},
		{"a token over the size limit", http.MethodGet, strings.Repeat("x", MaxTokenBytes+1), http.StatusUnauthorized},
		{"a service account without get on /metrics", http.MethodGet, "other-token", http.StatusForbidden},
		{"the scraper's service account", http.MethodGet, "scraper-token", http.StatusOK},
		{"the scraper, HEAD", http.MethodHead, "scraper-token", http.StatusOK},
		{"the scraper, POST", http.MethodPost, "scraper-token", http.StatusMethodNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := scrape(a, tc.method, "/metrics", tc.token)
			if w.Code != tc.want {
				t.Fatalf("status %d (%s), want %d", w.Code, strings.TrimSpace(w.Body.String()), tc.want)
			}
			if tc.want == http.StatusOK && tc.method == http.MethodGet && w.Body.String() != "metrics\n" {
				t.Errorf("body %q, want the wrapped handler's", w.Body.String())
			}
			if tc.want == http.StatusUnauthorized && !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without a WWW-Authenticate: Bearer challenge: %v", w.Header())
			}
		})
	}
	// The access review asks about the user the token review named, with
	// its groups, uid and extra, for get on the request's path.
	f.mu.Lock()
	sar := f.lastSAR
	f.mu.Unlock()
	if sar.User != "system:serviceaccount:podres-proxy:podres-proxy-scraper" || sar.UID == "" || len(sar.Groups) != 1 ||
		len(sar.Extra["authentication.kubernetes.io/node-name"]) != 1 || sar.NonResourceAttributes == nil ||
		*sar.NonResourceAttributes != (authzv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}) || sar.ResourceAttributes != nil {
		t.Errorf("SubjectAccessReview spec %+v", sar)
	}
	// Another path is asked about as itself: the grant on /metrics does not
	// cover it.
	if w := scrape(a, http.MethodGet, "/debug/pprof/", "scraper-token"); w.Code != http.StatusForbidden {
		t.Errorf("the scraper's GET /debug/pprof/: %d, want 403", w.Code)
	}
}

func TestARefusedServiceAccountIsLoggedOncePerDecision(t *testing.T) {
	// An operator whose Prometheus target is down looks at the daemon's
	// log: a 403 names the user, once per cached decision.
	f := newFakeAPIServer(t)
	log, hook := logtest.NewNullLogger()
	a := f.authorizer(t, Options{Log: log})
	for range 3 {
		scrape(a, http.MethodGet, "/metrics", "other-token")
	}
	var refusals []string
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.InfoLevel {
			refusals = append(refusals, e.Message)
		}
	}
	if len(refusals) != 1 || !strings.Contains(refusals[0], "system:serviceaccount:default:default") || !strings.Contains(refusals[0], "403") {
		t.Errorf("info lines %q, want one 403 naming system:serviceaccount:default:default", refusals)
	}
}

func TestDecisionsAreReusedForTheirTTLAndTheCacheIsBounded(t *testing.T) {
	f := newFakeAPIServer(t)
	var now atomic.Pointer[time.Time]
	start := time.Unix(1_000_000, 0)
	now.Store(&start)
	a := f.authorizer(t, Options{CacheSize: 8, AllowedTTL: time.Minute, DeniedTTL: 10 * time.Second, Now: func() time.Time { return *now.Load() }})
	advance := func(d time.Duration) { t := now.Load().Add(d); now.Store(&t) }

	for range 5 {
		if w := scrape(a, http.MethodGet, "/metrics", "scraper-token"); w.Code != http.StatusOK {
			t.Fatalf("status %d", w.Code)
		}
	}
	if n := f.tokenReviews.Load(); n != 1 {
		t.Errorf("5 scrapes within the TTL made %d token reviews, want 1", n)
	}
	advance(61 * time.Second)
	scrape(a, http.MethodGet, "/metrics", "scraper-token")
	if n := f.tokenReviews.Load(); n != 2 {
		t.Errorf("a scrape after the TTL made %d token reviews in all, want 2", n)
	}
	// A refusal is kept for the shorter TTL: a newly granted scraper gets in
	// soon.
	scrape(a, http.MethodGet, "/metrics", "other-token")
	scrape(a, http.MethodGet, "/metrics", "other-token")
	if n := f.accessReviews.Load(); n != 3 {
		t.Errorf("access reviews %d, want 3", n)
	}
	f.mu.Lock()
	f.allowed["system:serviceaccount:default:default"] = true
	f.mu.Unlock()
	advance(11 * time.Second)
	if w := scrape(a, http.MethodGet, "/metrics", "other-token"); w.Code != http.StatusOK {
		t.Errorf("a service account granted after its refusal: %d 11 s later, want 200", w.Code)
	}

	// Many tokens (forged ones, say) keep no more than CacheSize decisions.
	for i := range 100 {
		scrape(a, http.MethodGet, "/metrics", fmt.Sprintf("forged-%d", i))
	}
	a.cache.mu.Lock()
	n, indexed := a.cache.order.Len(), len(a.cache.index)
	a.cache.mu.Unlock()
	if n != 8 || indexed != 8 {
		t.Errorf("the cache keeps %d decisions (%d indexed) after 100 tokens, want its size, 8", n, indexed)
	}
}

func TestAHungAPIServerAnswers503InBoundedTimeAndLeavesNoGoroutines(t *testing.T) {
	f := newFakeAPIServer(t)
	f.hang = make(chan struct{})
	const timeout = 300 * time.Millisecond
	a := f.authorizer(t, Options{Timeout: timeout, MaxInFlight: 2})
	before := runtime.NumGoroutine()

	// More scrapes than places for reviews: each answers 503 within about
	// the time limit (those waiting for a place give up at it too), none
	// waits for the API server.
	const scrapes = 20
	var wg sync.WaitGroup
	codes := make(chan int, scrapes)
	took := make(chan time.Duration, scrapes)
	for range scrapes {
		wg.Go(func() {
			t0 := time.Now()
			codes <- scrape(a, http.MethodGet, "/metrics", "scraper-token").Code
			took <- time.Since(t0)
		})
	}
	wg.Wait()
	close(codes)
	close(took)
	for c := range codes {
		if c != http.StatusServiceUnavailable {
			t.Errorf("status %d while the API server hangs, want 503", c)
		}
	}
	for d := range took {
		if d > timeout+2*time.Second {
			t.Errorf("a scrape took %s while the API server hangs; the limit is %s", d, timeout)
		}
	}
	// No decision was kept: once the API server answers, the scraper gets in.
	close(f.hang)
	if w := scrape(a, http.MethodGet, "/metrics", "scraper-token"); w.Code != http.StatusOK {
		t.Errorf("after the API server recovered: %d, want 200", w.Code)
	}
	// The reviews given up left nothing running: the goroutines return to
	// what there was before (the client's idle connections closed).
	poll.UntilWith(t, "the goroutines to return to their number before the hung reviews", func() bool {
		f.srv.CloseClientConnections()
		return runtime.NumGoroutine() <= before+2
	}, func() string { return fmt.Sprintf("%d goroutines, %d before", runtime.NumGoroutine(), before) })
}
