package kubeletpods

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/podres-proxy/podres-proxy/model"
)

// The Reader tests run in synctest bubbles: synctest.Wait lets every
// goroutine reach the point where it blocks (a caller waiting for a read, a
// read waiting for its answer) without sleeps, and synctest.Test fails if a
// goroutine is left behind. Time for the Reader comes from a manual clock.

// fakeFetch is a kubelet whose every read waits for the test to answer it.
type fakeFetch struct {
	mu    sync.Mutex
	calls []*fetchCall
}

type fetchCall struct {
	ctx    context.Context
	answer chan fetchAnswer
}

type fetchAnswer struct {
	pods []model.KubeletPod
	err  error
}

func (f *fakeFetch) fetch(ctx context.Context) ([]model.KubeletPod, error) {
	c := &fetchCall{ctx: ctx, answer: make(chan fetchAnswer, 1)}
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
	select {
	case a := <-c.answer:
		return a.pods, a.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (f *fakeFetch) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// call returns the i-th read (from 0); it must have started.
func (f *fakeFetch) call(t *testing.T, i int) *fetchCall {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.calls) {
		t.Fatalf("read %d has not started (%d reads)", i+1, len(f.calls))
	}
	return f.calls[i]
}

// answerRead answers the i-th read with one pod whose uid names the read.
func (f *fakeFetch) answerRead(t *testing.T, i int) {
	t.Helper()
	f.call(t, i).answer <- fetchAnswer{pods: []model.KubeletPod{{UID: readUID(i), Namespace: "ns", Name: "pod"}}}
}

func readUID(i int) string { return fmt.Sprintf("read-%d", i+1) }

// result is what a ReadAfter call in a goroutine returned.
type result struct {
	snap *PodList
	err  error
}

func readAfterAsync(ctx context.Context, r *Reader, t time.Time) <-chan result {
	ch := make(chan result, 1)
	go func() {
		s, err := r.ReadAfter(ctx, t)
		ch <- result{s, err}
	}()
	return ch
}

// receive returns the result that ch must already hold.
func receive(t *testing.T, ch <-chan result) result {
	t.Helper()
	synctest.Wait()
	select {
	case res := <-ch:
		return res
	default:
		t.Fatal("ReadAfter has not returned")
		return result{}
	}
}

func assertWaiting(t *testing.T, ch <-chan result) {
	t.Helper()
	synctest.Wait()
	select {
	case res := <-ch:
		t.Fatalf("ReadAfter returned (%v, %v), want it still waiting", res.snap, res.err)
	default:
	}
}

func assertFromRead(t *testing.T, res result, i int) {
	t.Helper()
	if res.err != nil {
		t.Fatalf("got error %v, want read %d", res.err, i+1)
	}
	if got := res.snap.Pods[0].UID; got != readUID(i) {
		t.Fatalf("got the answer of %s, want %s", got, readUID(i))
	}
}

func newTestReader(f *fakeFetch, c *testingclock.FakeClock) *Reader {
	return NewReader(f.fetch, ReaderOptions{Clock: c, Timeout: time.Hour})
}

func TestReadAfterReadsWhenNoReadIsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		t0 := c.Now()

		ch := readAfterAsync(t.Context(), r, t0)
		assertWaiting(t, ch)
		f.answerRead(t, 0)
		res := receive(t, ch)
		assertFromRead(t, res, 0)
		if !res.snap.Started.Equal(t0) {
			t.Errorf("snapshot started at %v, want %v", res.snap.Started, t0)
		}
	})
}

func TestReadAfterReusesACompletedReadThatStartedAtOrAfterT(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		t0 := c.Now()
		ch := readAfterAsync(t.Context(), r, t0)
		synctest.Wait()
		f.answerRead(t, 0)
		first := receive(t, ch)
		c.Step(time.Second)

		for _, at := range []time.Time{t0.Add(-time.Minute), t0} {
			s, err := r.ReadAfter(t.Context(), at)
			if err != nil {
				t.Fatal(err)
			}
			if s != first.snap {
				t.Errorf("ReadAfter(%v) did not return the read that started at %v", at, t0)
			}
		}
		if f.count() != 1 {
			t.Errorf("%d reads, want 1", f.count())
		}

		// A query that arrived after that read started needs a new one.
		ch = readAfterAsync(t.Context(), r, t0.Add(time.Nanosecond))
		assertWaiting(t, ch)
		f.answerRead(t, 1)
		assertFromRead(t, receive(t, ch), 1)
	})
}

