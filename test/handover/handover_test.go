package handover

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/nriruntime"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// callers is how many clients call during the test, half of them dialing
// per call.
const callers = 4

// The bound on an NRI event's round trip during the overlap and A's stop
// is nriFactor times the median round trip before B started, plus
// nriSlack. While both instances are registered the adaptation relays
// each event to one plugin, then the other, so the usual time doubles;
// twice that again absorbs the race detector and a loaded 2-core machine.
// The slack absorbs B's Synchronize (the runtime holds events while a
// plugin synchronizes, as containerd does) and the scheduling stalls of a
// busy CI machine. It stays well below the adaptation's 2 s request
// timeout, which is what an event costs when a plugin does not answer (an
// instance that keeps its NRI connection open while it no longer serves
// it): the failure the bound is there to catch.
const (
	nriFactor = 4
	nriSlack  = 500 * time.Millisecond
)

func TestMain(m *testing.M) {
	code := m.Run()
	serveBinary.Remove()
	os.Exit(code)
}

func TestASecondServeTakesOverAndTheFirstHandsOverOnSIGTERMWithoutAFailedCallOrASlowNRIEvent(t *testing.T) {
	handover(t, syscall.SIGTERM)
}

func TestWhenTheFirstServeIsKilledTheSecondBecomesTheWriterAndNoCallDialedPerCallFails(t *testing.T) {
	handover(t, syscall.SIGKILL)
}

