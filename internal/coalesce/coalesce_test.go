package coalesce

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The tests run in synctest bubbles: synctest.Wait lets every caller and
// call reach the point where it blocks, so each step happens in a known
// order without sleeps, and synctest.Test fails on a goroutine left behind.
// time.Sleep moves only the bubble's clock.

const timeout = 10 * time.Second

// fake is a function whose every call waits for the test to answer it.
type fake struct {
	mu    sync.Mutex
	calls []*fakeCall
}

type fakeCall struct {
	ctx     context.Context
	started time.Time
	answer  chan answer
}

type answer struct {
	err   error
	panic any
}

func (f *fake) fn(ctx context.Context, started time.Time) (time.Time, error) {
	c := &fakeCall{ctx: ctx, started: started, answer: make(chan answer, 1)}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	select {
	case a := <-c.answer:
		if a.panic != nil {
			panic(a.panic)
		}
		return started, a.err
	case <-ctx.Done():
		return started, context.Cause(ctx)
	}
}

func (f *fake) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// call returns the i-th call (from 0), which must have started.
func (f *fake) call(t *testing.T, i int) *fakeCall {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.calls) {
		t.Fatalf("call %d has not started (%d calls)", i+1, len(f.calls))
	}
	return f.calls[i]
}

func (f *fake) answer(t *testing.T, i int, err error) {
	t.Helper()
	f.call(t, i).answer <- answer{err: err}
}

type result struct {
	started  time.Time // when the call the caller got started
	err      error
	panicked any
}

func async(ctx context.Context, do func(context.Context) (time.Time, error)) <-chan result {
	ch := make(chan result, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				ch <- result{panicked: v}
			}
		}()
		started, err := do(ctx)
		ch <- result{started: started, err: err}
	}()
	return ch
}

func doAsync(ctx context.Context, g *Group[time.Time], after time.Time) <-chan result {
	return async(ctx, func(ctx context.Context) (time.Time, error) { return g.Do(ctx, after) })
}

func joinAsync(ctx context.Context, g *Group[time.Time], after time.Time, t Ticket) <-chan result {
	return async(ctx, func(ctx context.Context) (time.Time, error) { return g.Join(ctx, after, t) })
}

// receive returns what ch holds once every goroutine of the bubble is
// blocked; it fails the test when the caller still waits.
func receive(t *testing.T, ch <-chan result) result {
	t.Helper()
	synctest.Wait()
	select {
	case r := <-ch:
		return r
	default:
		t.Fatal("the caller still waits")
		return result{}
	}
}

func waiting(t *testing.T, ch <-chan result) {
	t.Helper()
	synctest.Wait()
	select {
	case r := <-ch:
		t.Fatalf("the caller got %v, %v; want it still waiting", r.started, r.err)
	default:
	}
}

func newGroup(f *fake) *Group[time.Time] {
	return New(f.fn, Options{Name: "test call", Timeout: timeout})
}

func TestACallerWithNothingInFlightMakesACallThatStartsAfterItArrived(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		arrived := time.Now()
		ch := doAsync(t.Context(), g, arrived)
		waiting(t, ch)
		f.answer(t, 0, nil)
		r := receive(t, ch)
		if r.err != nil || r.started.Before(arrived) {
			t.Errorf("got a call started at %v (%v), want one started at or after %v", r.started, r.err, arrived)
		}
	})
}

func TestCallersArrivingAfterTheCallInFlightStartedShareTheNextCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		first := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		time.Sleep(time.Second)
		arrived := time.Now()
		const n = 8
		var later []<-chan result
		for range n {
			later = append(later, doAsync(t.Context(), g, arrived))
		}
		synctest.Wait()
		if f.count() != 1 {
			t.Fatalf("%d calls while the first is in flight, want 1", f.count())
		}
		f.answer(t, 0, nil)
		if r := receive(t, first); r.err != nil {
			t.Fatal(r.err)
		}
		for _, ch := range later {
			waiting(t, ch) // the first call started before they arrived
		}
		if f.count() != 2 {
			t.Fatalf("%d calls after the first ended, want the next started", f.count())
		}
		f.answer(t, 1, nil)
		for _, ch := range later {
			if r := receive(t, ch); r.err != nil || r.started.Before(arrived) {
				t.Errorf("a later caller got a call started at %v (%v), want at or after %v", r.started, r.err, arrived)
			}
		}
		if f.count() != 2 {
			t.Errorf("%d calls, want 2", f.count())
		}
	})
}

