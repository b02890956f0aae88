package state

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// The tests below need a second process: a writer that is killed, or one
// that holds the lock. They run this test binary again with childEnv set;
// TestChildProcess then plays the child and exits without running the rest.
const (
	childEnv    = "PODRES_STATE_TEST_CHILD"
	childDirEnv = "PODRES_STATE_TEST_DIR"
	childTagEnv = "PODRES_STATE_TEST_TAG"
)

func TestChildProcess(t *testing.T) {
	role := os.Getenv(childEnv)
	if role == "" {
		t.Skip("only runs as the child process of another test")
	}
	dir, tag := os.Getenv(childDirEnv), os.Getenv(childTagEnv)
	s, err := Open(dir, Options{Log: quietLog()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(3)
	}
	switch role {
	case "writer":
		crashWriter(s, tag)
	case "locker":
		fmt.Println("locked")
		io.Copy(io.Discard, os.Stdin) // until the parent closes our stdin
		if err := s.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(4)
		}
	}
	os.Exit(0)
}

// crashWriter creates flushedBeforeKill records and says so on stdout once
// they are durable. Then it changes them as fast as it can, so that the
// writer is always busy, says "busy" after a while, and goes on until it is
// killed.
const flushedBeforeKill = 50

func crashWriter(s *Store, tag string) {
	uid := func(i int) string { return fmt.Sprintf("%s-%06d", tag, i%flushedBeforeKill) }
	for i := range flushedBeforeKill {
		s.ObserveSandbox(record.OriginNRI, readySandbox(uid(i), "ns", "p-"+uid(i), "sb-"+uid(i), nil))
	}
	if err := s.Flush(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		os.Exit(5)
	}
	fmt.Printf("flushed %d\n", flushedBeforeKill)
	for i := 0; ; i++ {
		state := model.ContainerRunning
		if i/flushedBeforeKill%2 == 1 {
			state = model.ContainerStopped
		}
		s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-" + uid(i), SandboxID: "sb-" + uid(i), Name: "app", State: state})
		if i == 100*flushedBeforeKill {
			fmt.Println("busy")
		}
	}
}

// startChild runs this test binary as a child in role on dir and returns it
// with its stdout.
func startChild(t *testing.T, role, dir, tag string) (*exec.Cmd, *bufio.Reader, io.WriteCloser, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildProcess$")
	cmd.Env = append(os.Environ(), childEnv+"="+role, childDirEnv+"="+dir, childTagEnv+"="+tag)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// Should this test binary die (a timeout), its children die too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			stopChild(cmd)
		}
	})
	return cmd, bufio.NewReader(stdout), stdin, &stderr
}

// stopChild kills a child that did not do what was expected, so that its
// stderr can be reported.
func stopChild(cmd *exec.Cmd) {
	cmd.Process.Kill()
	cmd.Wait()
}

func TestAWriterKilledMidWriteLeavesOnlyCompleteLoadableFiles(t *testing.T) {
	dir := t.TempDir()
	// Each round kills a writer child in the same directory, wherever its
	// tight loop of rewrites happens to be; the next child starts on what
	// the last one left, as a restarted daemon would. (What a kill at each
	// step of a write leaves, a temporary file whole or not, Open removes:
	// TestCorruptFilesAreSetAsideCountedAndTheRestLoads.)
	const rounds = 3
	for round := range rounds {
		tag := fmt.Sprintf("r%d", round)
		start := time.Now()
		cmd, stdout, _, stderr := startChild(t, "writer", dir, tag)
		line, err := stdout.ReadString('\n')
		if err != nil {
			stopChild(cmd)
			t.Fatalf("round %d: the writer child said nothing (%v); stderr:\n%s", round, err, stderr)
		}
		if strings.TrimSpace(line) != fmt.Sprintf("flushed %d", flushedBeforeKill) {
			stopChild(cmd)
			t.Fatalf("round %d: unexpected line from the child: %q", round, line)
		}
		// Wait until the child is busy rewriting its records.
		want := "busy\n"
		if line, err := stdout.ReadString('\n'); err != nil || line != want {
			stopChild(cmd)
			t.Fatalf("round %d: child said %q (%v), want %q; stderr:\n%s", round, line, err, want, stderr)
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child ended with %v, not by SIGKILL; stderr:\n%s", round, err, stderr)
		}
		temps := 0
		for _, name := range podFiles(t, dir) {
			if isTempName(name) {
				temps++
			}
		}
		t.Logf("round %d: killed with %d temporary files in flight, %d files, %v", round, temps, len(podFiles(t, dir)), time.Since(start))

		// Every record file is whole, as a reader sees it...
		recs, errs := persist.ReadDir(dir)
		if len(errs) != 0 {
			t.Fatalf("round %d: files unreadable after the kill: %v", round, errs)
		}
		// ...and the next child of the loop will Open it like a restarted
		// daemon. Here, check what the killed one left.
		got := map[string]bool{}
		for _, r := range recs {
			got[r.UID] = true
			if r.Name != "p-"+r.UID || r.SandboxID != "sb-"+r.UID || r.State != record.PhaseReady ||
				len(r.Containers) > 1 || len(r.Containers) == 1 && r.Containers[0].ID != "c-"+r.UID {
				t.Errorf("round %d: record %s does not hold what was written: %+v", round, r.UID, r)
			}
		}
		for i := range flushedBeforeKill {
			if uid := fmt.Sprintf("%s-%06d", tag, i); !got[uid] {
				t.Errorf("round %d: flushed record %s is missing", round, uid)
			}
		}
	}

	s := openTest(t, dir, Options{})
	st := s.Stats()
	if st.CorruptFiles != 0 {
		t.Errorf("Open set aside %d files after the kills, want none", st.CorruptFiles)
	}
	if _, err := os.Stat(filepath.Join(dir, corruptDirName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("corrupt/ exists after the kills (err %v)", err)
	}
	if st.Records != rounds*flushedBeforeKill {
		t.Errorf("loaded %d records, want the %d written", st.Records, rounds*flushedBeforeKill)
	}
	for _, name := range podFiles(t, dir) {
		if isTempName(name) {
			t.Errorf("Open left the temporary file %s", name)
		}
	}
}

func TestASecondWriterProcessIsRefusedUntilTheFirstExits(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, stdin, stderr := startChild(t, "locker", dir, "")
	if line, err := stdout.ReadString('\n'); err != nil || line != "locked\n" {
		stopChild(cmd)
		t.Fatalf("locker child: %q, %v; stderr:\n%s", line, err, stderr)
	}

	_, err := Open(dir, Options{Log: quietLog()})
	want := fmt.Sprintf("state directory %s is in use by another podres-proxy (pid %d)", dir, cmd.Process.Pid)
	if !errors.Is(err, persist.ErrInUse) || err == nil || err.Error() != want {
		t.Fatalf("Open while another process writes: %v\nwant: %s", err, want)
	}

	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("locker child: %v; stderr:\n%s", err, stderr)
	}
	s, err := Open(dir, Options{Log: quietLog()})
	if err != nil {
		t.Fatalf("Open after the other writer exited: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestALockHeldByAKilledWriterIsReleased(t *testing.T) {
	dir := t.TempDir()
	cmd, stdout, _, stderr := startChild(t, "locker", dir, "")
	if line, err := stdout.ReadString('\n'); err != nil || line != "locked\n" {
		stopChild(cmd)
		t.Fatalf("locker child: %q, %v; stderr:\n%s", line, err, stderr)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	s, err := Open(dir, Options{Log: quietLog()})
	if err != nil {
		t.Fatalf("Open after the writer was killed: %v", err)
	}
	s.Close()
}