// handover runs A, then B beside it on the same flags, then stops A with
// stop, under callers clients and a steady stream of NRI events, and
// checks what the issue asks (see doc.go).
func handover(t *testing.T, stop syscall.Signal) {
	began := time.Now()
	dir, err := os.MkdirTemp("", "handover-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept %s: both instances' logs, the state directory", dir)
			return
		}
		os.RemoveAll(dir)
	})
	k := fk.Start(t, dir)
	rt := nriruntime.Start(t, dir, "handover-runtime")
	n := newNode(k, rt)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Running before serve starts; each is removed at its moment below.
	removed := n.populate(ctx, "removed-in-overlap", "removed-after-a-left-nri")

	socket := filepath.Join(dir, "proxy", "kubelet.sock")
	stateDir := filepath.Join(dir, "state")
	flags := []string{
		"--socket", socket,
		"--kubelet-socket", k.Socket,
		"--kubelet-pods-url", k.PodsURL,
		"--kubelet-token-file", k.TokenFile,
		"--kubelet-ca-file", k.CAFile,
		"--kubelet-pods-api-socket", "",
		"--kubelet-pod-logs-dir", k.PodLogsDir,
		"--state-dir", stateDir,
		"--device-info-dir", filepath.Join(dir, "devinfo"),
		"--nri-socket", rt.Socket,
		"--cri-socket", "",
		"--rate-limit-qps", "0", // clients polling every few milliseconds
		"--device-cr=false",
		"--sysfs-root", "",
		// One port for both, as on a node's host network: serve binds
		// it with SO_REUSEPORT.
		"--metrics-addr", freeAddr(t),
		"--log-level", "info",
	}

	a := startInstance(t, dir, "a", flags...)
	a.awaitReady(t)
	poll.UntilWith(t, "A's NRI plugin to register", func() bool { return rt.Plugins() == 1 }, a.logTail)
	aRegistered := time.Now()
	aSocket := inode(socket)

	c := newChecker(n, socket, callers)
	var wg sync.WaitGroup
	loadErrs := make(chan error, 1)
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { n.load(ctx, loadErrs) })
	for _, cl := range c.callers {
		wg.Go(func() { c.run(ctx, cl) })
	}
	// The pre-overlap median needs a sample, and every client a few
	// answers from A alone.
	poll.Until(t, "40 NRI events and 3 calls of every client before B starts", func() bool {
		for _, cl := range c.callers {
			if cl.calls.Load() < 3 {
				return false
			}
		}
		return rt.RelayedSince(aRegistered) >= 40
	})

	// The surge pod: the same flags on the same state directory, socket
	// and NRI socket.
	bStarted := time.Now()
	b := startInstance(t, dir, "b", flags...)
	b.awaitReady(t)
	bReady := time.Now()
	bSocket := inode(socket)
	if bSocket == aSocket || bSocket == 0 {
		t.Fatalf("B is ready but the socket path is not its own (inode %d, A's %d)\n%s", bSocket, aSocket, b.logTail())
	}
	poll.UntilWith(t, "B's NRI plugin to register beside A's", func() bool { return rt.Plugins() == 2 }, b.logTail)
	b.awaitLog(t, "waiting to become the writer of the state directory")

	// The overlap: a pod's sandbox starts, another's is removed; both
	// instances' plugins see it. Then every client dialing per call is
	// answered by B (a call begun after B was ready reaches B's socket).
	inOverlap := n.newPod("started-in-overlap", true)
	n.admit(inOverlap)
	n.start(ctx, inOverlap)
	if err := n.remove(ctx, removed["removed-in-overlap"]); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, "every client dialing per call to be answered after B was ready, and 20 NRI events in the overlap", func() bool {
		return c.allSince(bReady, true) && rt.RelayedSince(bReady) >= 20
	})

	// A's end: once A left NRI, a pod's sandbox starts and another's is
	// removed, which only B sees. On SIGTERM, A is held (SIGSTOP)
	// meanwhile, as a slow flush or a long call in flight holds an
	// instance that stops: if it still holds the state directory then, B
	// learns them while it waits, must not become the writer before A lets
	// go, and must keep them when it takes the directory over.
	signalled := time.Now()
	a.signal(t, stop)
	poll.UntilWith(t, "A to leave NRI", func() bool { return rt.Plugins() == 1 }, a.logTail)
	aLeft := time.Now()
	aHeld := false
	if stop == syscall.SIGTERM {
		a.signal(t, syscall.SIGSTOP)
		poll.Until(t, "every thread of A to be stopped", func() bool { return stopped(a.cmd.Process.Pid) })
		aHeld = holdsLock(a.cmd.Process.Pid, filepath.Join(stateDir, "lock"))
	}
	afterA := n.newPod("started-after-a-left-nri", true)
	n.admit(afterA)
	n.start(ctx, afterA)
	if err := n.remove(ctx, removed["removed-after-a-left-nri"]); err != nil {
		t.Fatal(err)
	}
	onlyB := time.Now() // the events only B saw are done
	if stop == syscall.SIGTERM {
		if aHeld && strings.Contains(b.log(), "became the writer") {
			t.Errorf("B became the writer while A still held the state directory:\n%s", b.logTail())
		}
		a.signal(t, syscall.SIGCONT)
	}
	code := a.awaitExit(t)
	aExited := a.exitedAt
	if stop == syscall.SIGTERM && code != 0 {
		t.Errorf("A exited %d after SIGTERM, not 0:\n%s", code, a.logTail())
	}
	b.awaitLog(t, "became the writer of the state directory")
	becameWriter := time.Now()
	if got := inode(socket); got != bSocket {
		t.Errorf("after A exited the socket path is inode %d, not B's %d: A removed or replaced a path it no longer owned", got, bSocket)
	}
	// Every client answered by B alone, the long-lived ones reconnected.
	poll.UntilWith(t, "every client to be answered after A exited", func() bool { return c.allSince(aExited, false) }, b.logTail)
	cancel()
	wg.Wait()
	select {
	case err := <-loadErrs:
		t.Error(err)
	default:
	}

	// What the survivor recorded: the pods of both moments, read from the
	// state directory as B wrote it.
	want := map[string]*pod{
		"started-in-overlap":       inOverlap,
		"removed-in-overlap":       removed["removed-in-overlap"],
		"started-after-a-left-nri": afterA,
		"removed-after-a-left-nri": removed["removed-after-a-left-nri"],
	}
	var lastProblems []string
	poll.UntilWith(t, "the survivor to record the pods started and removed during the overlap and A's end", func() bool {
		recs, errs := persist.ReadDir(stateDir)
		lastProblems = recorded(recs, want)
		for _, err := range errs {
			lastProblems = append(lastProblems, err.Error())
		}
		return len(lastProblems) == 0
	}, func() string { return strings.Join(lastProblems, "\n") + "\n" + b.logTail() })
	out, err := exec.Command(binary(t), "inspect", "--state-dir", stateDir, "-o", "json").Output()
	if err != nil {
		t.Fatalf("podres-proxy inspect --state-dir %s -o json: %v", stateDir, err)
	}
	var recs []*record.Record
	if err := json.Unmarshal(out, &recs); err != nil {
		t.Fatalf("podres-proxy inspect -o json: %v\n%s", err, out)
	}
	if problems := recorded(recs, want); len(problems) > 0 {
		t.Errorf("podres-proxy inspect -o json shows, of what B recorded:\n%s", strings.Join(problems, "\n"))
	}

	// The calls.
	var perCall, longLived []string
	var perCallCalls, longLivedCalls int64
	for _, cl := range c.callers {
		if cl.perCall {
			perCall = append(perCall, cl.failed()...)
			perCallCalls += cl.calls.Load()
		} else {
			longLived = append(longLived, cl.failed()...)
			longLivedCalls += cl.calls.Load()
		}
	}
	if len(perCall) > 0 {
		t.Errorf("%d of %d calls dialing per call failed:\n%s", len(perCall), perCallCalls, strings.Join(perCall, "\n"))
	}
	if stop == syscall.SIGTERM && len(longLived) > 0 {
		t.Errorf("%d of %d calls on long-lived connections failed:\n%s", len(longLived), longLivedCalls, strings.Join(longLived, "\n"))
	}
	if stop == syscall.SIGKILL {
		// A long-lived connection to the killed A may fail one call, the
		// one that finds it gone; the next dials the path, B.
		for _, cl := range c.callers {
			if f := cl.failed(); !cl.perCall && (len(f) > 1 || (len(f) == 1 && !strings.Contains(f[0], "Unavailable"))) {
				t.Errorf("client %d (%s) failed %d calls, more than the one that finds A killed, or not with Unavailable:\n%s",
					cl.id, cl.kind(), len(f), strings.Join(f, "\n"))
			}
		}
	}
	c.mu.Lock()
	if c.nWrong > 0 {
		t.Errorf("%d wrong answers of %d; the first:\n%s", c.nWrong, c.lists.Load()+c.gets.Load(), strings.Join(c.wrong, "\n\n"))
	}
	c.mu.Unlock()

	// The NRI events.
	nri := nriRoundTrips(rt.Log(), aRegistered, bStarted, aExited)
	if nri.pre == 0 {
		t.Fatal("no NRI event was relayed to A alone before B started")
	}
	if len(nri.slow) > 0 || len(nri.failed) > 0 {
		t.Errorf("of %d NRI events during the overlap and A's end, %d took longer than %v (%d × the median %v before B started, plus %v), %d failed:\n%s",
			nri.during, len(nri.slow), nri.bound, nriFactor, nri.median, nriSlack, len(nri.failed), strings.Join(append(nri.slow, nri.failed...), "\n"))
	}

	// The logs.
	bLog, aLog := b.log(), a.log()
	if !inOrder(bLog, bTakesOver...) {
		t.Errorf("B's log does not say, in this order, %q:\n%s", bTakesOver, b.logTail())
	}
	for _, lines := range aHandsOver {
		if stop == syscall.SIGTERM && !inOrder(aLog, lines...) {
			t.Errorf("A's log does not say, in this order, %q:\n%s", lines, a.logTail())
		}
	}
	for _, in := range []*instance{a, b} {
		if strings.Contains(in.log(), "DATA RACE") {
			t.Errorf("%s raced:\n%s", in.name, in.logTail())
		}
	}

	// B, now alone, stops cleanly.
	b.signal(t, syscall.SIGTERM)
	if code := b.awaitExit(t); code != 0 {
		t.Errorf("B exited %d after SIGTERM, not 0:\n%s", code, b.logTail())
	}

	t.Logf("%v: A ready, B started %v later and was ready after %v; A stopped %v after B was ready and exited %v after %v; B's log said it became the writer within %v of A's exit",
		stop, bStarted.Sub(aRegistered).Round(time.Millisecond), bReady.Sub(bStarted).Round(time.Millisecond),
		signalled.Sub(bReady).Round(time.Millisecond), aExited.Sub(signalled).Round(time.Millisecond), stop,
		becameWriter.Sub(aExited).Round(time.Millisecond))
	learned := "after B became the writer, or while it waited: A was not held"
	if aHeld {
		learned = "while B waited: A, held, still held the state directory"
	}
	t.Logf("A left NRI %v after %v; the events only B saw took %v, %s",
		aLeft.Sub(signalled).Round(time.Millisecond), stop, onlyB.Sub(aLeft).Round(time.Millisecond), learned)
	t.Logf("calls: %d dialing per call, %d failed; %d on long-lived connections, %d failed; %d Lists and %d Gets answered, %d wrong",
		perCallCalls, len(perCall), longLivedCalls, len(longLived), c.lists.Load(), c.gets.Load(), c.nWrong)
	for _, f := range longLived {
		t.Logf("failed on a long-lived connection: %s", f)
	}
	t.Logf("NRI: %d events to A alone, median %v, max %v; %d during the overlap and A's end, median %v, max %v (%s), bound %v; %d after",
		nri.pre, nri.median, nri.preMax, nri.during, nri.duringMedian, nri.duringMax, nri.duringMaxEvent, nri.bound, nri.post)
	t.Logf("took %v", time.Since(began).Round(time.Millisecond))
}