func TestACallerWhoArrivedBeforeTheCallInFlightStartedJoinsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		t0 := time.Now()
		a := doAsync(t.Context(), g, t0.Add(-time.Nanosecond))
		synctest.Wait()
		time.Sleep(time.Second)
		b := doAsync(t.Context(), g, t0.Add(-time.Nanosecond)) // its query arrived just before the call started
		synctest.Wait()
		f.answer(t, 0, nil)
		ra, rb := receive(t, a), receive(t, b)
		if ra.err != nil || rb.err != nil || !ra.started.Equal(rb.started) {
			t.Errorf("got %v and %v, want both the call that started at %v", ra, rb, t0)
		}
		if f.count() != 1 {
			t.Errorf("%d calls, want 1", f.count())
		}

		// One whose after is the call's start does not: it may have
		// arrived after the call started, at the same clock reading.
		time.Sleep(time.Second)
		t1 := time.Now()
		c := doAsync(t.Context(), g, t1.Add(-time.Nanosecond))
		synctest.Wait()
		d := doAsync(t.Context(), g, t1)
		waiting(t, d)
		f.answer(t, 1, nil)
		receive(t, c)
		waiting(t, d)
		f.answer(t, 2, nil)
		if r := receive(t, d); r.err != nil {
			t.Errorf("got %v", r.err)
		}
	})
}

func TestACallsErrorGoesToEveryCallerWaitingAndIsNotKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		t0 := time.Now().Add(-time.Nanosecond) // both arrived before the call started
		a, b := doAsync(t.Context(), g, t0), doAsync(t.Context(), g, t0)
		synctest.Wait()
		down := errors.New("connection refused")
		f.answer(t, 0, down)
		for _, ch := range []<-chan result{a, b} {
			if r := receive(t, ch); !errors.Is(r.err, down) {
				t.Errorf("got %v, want the call's error", r.err)
			}
		}
		// Even a caller content with an old call gets a new one.
		c := doAsync(t.Context(), g, t0.Add(-time.Hour))
		waiting(t, c)
		f.answer(t, 1, nil)
		if r := receive(t, c); r.err != nil {
			t.Errorf("the caller after a failed call got %v", r.err)
		}
	})
}

func TestACallerWhoLeavesStopsWaitingAndTheCallGoesOnForTheOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		t0 := time.Now().Add(-time.Nanosecond)
		leaving, leave := context.WithCancelCause(t.Context())
		a := doAsync(leaving, g, t0)
		b := doAsync(t.Context(), g, t0)
		synctest.Wait()
		gone := errors.New("client went away")
		leave(gone)
		r := receive(t, a)
		if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, gone) || !strings.Contains(r.err.Error(), "test call") {
			t.Errorf("the caller who left got %v, want an error naming the call and wrapping Canceled and its cause", r.err)
		}
		if err := f.call(t, 0).ctx.Err(); err != nil {
			t.Fatalf("the call another caller waits for was cancelled: %v", err)
		}
		waiting(t, b)
		f.answer(t, 0, nil)
		if r := receive(t, b); r.err != nil {
			t.Errorf("the caller who stayed got %v", r.err)
		}
	})
}

func TestACallNobodyWaitsForIsCancelledAndANextCallNobodyWaitsForNeverStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		ctxA, leaveA := context.WithCancel(t.Context())
		a := doAsync(ctxA, g, time.Now())
		synctest.Wait()
		time.Sleep(time.Second)
		ctxB, leaveB := context.WithCancel(t.Context())
		b := doAsync(ctxB, g, time.Now())
		synctest.Wait()
		leaveB()
		if r := receive(t, b); !errors.Is(r.err, context.Canceled) {
			t.Errorf("got %v, want Canceled", r.err)
		}
		leaveA()
		if r := receive(t, a); !errors.Is(r.err, context.Canceled) {
			t.Errorf("got %v, want Canceled", r.err)
		}
		if err := f.call(t, 0).ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("the call nobody waits for has context error %v, want Canceled", err)
		}
		synctest.Wait()
		if f.count() != 1 {
			t.Errorf("%d calls, want no next call for callers who left", f.count())
		}
	})
}

func TestACallerWithADoneContextMakesNoCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := g.Do(ctx, time.Now()); !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want Canceled", err)
		}
		synctest.Wait()
		if f.count() != 0 {
			t.Errorf("%d calls, want none", f.count())
		}
	})
}

func TestACallThatHangsEndsAtTheTimeoutWithDeadlineExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		start := time.Now()
		_, err := g.Do(t.Context(), start) // nobody answers: the bubble's clock runs on
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "test call: waited longer than 10s") {
			t.Errorf("got %v, want a DeadlineExceeded that names the call and 10s", err)
		}
		if waited := time.Since(start); waited != timeout {
			t.Errorf("waited %v, want %v", waited, timeout)
		}
	})
}

// A caller behind a call that hangs waits for the next; when that one hangs
// too, the caller still waits no longer than one Timeout in all.
func TestACallerBehindAHungCallWaitsAtMostOneTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		first := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		time.Sleep(time.Second)
		arrived := time.Now()
		_, err := g.Do(t.Context(), arrived)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v, want DeadlineExceeded", err)
		}
		if waited := time.Since(arrived); waited > timeout {
			t.Errorf("waited %v, want at most %v", waited, timeout)
		}
		if r := receive(t, first); !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("the hung call ended with %v", r.err)
		}
	})
}

func TestACallsPanicIsRaisedInEveryCallerWaitingAndTheGroupGoesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		t0 := time.Now().Add(-time.Nanosecond) // both arrived before the call started
		a, b := doAsync(t.Context(), g, t0), doAsync(t.Context(), g, t0)
		synctest.Wait()
		f.call(t, 0).answer <- answer{panic: "decoder bug"}
		for _, ch := range []<-chan result{a, b} {
			r := receive(t, ch)
			p, ok := r.panicked.(*PanicError)
			if !ok || p.Value != "decoder bug" || len(p.Stack) == 0 {
				t.Errorf("a caller got %+v, want a *PanicError with the value and a stack", r)
			}
		}
		c := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		f.answer(t, 1, nil)
		if r := receive(t, c); r.err != nil {
			t.Errorf("the caller after a panic got %v", r.err)
		}
	})
}

func TestSharedIsToldHowManyCallersGetACallsResultBeforeTheyDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		var mu sync.Mutex
		var told []int
		g := New(f.fn, Options{Name: "test call", Timeout: timeout, Shared: func(n int) {
			mu.Lock()
			defer mu.Unlock()
			told = append(told, n)
		}})
		t0 := time.Now().Add(-time.Nanosecond)
		leaving, leave := context.WithCancel(t.Context())
		chs := []<-chan result{doAsync(t.Context(), g, t0), doAsync(t.Context(), g, t0), doAsync(leaving, g, t0)}
		synctest.Wait()
		leave()
		synctest.Wait()
		f.answer(t, 0, nil)
		for _, ch := range chs {
			<-ch
		}
		mu.Lock()
		defer mu.Unlock()
		if len(told) != 1 || told[0] != 1 {
			t.Errorf("Shared was told %v, want [1]: the callers still waiting beyond the first", told)
		}
	})
}

// ticket is a Ticket whose reservations the test sees.
type ticket struct {
	delay time.Duration
	ok    bool

	mu                  sync.Mutex
	reserved, cancelled int
}

func (k *ticket) Reserve() (time.Duration, func(), bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.ok {
		return 0, nil, false
	}
	k.reserved++
	return k.delay, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.cancelled++
	}, true
}

func (k *ticket) counts() (reserved, cancelled int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reserved, k.cancelled
}

func TestARiderAloneMakesNoCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		k := &ticket{delay: 10 * time.Millisecond, ok: true}
		if _, err := g.Join(t.Context(), time.Now(), k); !errors.Is(err, ErrNotMade) {
			t.Errorf("a rider alone got %v, want ErrNotMade", err)
		}
		if _, err := g.Join(t.Context(), time.Now(), &ticket{}); !errors.Is(err, ErrNotMade) {
			t.Errorf("a rider whose ticket allows no call got %v, want ErrNotMade", err)
		}
		if f.count() != 0 {
			t.Errorf("riders alone made %d calls", f.count())
		}
		if r, c := k.counts(); r != 1 || c != 1 {
			t.Errorf("%d reservations, %d given back; want the one reserved given back", r, c)
		}
	})
}