func TestCallerArrivingDuringAnOlderReadWaitsForTheNextRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)

		a := readAfterAsync(t.Context(), r, c.Now())
		synctest.Wait()
		c.Step(time.Second)
		t1 := c.Now()
		b := readAfterAsync(t.Context(), r, t1)
		assertWaiting(t, b)
		if f.count() != 1 {
			t.Fatalf("%d reads while the first is in flight, want 1", f.count())
		}

		f.answerRead(t, 0)
		assertFromRead(t, receive(t, a), 0)
		// The first read started before b arrived, so b must not get it:
		// the second read starts now, and b waits for it.
		assertWaiting(t, b)
		if f.count() != 2 {
			t.Fatalf("%d reads, want the second to have started", f.count())
		}
		f.answerRead(t, 1)
		res := receive(t, b)
		assertFromRead(t, res, 1)
		if res.snap.Started.Before(t1) {
			t.Errorf("b got a read that started at %v, before it arrived at %v", res.snap.Started, t1)
		}
	})
}

func TestCallerArrivingAfterTheReadInFlightStartedJoinsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		t0 := c.Now()
		a := readAfterAsync(t.Context(), r, t0)
		synctest.Wait()
		c.Step(time.Second)
		// b's query arrived at t0 (its t), when the read in flight started.
		b := readAfterAsync(t.Context(), r, t0)
		synctest.Wait()

		f.answerRead(t, 0)
		ra, rb := receive(t, a), receive(t, b)
		assertFromRead(t, ra, 0)
		assertFromRead(t, rb, 0)
		if ra.snap != rb.snap {
			t.Error("the two callers got different snapshots of one read")
		}
		if f.count() != 1 {
			t.Errorf("%d reads, want 1", f.count())
		}
	})
}

func TestConcurrentReadAfterCallsShareAtMostTwoReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		const callers = 64
		type call struct {
			at time.Time
			ch <-chan result
		}
		calls := make([]call, callers)
		for i := range calls {
			// Every query arrives a little after the one before, so all
			// but the first arrive after the first read started.
			c.Step(time.Millisecond)
			at := c.Now()
			calls[i] = call{at, readAfterAsync(t.Context(), r, at)}
		}
		synctest.Wait()
		for i := 0; i < f.count(); i++ {
			f.answerRead(t, i)
			synctest.Wait()
		}
		for i, cl := range calls {
			res := receive(t, cl.ch)
			if res.err != nil {
				t.Fatalf("caller %d: %v", i, res.err)
			}
			if res.snap.Started.Before(cl.at) {
				t.Errorf("caller %d arrived at %v and got a read that started at %v", i, cl.at, res.snap.Started)
			}
		}
		if f.count() > 2 {
			t.Errorf("%d callers caused %d reads, want at most 2", callers, f.count())
		}
	})
}

func TestFailedReadGivesItsErrorToAllWaitersAndIsNotRemembered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		t0 := c.Now()
		a := readAfterAsync(t.Context(), r, t0)
		b := readAfterAsync(t.Context(), r, t0)
		synctest.Wait()
		kubeletDown := errors.New("connection refused")
		f.call(t, 0).answer <- fetchAnswer{err: kubeletDown}
		for _, ch := range []<-chan result{a, b} {
			if res := receive(t, ch); !errors.Is(res.err, kubeletDown) || res.snap != nil {
				t.Errorf("got (%v, %v), want the read's error", res.snap, res.err)
			}
		}

		// The next caller, even one content with an old read, reads again.
		ch := readAfterAsync(t.Context(), r, t0.Add(-time.Hour))
		assertWaiting(t, ch)
		if f.count() != 2 {
			t.Fatalf("%d reads, want a new read after the failure", f.count())
		}
		f.answerRead(t, 1)
		assertFromRead(t, receive(t, ch), 1)
	})
}

