package e2eutil

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadEnvFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.env")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("# written by node-up.sh\nROOT=/tmp/x\nEMPTY=''\n\nNODE_NAME=n\n")
	env, err := ReadEnvFile(path, "ROOT", "NODE_NAME")
	if err != nil {
		t.Fatal(err)
	}
	if env["ROOT"] != "/tmp/x" || env["NODE_NAME"] != "n" || env["EMPTY"] != "" || len(env) != 3 {
		t.Errorf("read %v", env)
	}
	if _, err := ReadEnvFile(path, "ROOT", "EMPTY"); err == nil || !strings.Contains(err.Error(), "has no EMPTY") {
		t.Errorf("a required key with an empty value: %v", err)
	}
	write(`ROOT=/tmp/a\ b` + "\n")
	if _, err := ReadEnvFile(path); err == nil {
		t.Errorf("a value that printf %%q escaped was read as if plain")
	}
	if _, err := ReadEnvFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing file read without error")
	}
}

func TestPollErrStopsAtAPermanentError(t *testing.T) {
	calls := 0
	err := PollErr(time.Minute, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return Permanentf("never: %d", calls)
	})
	if !IsPermanent(err) || calls != 3 || err.Error() != "never: 3" {
		t.Errorf("PollErr returned %v after %d calls", err, calls)
	}
	calls = 0
	start := time.Now()
	err = PollErr(300*time.Millisecond, func() error { calls++; return errors.New("not yet") })
	if err == nil || IsPermanent(err) || time.Since(start) < 300*time.Millisecond || calls < 2 {
		t.Errorf("PollErr returned %v after %d calls in %v", err, calls, time.Since(start))
	}
	if err := PollErr(time.Minute, func() error { return nil }); err != nil {
		t.Errorf("PollErr of a success: %v", err)
	}
}
