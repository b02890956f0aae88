package upstream

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/internal/coalesce"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
)

// These tests run in synctest bubbles: synctest.Wait lets every caller reach
// the point where it waits for a call, so each step happens in a known
// order without sleeps or hooks in Shared.

// do is Do as the server calls it for the call of ctx: arrived then, with
// the Overdraft the rate limit gave it, if any (a refused call that joined
// nothing gets coalesce.ErrNotMade, which the server answers as the
// kubelet's rate-limit error).
func do[T any](ctx context.Context, s *Shared[T]) (T, error) {
	var ticket coalesce.Ticket
	if o := limits.OverdraftOf(ctx); o != nil {
		ticket = o
	}
	return s.Do(ctx, limits.Arrived(ctx), ticket)
}

// kubelet is a fake call whose every call waits for the test to answer it.
type kubelet struct {
	mu    sync.Mutex
	calls []*call
}

type call struct {
	ctx     context.Context
	started time.Time
	answer  chan error
}

func (k *kubelet) fn(ctx context.Context, started time.Time) (time.Time, error) {
	c := &call{ctx: ctx, started: started, answer: make(chan error, 1)}
	k.mu.Lock()
	k.calls = append(k.calls, c)
	k.mu.Unlock()
	select {
	case err := <-c.answer:
		return started, err
	case <-ctx.Done():
		return started, ctx.Err()
	}
}

func (k *kubelet) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.calls)
}

func (k *kubelet) call(t *testing.T, i int) *call {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if i >= len(k.calls) {
		t.Fatalf("call %d has not started (%d calls)", i+1, len(k.calls))
	}
	return k.calls[i]
}

type result struct {
	started time.Time // when the call the caller got started
	err     error
}

func doAsync(ctx context.Context, s *Shared[time.Time]) <-chan result {
	ch := make(chan result, 1)
	go func() {
		started, err := do(ctx, s)
		ch <- result{started, err}
	}()
	return ch
}

func newTestShared(k *kubelet) (*Shared[time.Time], *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return NewShared("List", k.fn, metrics.New(reg)), reg
}

func TestCallersArrivingDuringACallShareTheNextOneWhichStartsAfterThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := &kubelet{}
		s, reg := newTestShared(k)
		first := doAsync(t.Context(), s)
		synctest.Wait()
		time.Sleep(time.Second) // the bubble's clock: later callers arrive after the call started
		arrived := time.Now()
		const n = 8
		var later []<-chan result
		for range n {
			later = append(later, doAsync(t.Context(), s))
		}
		synctest.Wait()
		if k.count() != 1 {
			t.Fatalf("%d calls while the first is in flight, want 1", k.count())
		}
		k.call(t, 0).answer <- nil // it started a second ago: the next starts at once
		synctest.Wait()
		if r := <-first; r.err != nil {
			t.Fatalf("first caller: %v", r.err)
		}
		if k.count() != 2 {
			t.Fatalf("%d calls after the first ended, want the next to have started for the %d waiting", k.count(), n)
		}
		k.call(t, 1).answer <- nil
		for _, ch := range later {
			r := <-ch
			if r.err != nil {
				t.Fatalf("later caller: %v", r.err)
			}
			if r.started.Before(arrived) {
				t.Errorf("a caller got a call that started at %v, before it arrived at %v", r.started, arrived)
			}
		}
		if got := sharedCount(t, reg); got != n-1 {
			t.Errorf("shared calls metric = %v, want %d (callers beyond the first of the shared call)", got, n-1)
		}
	})
}

// Callers that keep a method busy are served by at most one kubelet call
// per 10 ms (the kubelet's 100 calls a second), not by calls back to back.
func TestTheCallsOfABusyMethodFollowEachOtherAtTheKubeletsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := &kubelet{}
		s, _ := newTestShared(k)
		first := doAsync(t.Context(), s)
		synctest.Wait()
		time.Sleep(time.Millisecond)
		second := doAsync(t.Context(), s)
		synctest.Wait()
		k.call(t, 0).answer <- nil // a call of 1 ms
		synctest.Wait()
		<-first
		time.Sleep(callInterval / 2)
		third := doAsync(t.Context(), s) // arrives while the next call waits for its pace
		synctest.Wait()
		if k.count() != 1 {
			t.Fatalf("the next call started %v after the first, want %v", k.call(t, 1).started.Sub(k.call(t, 0).started), callInterval)
		}
		time.Sleep(callInterval)
		synctest.Wait()
		if k.count() != 2 {
			t.Fatalf("%d calls once the pace passed, want 2", k.count())
		}
		if gap := k.call(t, 1).started.Sub(k.call(t, 0).started); gap != callInterval {
			t.Errorf("the next call started %v after the first, want %v", gap, callInterval)
		}
		k.call(t, 1).answer <- nil
		for _, ch := range []<-chan result{second, third} {
			if r := <-ch; r.err != nil || !r.started.Equal(k.call(t, 1).started) {
				t.Errorf("a waiting caller got a call started at %v (%v), want the paced one", r.started, r.err)
			}
		}
	})
}

