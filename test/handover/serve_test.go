package handover

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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/test/e2eutil"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// serveBinary is podres-proxy, built once for the package's tests; TestMain
// removes it.
var serveBinary = &e2eutil.Build{Pkg: "../../cmd/podres-proxy", Race: raceEnabled}

func binary(t *testing.T) string {
	t.Helper()
	bin, err := serveBinary.Path()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// instance is one `podres-proxy serve` process: A plays the DaemonSet's
// running pod, B the surge pod the rollout starts beside it. Both get the
// same flags but --probe-socket, which is in each pod's own emptyDir.
type instance struct {
	name    string
	probe   string // its --probe-socket
	logPath string // its stdout and stderr
	cmd     *exec.Cmd
	http    *http.Client // to its probe socket

	exited   chan struct{}
	exitedAt time.Time // set before exited closes
}

// startInstance starts serve with flags and its own probe socket, in
// dir/name/, and does not wait for it; the test's end kills it if it
// still runs.
func startInstance(t *testing.T, dir, name string, flags ...string) *instance {
	t.Helper()
	own := filepath.Join(dir, name)
	if err := os.MkdirAll(own, 0o700); err != nil {
		t.Fatal(err)
	}
	in := &instance{name: name, probe: filepath.Join(own, "probe.sock"), logPath: filepath.Join(own, "serve.log"), exited: make(chan struct{})}
	in.http = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", in.probe)
		},
		DisableKeepAlives: true,
	}, Timeout: 2 * time.Second}
	log, err := os.Create(in.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	in.cmd = exec.Command(binary(t), append(append([]string{"serve"}, flags...), "--probe-socket", in.probe)...)
	in.cmd.Stdout, in.cmd.Stderr = log, log
	if err := in.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = in.cmd.Wait()
		in.exitedAt = time.Now()
		close(in.exited)
	}()
	t.Cleanup(func() {
		if !in.hasExited() {
			_ = in.cmd.Process.Signal(syscall.SIGKILL)
			<-in.exited
		}
	})
	return in
}

func (in *instance) hasExited() bool {
	select {
	case <-in.exited:
		return true
	default:
		return false
	}
}

// ready reports whether the instance's own /readyz, on its probe socket,
// answers 200.
func (in *instance) ready() bool {
	resp, err := in.http.Get("http://probe/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// awaitReady waits for the instance's /readyz, failing at once if it
// exits, and then checks that `podres-proxy probe readyz`, the DaemonSet's
// readiness probe, says so too.
func (in *instance) awaitReady(t *testing.T) {
	t.Helper()
	poll.UntilWith(t, in.name+" to be ready", func() bool {
		if in.hasExited() {
			t.Fatalf("%s exited before it was ready (%v):\n%s", in.name, in.cmd.ProcessState, in.logTail())
		}
		return in.ready()
	}, in.logTail)
	out, err := exec.Command(binary(t), "probe", "--socket", in.probe, "readyz").CombinedOutput()
	if err != nil {
		t.Fatalf("podres-proxy probe --socket %s readyz, once %s answered 200 on it: %v\n%s", in.probe, in.name, err, out)
	}
}

// signal sends sig.
func (in *instance) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := in.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
}

// awaitExit waits for the instance to exit and returns its exit code (-1
// when a signal killed it).
func (in *instance) awaitExit(t *testing.T) int {
	t.Helper()
	timer := time.NewTimer(poll.Timeout)
	defer timer.Stop()
	select {
	case <-in.exited:
		return in.cmd.ProcessState.ExitCode()
	case <-timer.C:
		t.Fatalf("%s did not exit within %v:\n%s", in.name, poll.Timeout, in.logTail())
		return 0
	}
}

// log is everything the instance logged.
func (in *instance) log() string {
	b, err := os.ReadFile(in.logPath)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// awaitLog waits for the instance to log a line containing s.
func (in *instance) awaitLog(t *testing.T, s string) {
	t.Helper()
	poll.UntilWith(t, fmt.Sprintf("%s to log %q", in.name, s), func() bool { return strings.Contains(in.log(), s) }, in.logTail)
}

// logTail is the end of what the instance logged, for a failure message.
func (in *instance) logTail() string {
	b := in.log()
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return fmt.Sprintf("%s's log (%s):\n%s", in.name, in.logPath, b)
}

// inode is the inode of path, 0 when it cannot be read: which socket a
// dial of the path reaches.
func inode(path string) uint64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	return st.Ino
}

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