func TestCallerLeavingDoesNotCancelTheSharedRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		t0 := c.Now()
		ctxA, cancelA := context.WithCancel(t.Context())
		a := readAfterAsync(ctxA, r, t0)
		b := readAfterAsync(t.Context(), r, t0)
		synctest.Wait()

		cancelA()
		if res := receive(t, a); !errors.Is(res.err, context.Canceled) {
			t.Fatalf("the caller that left got %v, want context.Canceled", res.err)
		}
		if err := f.call(t, 0).ctx.Err(); err != nil {
			t.Fatalf("the shared read was cancelled: %v", err)
		}
		assertWaiting(t, b)
		f.answerRead(t, 0)
		assertFromRead(t, receive(t, b), 0)

		// The read a caller left is still remembered for later callers.
		if s, err := r.ReadAfter(t.Context(), t0); err != nil || s.Pods[0].UID != readUID(0) || f.count() != 1 {
			t.Errorf("later caller got (%v, %v) after %d reads, want the first read", s, err, f.count())
		}
	})
}

func TestNextReadIsNotStartedWhenAllItsCallersLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		a := readAfterAsync(t.Context(), r, c.Now())
		synctest.Wait()
		ctxB, cancelB := context.WithCancel(t.Context())
		c.Step(time.Second)
		b := readAfterAsync(ctxB, r, c.Now())
		synctest.Wait()
		cancelB()
		if res := receive(t, b); !errors.Is(res.err, context.Canceled) {
			t.Fatalf("got %v, want context.Canceled", res.err)
		}

		f.answerRead(t, 0)
		assertFromRead(t, receive(t, a), 0)
		synctest.Wait()
		if f.count() != 1 {
			t.Errorf("%d reads, want no read for callers that left", f.count())
		}
	})
}

func TestReadAfterWithADoneContextStartsNoRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := r.ReadAfter(ctx, c.Now()); !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
		synctest.Wait()
		if f.count() != 0 {
			t.Errorf("%d reads, want none", f.count())
		}
	})
}

func TestReadThatHangsEndsAtTheReaderTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeFetch{}
		m := &readMetrics{}
		r := NewReader(f.fetch, ReaderOptions{Timeout: 3 * time.Second, Metrics: m})
		start := time.Now()
		// Nobody answers: the bubble's clock runs to the timeout.
		_, err := r.ReadAfter(t.Context(), start)
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "longer than 3s") {
			t.Errorf("got %v, want a timeout that names 3s", err)
		}
		if waited := time.Since(start); waited != 3*time.Second {
			t.Errorf("waited %v, want 3s", waited)
		}
		if reads := m.seen(); len(reads) != 1 || reads[0].err == nil {
			t.Errorf("Metrics saw %v, want one failed read", reads)
		}
	})
}

// readMetrics records what a Reader reports.
type readMetrics struct {
	mu    sync.Mutex
	reads []seenRead
}

type seenRead struct {
	d   time.Duration
	err error
}

func (m *readMetrics) PodsRead(d time.Duration, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads = append(m.reads, seenRead{d, err})
}

func (m *readMetrics) seen() []seenRead {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.reads)
}

func TestMetricsAreToldTheDurationAndOutcomeOfEveryRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		m := &readMetrics{}
		r := NewReader(f.fetch, ReaderOptions{Clock: c, Metrics: m})
		ch := readAfterAsync(t.Context(), r, c.Now())
		synctest.Wait()
		c.Step(40 * time.Millisecond)
		f.answerRead(t, 0)
		receive(t, ch)

		boom := errors.New("boom")
		ch = readAfterAsync(t.Context(), r, c.Now())
		synctest.Wait()
		c.Step(10 * time.Millisecond)
		f.call(t, 1).answer <- fetchAnswer{err: boom}
		receive(t, ch)

		reads := m.seen()
		want := []seenRead{{40 * time.Millisecond, nil}, {10 * time.Millisecond, boom}}
		if len(reads) != 2 || reads[0] != want[0] || reads[1] != want[1] {
			t.Errorf("Metrics saw %v, want %v", reads, want)
		}
	})
}

func TestReadAfterATimeInTheFutureReadsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, c := &fakeFetch{}, testingclock.NewFakeClock(time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC))
		r := newTestReader(f, c)
		ch := readAfterAsync(t.Context(), r, c.Now().Add(time.Hour))
		synctest.Wait()
		f.answerRead(t, 0)
		assertFromRead(t, receive(t, ch), 0)
		if f.count() != 1 {
			t.Errorf("%d reads, want 1", f.count())
		}
	})
}

func kubeletPod(ns, name, uid, phase string) model.KubeletPod {
	return model.KubeletPod{Namespace: ns, Name: name, UID: uid, Phase: phase}
}