// What each instance logs of the handover, in this order (serve's words).
var (
	// B: it waits for A to let go of the state directory, then writes it.
	bTakesOver = []string{"waiting to become the writer of the state directory", "became the writer of the state directory"}
	// A, on SIGTERM: what it is about to do, and that it left NRI (its
	// parts stop at once, so either may come first), each before it
	// stopped (after the store's flush and the lock's release).
	aHandsOver = [][]string{
		{"stopping: leaving NRI", "letting go of it", "msg=stopped"},
		{"Left the runtime's NRI", "msg=stopped"},
	}
)

// inOrder reports whether log holds each of lines, in their order.
func inOrder(log string, lines ...string) bool {
	for _, l := range lines {
		i := strings.Index(log, l)
		if i < 0 {
			return false
		}
		log = log[i+len(l):]
	}
	return true
}

// stopped reports whether every thread of process pid is stopped (state
// T in /proc/PID/task/*/stat): a signal is delivered after kill returns.
func stopped(pid int) bool {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces, not a ')'.
		_, rest, ok := strings.Cut(string(b), ") ")
		if !ok || !strings.HasPrefix(rest, "T") {
			return false
		}
	}
	return true
}

// holdsLock reports whether process pid holds a flock on path, as
// /proc/locks says (read only: taking the lock to find out would race B).
func holdsLock(pid int, path string) bool {
	ino := inode(path)
	b, err := os.ReadFile("/proc/locks")
	if err != nil || ino == 0 {
		return false
	}
	for line := range strings.Lines(string(b)) {
		// 1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF
		f := strings.Fields(line)
		if len(f) >= 6 && f[1] == "FLOCK" && f[4] == strconv.Itoa(pid) && strings.HasSuffix(f[5], ":"+strconv.FormatUint(ino, 10)) {
			return true
		}
	}
	return false
}

