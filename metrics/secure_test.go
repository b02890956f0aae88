package metrics

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/internal/servingcert"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// onlyToken stands in for the API server's decision: a request with the
// bearer token "granted" is served, any other is 401.
func onlyToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer granted" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// The secure listener serves /metrics over TLS to the callers its
// authorizer lets through, nothing else; two instances share its port.
func TestSecureListenerServesOnlyAuthorizedMetricsOverTLS(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg, err := servingcert.Config("", "", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	New(reg).RateLimited()
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- ServeSecure(ctx, addr, reg, cfg, onlyToken, log) }()
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(scheme, path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, scheme+"://"+addr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	poll.Until(t, "the secure metrics port to answer", func() bool {
		select {
		case err := <-errs:
			t.Fatalf("an instance could not serve the shared port: %v", err)
		default:
		}
		code, _ := get("https", "/metrics", "")
		return code != 0
	})
	if code, body := get("https", "/metrics", "granted"); code != http.StatusOK || !strings.Contains(body, "podres_proxy_rate_limited_total 1") {
		t.Errorf("granted scrape: %d %.200q", code, body)
	}
	if code, _ := get("https", "/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("scrape without a token: %d, want 401", code)
	}
	for _, path := range []string{"/healthz", "/readyz", "/", "/metrics/x"} {
		if code, _ := get("https", path, "granted"); code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404 (the secure port serves /metrics only)", path, code)
		}
	}
	// Plain HTTP gets no metrics: Go's server answers 400 to it.
	if code, body := get("http", "/metrics", "granted"); code != http.StatusBadRequest || strings.Contains(body, "podres_proxy") {
		t.Errorf("plain HTTP: %d %.100q, want 400", code, body)
	}
	// TLS 1.1 is refused.
	old := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}}}
	if resp, err := old.Get("https://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Error("a TLS 1.1 client was served")
	}
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("an instance stopped with %v", err)
		}
	}
}
