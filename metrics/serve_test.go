package metrics

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/test/poll"
)

// During a rolling update the new instance serves the metrics port beside
// the old one on the node's network: both bind it, and a scrape reaches one
// of them.
func TestTwoInstancesServeOneMetricsPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- Serve(ctx, addr, prometheus.NewRegistry(), func() bool { return true }, log) }()
	}
	poll.Until(t, "the shared metrics port to answer", func() bool {
		select {
		case err := <-errs:
			t.Fatalf("an instance could not serve the shared metrics port: %v", err)
		default:
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	cancel()
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("an instance stopped with %v", err)
		}
	}
}

// The probe socket answers for its own process only: /readyz follows ready.
func TestProbeSocketAnswersForItsOwnInstance(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "probe.sock")
	log := logrus.New()
	log.SetOutput(io.Discard)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan bool, 1)
	ready <- false
	isReady := func() bool { r := <-ready; ready <- r; return r }
	done := make(chan error, 1)
	go func() { done <- ServeProbes(ctx, sock, isReady, log) }()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	status := func() int {
		resp, err := client.Get("http://probe/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	poll.Until(t, "the probe socket to answer", func() bool { return status() != 0 })
	if got := status(); got != http.StatusServiceUnavailable {
		t.Errorf("/readyz before the instance serves: %d, want 503", got)
	}
	<-ready
	ready <- true
	if got := status(); got != http.StatusOK {
		t.Errorf("/readyz once the instance serves: %d, want 200", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