// recorded checks the records of want's pods: a started pod's record is
// ready with its sandbox and devices, a removed pod's is removed.
func recorded(recs []*record.Record, want map[string]*pod) []string {
	var problems []string
	for name, p := range want {
		i := slices.IndexFunc(recs, func(r *record.Record) bool { return r.UID == p.uid })
		if i < 0 {
			problems = append(problems, fmt.Sprintf("%s (uid %s): no record", name, p.uid))
			continue
		}
		r := recs[i]
		wantState := record.PhaseReady
		if strings.HasPrefix(name, "removed-") {
			wantState = record.PhaseRemoved
		}
		if r.State != wantState || r.SandboxID != p.sandbox.Id {
			j, _ := json.Marshal(r)
			problems = append(problems, fmt.Sprintf("%s (uid %s): state %q sandbox %q, want %q sandbox %q; the record: %s", name, p.uid, r.State, r.SandboxID, wantState, p.sandbox.Id, j))
		}
		var ids []string
		for _, d := range r.Devices {
			for _, id := range d.IDs {
				ids = append(ids, d.Resource+"="+id)
			}
		}
		slices.Sort(ids)
		if wantState == record.PhaseReady && !slices.Equal(ids, p.devices) {
			problems = append(problems, fmt.Sprintf("%s (uid %s): devices %v, want %v", name, p.uid, ids, p.devices))
		}
	}
	slices.Sort(problems)
	return problems
}

// roundTrips sums up the NRI events' round trips.
type roundTrips struct {
	pre                     int // relayed to A alone, before B started
	median, preMax, bound   time.Duration
	during                  int // overlapping the overlap or A's end
	duringMedian, duringMax time.Duration
	duringMaxEvent          string
	post                    int
	slow, failed            []string
}

// nriRoundTrips sorts the events into before B started (from A's
// registration on), during the overlap and A's end (any part of it from
// B's start to A's exit), and after.
func nriRoundTrips(events []nriruntime.Event, aRegistered, bStarted, aExited time.Time) roundTrips {
	var r roundTrips
	var pre, during []time.Duration
	for _, e := range events {
		switch {
		case e.Start.Before(aRegistered):
		case e.End.Before(bStarted):
			pre = append(pre, e.Took())
		case e.Start.Before(aExited):
			during = append(during, e.Took())
			if e.Took() > r.duringMax {
				r.duringMax = e.Took()
				r.duringMaxEvent = fmt.Sprintf("%s of %s at %s", e.Name, e.Pod, clock(e.Start))
			}
		default:
			r.post++
		}
	}
	r.pre, r.during = len(pre), len(during)
	r.median, r.preMax = median(pre), slices.Max(append(pre, 0))
	r.duringMedian = median(during)
	r.bound = nriFactor*r.median + nriSlack
	for _, e := range events {
		if e.Start.Before(aRegistered) || e.End.Before(bStarted) || !e.Start.Before(aExited) {
			continue
		}
		if e.Took() > r.bound {
			r.slow = append(r.slow, fmt.Sprintf("%s of %s at %s took %v", e.Name, e.Pod, clock(e.Start), e.Took()))
		}
		if e.Err != nil {
			r.failed = append(r.failed, fmt.Sprintf("%s of %s at %s failed: %v", e.Name, e.Pod, clock(e.Start), e.Err))
		}
	}
	return r
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