func TestRidersWhoGatherShareOneCallOnceTheirTicketAllowsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		k := &ticket{delay: 10 * time.Millisecond, ok: true}
		arrived := time.Now()
		a, b := joinAsync(t.Context(), g, arrived, k), joinAsync(t.Context(), g, arrived, k)
		waiting(t, a)
		if f.count() != 0 {
			t.Fatalf("%d calls before the ticket allows one", f.count())
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if f.count() != 1 {
			t.Fatalf("%d calls once the ticket allows one, want 1", f.count())
		}
		f.answer(t, 0, nil)
		for _, ch := range []<-chan result{a, b} {
			if r := receive(t, ch); r.err != nil || r.started.Before(arrived) {
				t.Errorf("a rider got %v", r)
			}
		}
		if r, c := k.counts(); r != 1 || c != 0 {
			t.Errorf("%d reservations, %d given back; want one used", r, c)
		}
	})
}

func TestACallerWhoPaysMakesTheCallRidersGatherForAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		k := &ticket{delay: 10 * time.Millisecond, ok: true}
		rider := joinAsync(t.Context(), g, time.Now(), k)
		synctest.Wait()
		payer := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		if f.count() != 1 {
			t.Fatalf("%d calls, want the payer's at once", f.count())
		}
		f.answer(t, 0, nil)
		for _, ch := range []<-chan result{rider, payer} {
			if r := receive(t, ch); r.err != nil {
				t.Errorf("got %v", r.err)
			}
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if r, c := k.counts(); r != 1 || c != 1 {
			t.Errorf("%d reservations, %d given back; want the unused one given back", r, c)
		}
	})
}

func TestRidersOfTheNextCallShareItWhenAPayerWaitsOrTheyAreSeveral(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		k := &ticket{delay: 10 * time.Millisecond, ok: true}

		// With a payer: the next call is made at once.
		first := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		time.Sleep(time.Millisecond)
		rider, payer := joinAsync(t.Context(), g, time.Now(), k), doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		f.answer(t, 0, nil)
		receive(t, first)
		synctest.Wait()
		f.answer(t, 1, nil)
		for _, ch := range []<-chan result{rider, payer} {
			if r := receive(t, ch); r.err != nil {
				t.Errorf("got %v", r.err)
			}
		}

		// Riders alone: once their ticket allows it, when they are two.
		first = doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		time.Sleep(time.Millisecond)
		riders := []<-chan result{joinAsync(t.Context(), g, time.Now(), k), joinAsync(t.Context(), g, time.Now(), k)}
		synctest.Wait()
		f.answer(t, 2, nil)
		receive(t, first)
		if f.count() != 3 {
			t.Fatalf("%d calls, want none yet for riders alone", f.count())
		}
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		f.answer(t, 3, nil)
		for _, ch := range riders {
			if r := receive(t, ch); r.err != nil {
				t.Errorf("got %v", r.err)
			}
		}

		// One rider alone: no call.
		first = doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		time.Sleep(time.Millisecond)
		lone := joinAsync(t.Context(), g, time.Now(), k)
		synctest.Wait()
		f.answer(t, 4, nil)
		receive(t, first)
		time.Sleep(10 * time.Millisecond)
		if r := receive(t, lone); !errors.Is(r.err, ErrNotMade) {
			t.Errorf("a lone rider of the next call got %v, want ErrNotMade", r.err)
		}
		if f.count() != 5 {
			t.Errorf("%d calls, want 5", f.count())
		}
	})
}

func TestARiderJoinsTheCallInFlightWhenItStartedAfterIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		t0 := time.Now().Add(-time.Nanosecond)
		payer := doAsync(t.Context(), g, t0)
		synctest.Wait()
		rider := joinAsync(t.Context(), g, t0, &ticket{})
		synctest.Wait()
		f.answer(t, 0, nil)
		for _, ch := range []<-chan result{payer, rider} {
			if r := receive(t, ch); r.err != nil {
				t.Errorf("got %v", r.err)
			}
		}
		if f.count() != 1 {
			t.Errorf("%d calls, want 1", f.count())
		}
	})
}