func TestLookupPrefersAPodThatIsNotFinished(t *testing.T) {
	key := model.PodKey{Namespace: "ns", Name: "db-0"}
	for _, pods := range [][]model.KubeletPod{
		// Oldest first: a finished predecessor and a new pod being created.
		{kubeletPod("ns", "db-0", "old", "Failed"), kubeletPod("ns", "db-0", "new", "Pending")},
		// A running pod beside a newer one that already finished.
		{kubeletPod("ns", "db-0", "new", "Running"), kubeletPod("ns", "db-0", "old", "Succeeded")},
	} {
		for _, s := range []*PodList{NewPodList(time.Time{}, pods)} {
			got, ok := s.Lookup(key)
			if !ok || got.UID != "new" {
				t.Errorf("Lookup in %v = %v, %v; want the pod that is not finished", pods, got, ok)
			}
		}
	}
}

func TestLookupPrefersTheNewestOfPodsInTheSameState(t *testing.T) {
	key := model.PodKey{Namespace: "ns", Name: "db-0"}
	for _, pods := range [][]model.KubeletPod{
		{kubeletPod("ns", "db-0", "old", "Running"), kubeletPod("ns", "other", "x", "Running"), kubeletPod("ns", "db-0", "new", "Pending")},
		{kubeletPod("ns", "db-0", "old", "Succeeded"), kubeletPod("ns", "db-0", "new", "Failed")},
	} {
		for _, s := range []*PodList{NewPodList(time.Time{}, pods)} {
			got, ok := s.Lookup(key)
			if !ok || got.UID != "new" {
				t.Errorf("Lookup in %v = %v, %v; want the newest", pods, got, ok)
			}
		}
	}
}

func TestLookupOfAPodNotListedFindsNothing(t *testing.T) {
	pods := []model.KubeletPod{kubeletPod("ns", "a", "1", "Running"), kubeletPod("other", "b", "2", "Running")}
	for _, s := range []*PodList{NewPodList(time.Time{}, pods)} {
		for _, key := range []model.PodKey{{Namespace: "ns", Name: "b"}, {Namespace: "other", Name: "a"}} {
			if got, ok := s.Lookup(key); ok {
				t.Errorf("Lookup(%v) = %v, want nothing", key, got)
			}
		}
		if got, ok := s.Lookup(model.PodKey{Namespace: "other", Name: "b"}); !ok || got.UID != "2" {
			t.Errorf("Lookup(other/b) = %v, %v; want uid 2", got, ok)
		}
	}
}

// A caller that arrives while a read hangs waits for the next read; when
// that one hangs too, the caller must still wait no more than one timeout
// in all, not the rest of the first read plus a whole second one.
func TestCallerBehindAHungReadWaitsAtMostOneTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeFetch{}
		const timeout = 3 * time.Second
		r := NewReader(f.fetch, ReaderOptions{Timeout: timeout})
		first := make(chan error, 1)
		go func() {
			_, err := r.ReadAfter(t.Context(), time.Now())
			first <- err
		}()
		synctest.Wait() // the first read is in flight, and hangs
		time.Sleep(time.Second)
		arrived := time.Now()
		_, err := r.ReadAfter(t.Context(), arrived)
		if err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("caller behind a hung read: got %v, want a timeout", err)
		}
		if waited := time.Since(arrived); waited > timeout {
			t.Errorf("caller behind a hung read waited %v, want at most the timeout of %v", waited, timeout)
		}
		<-first
	})
}

// Counted counts the reads that succeeded, and no failed one.
func TestCountedCountsOnlyTheReadsThatSucceeded(t *testing.T) {
	fail := true
	var count int
	fetch := Counted(func(context.Context) ([]model.KubeletPod, error) {
		if fail {
			return nil, errors.New("kubelet down")
		}
		return []model.KubeletPod{{UID: "uid-a"}}, nil
	}, func() { count++ })
	if _, err := fetch(context.Background()); err == nil || count != 0 {
		t.Fatalf("a failed read: error %v, counted %d, want the error and 0", err, count)
	}
	fail = false
	if pods, err := fetch(context.Background()); err != nil || len(pods) != 1 || count != 1 {
		t.Fatalf("a read: %v, %v, counted %d, want the pod and 1", pods, err, count)
	}
}
