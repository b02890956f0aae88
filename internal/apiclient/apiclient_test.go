package apiclient

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

// apiServer is a TLS server answering GET /api/v1/nodes/NAME with a Node,
// recording the Authorization and User-Agent headers it got.
type apiServer struct {
	*httptest.Server
	mu      sync.Mutex
	auth    []string
	agents  []string
	caPath  string
	tokPath string
}

func newAPIServer(t *testing.T, tls bool, handler http.HandlerFunc) *apiServer {
	t.Helper()
	s := &apiServer{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.auth = append(s.auth, r.Header.Get("Authorization"))
		s.agents = append(s.agents, r.Header.Get("User-Agent"))
		s.mu.Unlock()
		if handler != nil {
			handler(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"node-a"}}`))
	})
	if tls {
		s.Server = httptest.NewTLSServer(h)
	} else {
		s.Server = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	dir := t.TempDir()
	s.caPath, s.tokPath = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	if tls {
		tlstest.ServerCA(t, s.caPath, s.Server)
	}
	if err := os.WriteFile(s.tokPath, []byte("sekret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func getNode(t *testing.T, o Options) error {
	t.Helper()
	cfg, err := Config(o)
	if err != nil {
		t.Fatalf("Config: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
	return err
}

func TestRequestsCarryTheTokenAndTheDaemonsUserAgentOverVerifiedTLS(t *testing.T) {
	s := newAPIServer(t, true, nil)
	if err := getNode(t, Options{Server: s.URL, TokenFile: s.tokPath, CAFile: s.caPath}); err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(s.auth) != 1 || s.auth[0] != "Bearer sekret" {
		t.Errorf("Authorization headers %q, want one %q", s.auth, "Bearer sekret")
	}
	if !strings.HasPrefix(s.agents[0], UserAgent) {
		t.Errorf("User-Agent %q, want %q", s.agents[0], UserAgent)
	}
}

func TestAServerNotSignedByTheCAFileIsRefused(t *testing.T) {
	s := newAPIServer(t, true, nil)
	other := tlstest.OtherCA(t, filepath.Join(t.TempDir(), "other.crt"))
	err := getNode(t, Options{Server: s.URL, TokenFile: s.tokPath, CAFile: other})
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("get from a server the CA did not sign: %v, want a certificate error", err)
	}
	if len(s.auth) != 0 {
		t.Errorf("the server got %d requests, want none", len(s.auth))
	}
}

func TestARotatedCAFileIsUsedAtTheNextRequest(t *testing.T) {
	s := newAPIServer(t, true, nil)
	o := Options{Server: s.URL, TokenFile: s.tokPath, CAFile: s.caPath}
	cfg, err := Config(o)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	if _, err := cs.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{}); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	tlstest.OtherCA(t, s.caPath) // the CA file no longer signs s
	if _, err := cs.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{}); err == nil {
		t.Fatal("after the CA file changed to another CA, the old server is still trusted")
	}
	tlstest.ServerCA(t, s.caPath, s.Server)
	if _, err := cs.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{}); err != nil {
		t.Fatalf("after the CA file changed back: %v", err)
	}
}

func TestTheTokenNeverTravelsToAnotherHost(t *testing.T) {
	elsewhere := newAPIServer(t, true, nil)
	s := newAPIServer(t, true, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, elsewhere.URL+r.URL.Path, http.StatusFound)
	})
	err := getNode(t, Options{Server: s.URL, TokenFile: s.tokPath, CAFile: s.caPath})
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("get answered by a redirect to another host: %v, want it refused", err)
	}
	if len(elsewhere.auth) != 0 {
		t.Errorf("the other host got %d requests (%q), want none", len(elsewhere.auth), elsewhere.auth)
	}
}

func TestNoTokenIsSentOverPlainHTTP(t *testing.T) {
	s := newAPIServer(t, false, nil)
	if err := getNode(t, Options{Server: s.URL, TokenFile: s.tokPath}); err != nil {
		t.Fatalf("get: %v", err)
	}
	if len(s.auth) != 1 || s.auth[0] != "" {
		t.Errorf("Authorization headers over http %q, want none", s.auth)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"not in a pod", Options{}, "KUBERNETES_SERVICE_HOST"},
		{"not a URL", Options{Server: "ftp://x"}, "want https://host:port"},
		{"missing CA file", Options{Server: "https://127.0.0.1:1", CAFile: filepath.Join(dir, "none")}, "CA file"},
		{"CA file without a certificate", Options{Server: "https://127.0.0.1:1", CAFile: notPEM}, "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Config(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Config: %v, want an error with %q", err, tc.want)
			}
		})
	}
}