// A call that panics after every caller left has nobody to hand the panic
// to: it crashes the process, as a panic in any goroutine does, rather than
// vanish. The crash happens in a child process.
func TestAPanicNobodyWaitsForCrashesTheProcess(t *testing.T) {
	if os.Getenv("COALESCE_PANIC_CHILD") == "1" {
		started, release := make(chan struct{}), make(chan struct{})
		g := New(func(context.Context, time.Time) (int, error) {
			close(started)
			<-release
			panic("nobody waits for me")
		}, Options{Name: "test call", Timeout: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		left := make(chan error)
		go func() {
			_, err := g.Do(ctx, time.Now())
			left <- err
		}()
		<-started
		cancel()
		<-left
		close(release)
		select {} // the call's goroutine ends the process
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAPanicNobodyWaitsForCrashesTheProcess$")
	cmd.Env = append(os.Environ(), "COALESCE_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "panic in a shared call: nobody waits for me") {
		t.Errorf("child ended with %v, output:\n%s\nwant a crash with the call's panic", err, out)
	}
}

func TestANextCallStartsMinIntervalAfterTheOneBeforeAndCallersArrivingMeanwhileShareIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const pace = 100 * time.Millisecond
		f := &fake{}
		g := New(f.fn, Options{Name: "test call", Timeout: timeout, MinInterval: pace})
		first := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		second := doAsync(t.Context(), g, time.Now()) // waits for the next call
		synctest.Wait()
		f.answer(t, 0, nil)
		if r := receive(t, first); r.err != nil {
			t.Fatal(r.err)
		}
		waiting(t, second)
		if f.count() != 1 {
			t.Fatalf("the next call started %v after the one before, want %v", time.Since(f.call(t, 1).started), pace)
		}
		// A caller arriving while the next call waits for its pace shares
		// it: back to back, it would have needed a third call.
		time.Sleep(20 * time.Millisecond)
		third := doAsync(t.Context(), g, time.Now())
		waiting(t, third)
		time.Sleep(pace)
		synctest.Wait()
		if f.count() != 2 {
			t.Fatalf("%d calls once the pace passed, want 2", f.count())
		}
		if gap := f.call(t, 1).started.Sub(f.call(t, 0).started); gap < pace {
			t.Errorf("the next call started %v after the one before, want at least %v", gap, pace)
		}
		f.answer(t, 1, nil)
		for _, ch := range []<-chan result{second, third} {
			if r := receive(t, ch); r.err != nil || !r.started.Equal(f.call(t, 1).started) {
				t.Errorf("got a call started at %v (%v), want the paced one", r.started, r.err)
			}
		}
		// Nothing in flight: a caller is never delayed, however recent
		// the last call.
		alone := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		if f.count() != 3 {
			t.Fatalf("a caller with nothing in flight waits: %d calls, want 3", f.count())
		}
		f.answer(t, 2, nil)
		if r := receive(t, alone); r.err != nil {
			t.Fatal(r.err)
		}
	})
}

// abandonedPacedCall returns a group paced at a second whose first call
// ended after a millisecond, and whose next call, waiting for its pace,
// lost its only caller.
func abandonedPacedCall(t *testing.T) (*fake, *Group[time.Time]) {
	t.Helper()
	f := &fake{}
	g := New(f.fn, Options{Name: "test call", Timeout: timeout, MinInterval: time.Second})
	first := doAsync(t.Context(), g, time.Now())
	synctest.Wait()
	time.Sleep(time.Millisecond)
	leaving, leave := context.WithCancel(t.Context())
	second := doAsync(leaving, g, time.Now())
	synctest.Wait()
	f.answer(t, 0, nil)
	receive(t, first)
	leave()
	if r := receive(t, second); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %v, want the caller's cancellation", r.err)
	}
	return f, g
}

func TestAPacedCallNobodyWaitsForAnyMoreNeverStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _ := abandonedPacedCall(t)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if f.count() != 1 {
			t.Errorf("%d calls, want none after the only waiter left", f.count())
		}
	})
}

