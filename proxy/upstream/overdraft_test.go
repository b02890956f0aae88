package upstream

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podres-proxy/podres-proxy/internal/coalesce"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
)

// refused returns the context the rate limit (100/s, burst 1, on clk)
// gives a call it refused, and which may join a shared call.
func refused(t *testing.T, clk *testingclock.FakeClock) context.Context {
	t.Helper()
	limit := limits.RateLimit(100, 1, clk)
	var got context.Context
	h := func(ctx context.Context, _ any) (any, error) { got = ctx; return nil, nil }
	for range 2 { // the first takes the only token
		if _, err := limit(t.Context(), nil, &grpc.UnaryServerInfo{}, h); err != nil {
			t.Fatal(err)
		}
	}
	if limits.OverdraftOf(got) == nil {
		t.Fatal("the second call was not refused")
	}
	return got
}

// A call the rate limit refused makes no kubelet call of its own: with
// nothing in flight it is refused, with a call in flight it joins the next,
// which the calls within the limit that wait for it pay for.
func TestACallBeyondTheLimitOnlyJoinsACallOthersMake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
		over := refused(t, clk)
		k := &kubelet{}
		s, _ := newTestShared(k)

		if _, err := do(over, s); !errors.Is(err, coalesce.ErrNotMade) {
			t.Fatalf("a refused call with nothing to join = %v, want ErrNotMade", err)
		}
		if k.count() != 0 {
			t.Fatalf("a refused call made %d kubelet calls", k.count())
		}

		first := doAsync(t.Context(), s)
		synctest.Wait()
		rider := doAsync(over, s)
		paying := doAsync(t.Context(), s)
		synctest.Wait()
		k.call(t, 0).answer <- nil
		time.Sleep(callInterval) // the next call's pace
		synctest.Wait()
		k.call(t, 1).answer <- nil
		for _, ch := range []<-chan result{first, rider, paying} {
			if r := <-ch; r.err != nil {
				t.Fatalf("caller: %v", r.err)
			}
		}
		if k.count() != 2 {
			t.Errorf("%d kubelet calls, want 2", k.count())
		}
	})
}

// Refused calls that gather while nothing is in flight, or that alone wait
// for the next call, share one call once their client's next token is there
// (a burst); a refused call alone is refused, as the kubelet would refuse a
// client calling one call after another.
func TestRefusedCallsThatGatherShareOneCallAndOneAloneIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
		over := refused(t, clk)
		k := &kubelet{}
		s, reg := newTestShared(k)

		// Nothing in flight: two gather, one call answers both.
		riders := []<-chan result{doAsync(over, s), doAsync(over, s)}
		synctest.Wait() // both wait for the token, 10 ms away
		if k.count() != 0 {
			t.Fatalf("%d kubelet calls before the token is there", k.count())
		}
		clk.Step(10 * time.Millisecond)
		time.Sleep(10 * time.Millisecond) // the bubble's clock: the token is there
		synctest.Wait()
		if k.count() != 1 {
			t.Fatalf("%d kubelet calls for two gathered refused calls, want 1", k.count())
		}
		k.call(t, 0).answer <- nil
		for _, ch := range riders {
			if r := <-ch; r.err != nil {
				t.Errorf("a gathered refused call: %v", r.err)
			}
		}

		// Riders of the next call, with nobody within the limit: the same.
		clk.Step(10 * time.Millisecond)
		first := doAsync(t.Context(), s)
		synctest.Wait()
		riders = []<-chan result{doAsync(over, s), doAsync(over, s)}
		synctest.Wait()
		k.call(t, 1).answer <- nil
		if r := <-first; r.err != nil {
			t.Fatal(r.err)
		}
		clk.Step(10 * time.Millisecond)
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if k.count() != 3 {
			t.Fatalf("%d kubelet calls, want the riders' own third", k.count())
		}
		k.call(t, 2).answer <- nil
		for _, ch := range riders {
			if r := <-ch; r.err != nil {
				t.Errorf("a rider of a call only riders wait for: %v", r.err)
			}
		}

		// One alone, with a call in flight or not: refused, no call.
		clk.Step(10 * time.Millisecond)
		first = doAsync(t.Context(), s)
		synctest.Wait()
		rider := doAsync(over, s)
		synctest.Wait()
		k.call(t, 3).answer <- nil
		if r := <-first; r.err != nil {
			t.Fatal(r.err)
		}
		if r := <-rider; !errors.Is(r.err, coalesce.ErrNotMade) {
			t.Errorf("a refused call alone in the next call = %v, want ErrNotMade", r.err)
		}
		if k.count() != 4 {
			t.Errorf("%d kubelet calls, want 4: none for the lone refused call", k.count())
		}
		if got := counter(t, reg, "podres_proxy_rate_limited_total"); got != 1 {
			t.Errorf("rate_limited_total = %v, want 1", got)
		}
	})
}

// counter is the value of an unlabelled counter of reg.
func counter(t *testing.T, reg interface {
	Gather() ([]*dto.MetricFamily, error)
}, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}
