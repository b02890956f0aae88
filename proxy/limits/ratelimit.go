package limits

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"
)

// The kubelet's PodResources rate limit: one token bucket for the whole
// endpoint, every method and API version.
const (
	DefaultRateLimitQPS   = 100
	DefaultRateLimitBurst = 10
)

// errRateLimited is the kubelet's exact error, so clients that test for it
// with errors.Is (same code and message) behave the same behind the proxy.
var errRateLimited = status.Error(codes.ResourceExhausted, "rejected by rate limit")

// activeWindow is how long a client counts as active after its last call:
// the rate is shared among the clients active in the last activeWindow.
const activeWindow = 10 * time.Second

// fairLimiter is the kubelet's rate limit shared fairly between clients.
//
// The kubelet has one bucket for everyone, so behind it one client's flood
// starves every other client. Here every call takes a token from one bucket
// with the kubelet's own numbers, so the proxy never lets calls through
// faster than the kubelet would; and each client (a process, see peerCred)
// also has a bucket of its own whose rate is an equal share of the limit
// among the clients active lately, with the full burst. That bucket does
// not limit a client by itself, which would make a lone client slower
// than the kubelet lets it be whenever short-lived clients (a Kata shim per
// pod, a CLI) came by: it says whether the client is within its share. A
// call within its share may take any token of the shared bucket, waiting up
// to maxGlobalWait for one; a call beyond its share only takes a token while
// the shared bucket holds more than reserve, and only while another client
// called within contendWindow. A flooding client thus keeps the bucket at
// the reserve, and a polite one keeps finding tokens there; a client that
// calls alone, in bursts or not, is limited exactly as the kubelet would.
type fairLimiter struct {
	qps     float64
	burst   int
	reserve float64 // tokens of the shared bucket left to clients within their share
	clock   clock.PassiveClock

	mu        sync.Mutex
	global    *rate.Limiter
	clients   map[string]*clientBucket
	share     rate.Limit // the per-client rate for len(clients)
	lastPrune time.Time
}

type clientBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newFairLimiter(qps float64, burst int, clk clock.PassiveClock) *fairLimiter {
	if burst < 1 {
		burst = 1
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &fairLimiter{
		qps:     qps,
		burst:   burst,
		reserve: float64(burst) / 2,
		clock:   clk,
		global:  rate.NewLimiter(rate.Limit(qps), burst),
		clients: make(map[string]*clientBucket),
	}
}

// maxGlobalWait bounds how long a call within its client's share waits for
// a token of the shared bucket. A client that flooded alone may have
// emptied it just before another arrived; a token comes back within
// 1/qps, and waiting for it beats refusing the newcomer's first call.
const maxGlobalWait = 50 * time.Millisecond

// allow reports whether client may make a call, and after how long: a call
// within its client's share waits briefly for a token of the shared bucket
// rather than being refused.
func (f *fairLimiter) allow(client string) (bool, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	if now.Sub(f.lastPrune) >= time.Second {
		f.lastPrune = now
		for k, c := range f.clients {
			if now.Sub(c.seen) > activeWindow {
				delete(f.clients, k)
			}
		}
	}
	c, ok := f.clients[client]
	if !ok {
		c = &clientBucket{lim: rate.NewLimiter(f.share, f.burst)}
		f.clients[client] = c
	}
	c.seen = now
	if share := rate.Limit(f.qps / float64(len(f.clients))); share != f.share {
		f.share = share
		for _, b := range f.clients {
			b.lim.SetLimitAt(now, share)
		}
	}
	if !c.lim.AllowN(now, 1) {
		return f.beyondShareLocked(c, now), 0
	}
	r := f.global.ReserveN(now, 1)
	if !r.OK() {
		return false, 0
	}
	d := r.DelayFrom(now)
	if d > maxGlobalWait {
		r.CancelAt(now)
		return false, 0
	}
	return true, d
}

// beyondShareLocked reports whether client c, beyond its share, may take a
// token of the shared bucket, and takes it: while another client is calling
// too, only from what the reserve leaves over, and never by waiting; alone,
// as the kubelet would. f.mu is held.
func (f *fairLimiter) beyondShareLocked(c *clientBucket, now time.Time) bool {
	reserve := 0.0
	if f.othersCalledSince(c, now.Add(-contendWindow)) {
		reserve = f.reserve
	}
	return f.global.TokensAt(now) >= reserve+1 && f.global.AllowN(now, 1)
}

// reserveBeyondShare reserves a token for client's call beyond its share,
// one that comes back within maxGlobalWait and leaves the reserve then, as
// beyondShareLocked would: it returns how long until it is there, and a func
// that gives it back.
func (f *fairLimiter) reserveBeyondShare(client string) (time.Duration, func(), bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.clients[client]
	if !ok {
		return 0, nil, false
	}
	now := f.clock.Now()
	reserve := 0.0
	if f.othersCalledSince(c, now.Add(-contendWindow)) {
		reserve = f.reserve
	}
	if f.global.TokensAt(now.Add(maxGlobalWait)) < reserve+1 {
		return 0, nil, false
	}
	r := f.global.ReserveN(now, 1)
	if !r.OK() {
		return 0, nil, false
	}
	d := r.DelayFrom(now)
	if d > maxGlobalWait {
		r.CancelAt(now)
		return 0, nil, false
	}
	return d, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		r.CancelAt(f.clock.Now())
	}, true
}

