package churn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/test/e2eutil"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// serve is `podres-proxy serve` as a process of its own, so that the test
// can kill it with SIGKILL, as the OOM killer or a node's eviction does,
// and start it again on the same state directory.
type serve struct {
	args    []string
	metrics string // its /metrics, /readyz address
	podsAPI bool   // it watches the Pods API: ready once the watch synced
	logPath string // its stderr, for the failure message
	cmd     *exec.Cmd
	exited  chan struct{}
	starts  int
}

// serveBinary is podres-proxy, built once for the package's tests; TestMain
// removes it.
var serveBinary = &e2eutil.Build{Pkg: "../../cmd/podres-proxy", Race: raceEnabled}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startServe starts serve with these flags (and its metrics address) and
// waits for it to be ready; the test's end stops it.
func startServe(t *testing.T, dir string, podsAPI bool, flags ...string) *serve {
	t.Helper()
	s := &serve{metrics: freeAddr(t), podsAPI: podsAPI, logPath: filepath.Join(dir, "serve.log")}
	s.args = append([]string{"serve", "--metrics-addr", s.metrics, "--log-level", "warn"}, flags...)
	s.start(t)
	t.Cleanup(func() { s.stop(t) })
	return s
}

func (s *serve) start(t *testing.T) {
	t.Helper()
	bin, err := serveBinary.Path()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	s.starts++
	fmt.Fprintf(log, "=== serve start %d\n", s.starts)
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(s.cmd, s.exited)
	poll.UntilWith(t, "serve to be ready", func() bool {
		select {
		case <-s.exited:
			t.Fatalf("serve exited at start: %v", s.cmd.ProcessState)
		default:
		}
		if !s.get("/readyz") {
			return false
		}
		// With the Pods API, ready once its watch relisted, as a node's
		// serve is long before any churn.
		return !s.podsAPI || s.metric("podres_proxy_pods_api_relists_total") >= 1
	}, s.logTail)
}

// kill kills serve with SIGKILL and waits for it to be gone.
func (s *serve) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	<-s.exited
}

// stop ends serve as the kubelet's eviction does, SIGTERM, and checks that
// it stopped cleanly.
func (s *serve) stop(t *testing.T) {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.exited
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("serve exited %d after SIGTERM:\n%s", code, s.logTail())
	}
}

func (s *serve) get(path string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.metrics+path, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// metric is the value of an unlabelled sample of serve's /metrics, -1
// when it cannot be read.
func (s *serve) metric(name string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.metrics+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return f
			}
		}
	}
	return -1
}

// logTail is the end of what serve logged, every start of it.
func (s *serve) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return string(b)
}