func TestACallerWhoArrivedBeforeAnEndedCallStartedTakesItsResultUntilTheNextStarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := newGroup(f)
		early := time.Now() // a query that reached the daemon now, asked later
		time.Sleep(time.Millisecond)
		first := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		f.answer(t, 0, nil)
		r := receive(t, first)
		// Asked once the call ended: its result started after early.
		if got := receive(t, doAsync(t.Context(), g, early)); got.err != nil || !got.started.Equal(r.started) {
			t.Errorf("a caller who arrived before the ended call started got %v (%v), want its result", got.started, got.err)
		}
		if f.count() != 1 {
			t.Fatalf("%d calls, want the ended call's result taken", f.count())
		}
		// A caller who arrived after it started needs a call of its own.
		time.Sleep(time.Millisecond)
		late := doAsync(t.Context(), g, time.Now())
		waiting(t, late)
		if f.count() != 2 {
			t.Fatalf("%d calls, want a new one for a caller who arrived after the last started", f.count())
		}
		// Once the next call started, the ended one's result is gone: even
		// an early caller waits for the call in flight, which started after
		// it arrived.
		again := doAsync(t.Context(), g, early)
		waiting(t, again)
		f.answer(t, 1, errors.New("kubelet down"))
		if got := receive(t, late); got.err == nil {
			t.Fatal("the failed call's caller got no error")
		}
		receive(t, again)
		// A failed call's result is not kept.
		next := doAsync(t.Context(), g, early)
		waiting(t, next)
		if f.count() != 3 {
			t.Fatalf("%d calls, want a new one after a failed call", f.count())
		}
		f.answer(t, 2, nil)
		receive(t, next)
	})
}

func TestAPacedCallWhosePayersLeftIsMadeOnlyWhenItsRidersTicketAllows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fake{}
		g := New(f.fn, Options{Name: "test call", Timeout: timeout, MinInterval: 100 * time.Millisecond})
		first := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		time.Sleep(time.Millisecond)
		leaving, leave := context.WithCancel(t.Context())
		payer := doAsync(leaving, g, time.Now())
		rider := joinAsync(t.Context(), g, time.Now(), &ticket{ok: false})
		synctest.Wait()
		f.answer(t, 0, nil)
		receive(t, first)
		leave()
		receive(t, payer)
		time.Sleep(time.Second)
		if r := receive(t, rider); !errors.Is(r.err, ErrNotMade) {
			t.Errorf("the rider got %v, want ErrNotMade: no caller within the rate pays for the call", r.err)
		}
		if f.count() != 1 {
			t.Errorf("%d calls, want none made for a rider whose ticket allows none", f.count())
		}
	})
}

func TestACallCutShortBecauseNobodyWaitedIsNotKeptForLaterCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		// Like the proxy's List, it answers without error when its context
		// ends mid-way: what it answered then is not a result to keep.
		fn := func(ctx context.Context, started time.Time) (time.Time, error) {
			calls++
			if calls == 1 {
				<-ctx.Done()
			}
			return started, nil
		}
		g := New(fn, Options{Name: "test call", Timeout: timeout})
		early := time.Now()
		time.Sleep(time.Millisecond)
		leaving, leave := context.WithCancel(t.Context())
		only := doAsync(leaving, g, time.Now())
		synctest.Wait()
		leave()
		receive(t, only)
		if r := receive(t, doAsync(t.Context(), g, early)); r.err != nil || calls != 2 {
			t.Errorf("a later caller got %v (%v) after %d calls; want a call of its own, not the one cut short", r.started, r.err, calls)
		}
	})
}

func TestACallerFindingAPacedCallWhoseCallersLeftStartsOneAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, g := abandonedPacedCall(t)
		time.Sleep(time.Millisecond)
		third := doAsync(t.Context(), g, time.Now())
		synctest.Wait()
		if f.count() != 2 {
			t.Fatalf("%d calls: a caller finding only an abandoned paced call waits for its pace", f.count())
		}
		time.Sleep(2 * time.Second) // the abandoned call's pace passes
		synctest.Wait()
		if f.count() != 2 {
			t.Fatalf("%d calls after the abandoned call's pace, want 2", f.count())
		}
		f.answer(t, 1, nil)
		if r := receive(t, third); r.err != nil {
			t.Fatal(r.err)
		}
	})
}