// contendWindow is how recently another client must have called for a
// client beyond its share to leave it the reserve.
const contendWindow = time.Second

// othersCalledSince reports whether a client other than c called at or
// after t. The clients are the few processes that called in the last
// activeWindow. f.mu is held.
func (f *fairLimiter) othersCalledSince(c *clientBucket, t time.Time) bool {
	for _, o := range f.clients {
		if o != c && !o.seen.Before(t) {
			return true
		}
	}
	return false
}

// Overdraft marks the context of a call beyond the rate limit: the
// interceptor (RateLimit) lets it through with one rather than refusing
// it, and the handler refuses it (ErrRateLimited) unless it can join a
// kubelet call made for others (upstream.Shared), which costs the kubelet
// nothing; the limit exists to protect the kubelet. It is the Ticket such a
// call joins with (coalesce.Ticket).
type Overdraft struct {
	l      *fairLimiter
	client string
}

// Reserve takes, for a kubelet call that only calls beyond the limit wait
// for, a token as the client's call beyond its share would, one that comes
// back within 50 ms while they gather: it returns how long until it is
// there, and cancel, which gives it back when the call is not made. So the
// kubelet never sees more calls than the limit lets through, and a client
// flooding with many calls at once leaves other clients their reserve.
func (o *Overdraft) Reserve() (delay time.Duration, cancel func(), ok bool) {
	return o.l.reserveBeyondShare(o.client)
}

type overdraftKey struct{}

// OverdraftOf returns the Overdraft of a call beyond the rate limit, nil
// for a call within it.
func OverdraftOf(ctx context.Context) *Overdraft {
	o, _ := ctx.Value(overdraftKey{}).(*Overdraft)
	return o
}

// ErrRateLimited returns the kubelet's rate-limit error (ResourceExhausted,
// "rejected by rate limit"): the answer to a call beyond the limit that
// found no kubelet call to join (proxy.shared): every call the rate limit
// refuses gets it, and no other.
func ErrRateLimited() error { return errRateLimited }

// RateLimit returns an interceptor that applies the kubelet's rate limit
// (qps with burst, shared fairly between clients: fairLimiter) by marking,
// never refusing. A call the limiter allows (within its client's share, or
// from what the shared bucket has to spare) reaches its handler after a
// wait of at most maxGlobalWait for a token; any other reaches it at once
// with an Overdraft in its context, and the handler decides: it refuses it
// (ErrRateLimited) unless a kubelet call others made answers it. A call
// whose context ends while it waits fails with the context's code. qps <= 0
// disables it; clk nil means the real clock. So a burst of calls (a Kata
// shim or Multus per pod being created) costs one or two kubelet calls and
// none is refused, while a client that floods one call after another is
// refused as by the kubelet. It counts nothing: a refusal is counted by
// upstream.Shared.Do, which learns of it (coalesce.ErrNotMade).
func RateLimit(qps float64, burst int, clk clock.PassiveClock) grpc.UnaryServerInterceptor {
	if qps <= 0 {
		return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			return h(ctx, req)
		}
	}
	l := newFairLimiter(qps, burst, clk)
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		client := clientKey(ctx)
		ok, wait := l.allow(client)
		if !ok {
			return h(context.WithValue(ctx, overdraftKey{}, &Overdraft{l: l, client: client}), req)
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		return h(ctx, req)
	}
}
