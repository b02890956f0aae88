// Package e2eutil is what the two end-to-end suites share: test/e2e (a real
// node: containerd and a standalone kubelet) and test/cluster (a one-node
// cluster). It runs hack/ scripts and go builds with their output streamed
// to the console and kept in the artifacts directory, reads the KEY=VALUE
// settings files the up scripts write, and polls.
package e2eutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Runner runs commands of a suite from the repository's root, logging each
// one's output to Artifacts/NAME.log and to stderr.
type Runner struct {
	Repo      string // the repository's root
	Artifacts string // where the logs go
	Suite     string // the prefix of the progress lines ("e2e", "cluster")
}

// Script runs a hack/ script (path relative to the repository); arguments
// of the form PODRES_X=Y go into its environment, the others are its
// arguments. Cancelling ctx kills it.
func (r Runner) Script(ctx context.Context, name, path string, argsAndEnv ...string) error {
	var args, env []string
	for _, a := range argsAndEnv {
		if strings.HasPrefix(a, "PODRES_") && strings.Contains(a, "=") {
			env = append(env, a)
		} else {
			args = append(args, a)
		}
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(r.Repo, path)}, args...)...)
	cmd.Dir = r.Repo
	cmd.Env = append(os.Environ(), env...)
	return r.Run(name, cmd)
}

// Run runs cmd with its output streamed to stderr and appended to
// Artifacts/NAME.log.
func (r Runner) Run(name string, cmd *exec.Cmd) error {
	f, err := os.OpenFile(filepath.Join(r.Artifacts, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s's log: %w", name, err)
	}
	defer f.Close()
	w := io.MultiWriter(f, os.Stderr)
	cmd.Stdout, cmd.Stderr = w, w
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s failed after %v (log %s): %w", name, time.Since(start).Round(time.Second), f.Name(), err)
	}
	fmt.Fprintf(os.Stderr, "%s: %s took %v\n", r.Suite, name, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// GoBuild builds a package of the repository, statically, into out.
func (r Runner) GoBuild(out, pkg string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(out), err)
	}
	cmd := exec.Command(GoBin(), "build", "-o", out, pkg)
	cmd.Dir = r.Repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return r.Run("go-build-"+filepath.Base(out), cmd)
}

// GoBin is the go command: the one on PATH, else /usr/local/go/bin/go (as
// hack/lib.sh's go_bin).
func GoBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// ReadEnvFile reads the KEY=VALUE lines an up script wrote with bash's
// printf %q, and fails unless every key in required has a value. Values
// that %q had to escape (a backslash, a quote or a dollar sign left after
// the single quotes it puts around an empty string are stripped) are an
// error: the suites' plain paths and words never need it, and this reader
// does not decode them.
func ReadEnvFile(path string, required ...string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read the settings: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, "'")
		if strings.ContainsAny(v, `\'"$`) {
			return nil, fmt.Errorf("%s: %s has a quoted value, which this reader does not decode", path, k)
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	for _, k := range required {
		if env[k] == "" {
			return nil, fmt.Errorf("%s has no %s", path, k)
		}
	}
	return env, nil
}

// EnvOr returns the environment variable's value, or def when it is unset
// or empty.
func EnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Poll calls fn every 100 ms until it returns nil, a permanent error
// (Permanentf) or timeout passes, and fails the test with fn's last error.
func Poll(t testing.TB, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	if err := PollErr(timeout, fn); err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
}

// PollErr calls fn every 100 ms until it returns nil, a permanent error or
// timeout passes, and returns fn's last error.
func PollErr(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil || IsPermanent(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// permanentError stops PollErr: waiting longer cannot help.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// Permanentf returns an error that stops Poll and PollErr at once.
func Permanentf(format string, args ...any) error {
	return permanentError{fmt.Errorf(format, args...)}
}

// IsPermanent says whether err is (or wraps) an error from Permanentf.
func IsPermanent(err error) bool {
	var perm permanentError
	return errors.As(err, &perm)
}

// Enabled says whether a suite's TestMain should start what it tests:
// only with PODRES_E2E=1 (else it prints that every test skips and returns
// false), and only as root (else it returns an error saying what needs
// root).
func Enabled(suite, needsRootFor string) (bool, error) {
	if os.Getenv("PODRES_E2E") != "1" {
		fmt.Printf("%s: PODRES_E2E is not 1: every test skips (see doc.go)\n", suite)
		return false, nil
	}
	if os.Geteuid() != 0 {
		return false, fmt.Errorf("PODRES_E2E=1 needs root (%s)", needsRootFor)
	}
	return true, nil
}

// Build builds a command of the repository at most once for a test binary,
// into a directory of its own that Remove deletes (call it after m.Run in
// TestMain). With Race, the binary has the race detector, so that the
// command's own races fail the test too.
type Build struct {
	// Pkg is the command's package path, relative to the test's directory
	// (as "../../cmd/podres-proxy").
	Pkg  string
	Race bool

	once sync.Once
	dir  string
	bin  string
	err  error
}

// Path builds the command on the first call and returns its path, or why it
// could not be built.
func (b *Build) Path() (string, error) {
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "podres-bin-")
		if b.err != nil {
			return
		}
		bin := filepath.Join(b.dir, filepath.Base(b.Pkg))
		args := []string{"build", "-o", bin}
		if b.Race {
			args = append(args, "-race")
		}
		out, err := exec.Command(GoBin(), append(args, b.Pkg)...).CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("building %s: %w\n%s", b.Pkg, err, out)
			return
		}
		b.bin = bin
	})
	return b.bin, b.err
}

// Remove deletes what Path built.
func (b *Build) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}