// sharedCount is the value of the shared calls counter.
func sharedCount(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "podres_proxy_upstream_shared_calls_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func TestASharedCallsErrorGoesToEveryCallerAndACallerMayLeave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := &kubelet{}
		s, _ := newTestShared(k)
		first := doAsync(t.Context(), s)
		synctest.Wait()
		const n = 3
		var waiting []<-chan result
		for range n {
			waiting = append(waiting, doAsync(t.Context(), s))
		}
		leaving, leave := context.WithCancel(t.Context())
		left := doAsync(leaving, s)
		synctest.Wait()
		leave()
		synctest.Wait()
		if r := <-left; status.Code(r.err) != codes.Canceled {
			t.Errorf("a caller that gave up got %v, want Canceled", r.err)
		}

		k.call(t, 0).answer <- nil
		time.Sleep(callInterval) // the next call's pace
		synctest.Wait()
		if r := <-first; r.err != nil {
			t.Errorf("the call in flight: %v", r.err)
		}
		refused := status.Error(codes.ResourceExhausted, "rejected by rate limit")
		next := k.call(t, 1)
		if next.ctx.Err() != nil {
			t.Fatalf("the call others wait for was cancelled when one caller left")
		}
		next.answer <- refused
		for _, ch := range waiting {
			r := <-ch
			if st, _ := status.FromError(r.err); st.Code() != codes.ResourceExhausted || st.Message() != "rejected by rate limit" {
				t.Errorf("a caller of the shared call got %v, want the kubelet's ResourceExhausted: rejected by rate limit", r.err)
			}
		}
	})
}

func TestACallNobodyWaitsForAnyMoreIsCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := &kubelet{}
		s, _ := newTestShared(k)
		first := doAsync(t.Context(), s)
		synctest.Wait()
		leaving, leave := context.WithCancel(t.Context())
		left := doAsync(leaving, s)
		synctest.Wait()
		k.call(t, 0).answer <- nil
		time.Sleep(callInterval) // the next call's pace
		synctest.Wait()
		<-first
		next := k.call(t, 1)
		leave()
		synctest.Wait()
		<-left
		if next.ctx.Err() == nil {
			t.Errorf("the call its only caller gave up on goes on")
		}
	})
}

func TestASharedCallThatHangsEndsWithDeadlineExceeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := &kubelet{}
		s, _ := newTestShared(k)
		first := doAsync(t.Context(), s)
		synctest.Wait()
		second := doAsync(t.Context(), s)
		time.Sleep(sharedTimeout) // the bubble's clock
		synctest.Wait()
		if r := <-first; status.Code(r.err) != codes.DeadlineExceeded {
			t.Errorf("a call that hung got %v, want DeadlineExceeded", r.err)
		}
		time.Sleep(sharedTimeout)
		synctest.Wait()
		if r := <-second; r.err == nil {
			t.Errorf("the shared call that hung answered no error")
		}
	})
}

// sharedUnderLoad models clients that poll through Shared in a closed loop:
// slots callers at once (a connection's stream cap, or as many
// connections), each calling again once its answer reached it, the answers
// of one call reaching their callers one after another over write (as the
// answers of one HTTP/2 connection are written in turn). Every call of the
// kubelet takes callTime. It returns the kubelet calls per answer served,
// and fails the test when a caller got an answer from a call that started
// before it arrived. Time is the synctest bubble's: the sleeps are the
// model's durations, not synchronization.
func sharedUnderLoad(t *testing.T, slots, rounds int, callTime, write time.Duration) float64 {
	var calls int
	var mu sync.Mutex
	s := NewShared("List", func(ctx context.Context, started time.Time) (time.Time, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		time.Sleep(callTime)
		return started, nil
	}, metrics.New(prometheus.NewRegistry()))
	var wg sync.WaitGroup
	for slot := range slots {
		wg.Go(func() {
			// The slots start staggered too: clients do not arrive at once.
			time.Sleep(time.Duration(slot) * write / time.Duration(slots))
			for range rounds {
				arrived := time.Now()
				started, err := do(t.Context(), s)
				if err != nil {
					t.Error(err)
					return
				}
				if started.Before(arrived) {
					t.Errorf("a caller that arrived at %v got a call that started at %v", arrived, started)
				}
				// Its answer reaches it after those written before it.
				time.Sleep(time.Duration(slot+1) * write / time.Duration(slots))
			}
		})
	}
	wg.Wait()
	return float64(calls) / float64(slots*rounds)
}

// TestCallersArrivingStaggeredShareCallsAsManyAsArriveDuringOne shows what
// a caller's joining only the next call costs when callers arrive one after
// another rather than at once: a call serves those who arrived while the
// previous one was in flight. With 64 callers that is a small fraction of
// a call each; with 8 at once (what one connection carried before
// limits.Unread) no call can serve more than 8, so at least 1/8 of a call
// each, and with the answers written in turn about a third of a call each.
func TestCallersArrivingStaggeredShareCallsAsManyAsArriveDuringOne(t *testing.T) {
	const callTime, write = time.Millisecond, time.Millisecond
	for _, c := range []struct {
		slots    int
		min, max float64 // kubelet calls per answer served
	}{
		{slots: 64, min: 1.0 / 64, max: 0.1},
		{slots: 8, min: 1.0 / 8, max: 0.5},
	} {
		synctest.Test(t, func(t *testing.T) {
			got := sharedUnderLoad(t, c.slots, 20, callTime, write)
			t.Logf("%d callers arriving staggered: %.3f kubelet calls per answer", c.slots, got)
			if got < c.min || got > c.max {
				t.Errorf("%d callers arriving staggered: %.3f kubelet calls per answer, want %.3f to %.3f", c.slots, got, c.min, c.max)
			}
		})
	}
}
