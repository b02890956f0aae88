package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/proxy/limits"
	"github.com/podres-proxy/podres-proxy/proxy/metrics"
)

// sharedTimeout bounds a call that several callers wait for: a List's
// kubelet call plus, for a pod being created, the /pods read it waits for
// (itself bounded by kubeletpods.DefaultReadTimeout). Callers leave earlier
// on their own deadlines; the call goes on for the others.
const sharedTimeout = 30 * time.Second

// Shared lets concurrent callers of one method share its work: a kubelet
// call and what is built from it. Every caller must get an answer that
// started after it arrived (a List asked while a pod is being created must
// list it), so a caller never joins the call in flight, which may have
// started before it arrived; it joins the next one, which starts when the one
// in flight ends, together with everyone who arrived meanwhile. However many
// clients poll at once, the kubelet sees at most one call in flight per
// method, and most callers share one; its limit of 100 calls a second is
// shared with every other agent on the node. kubeletpods.Reader does the
// same for /pods reads.
//
// A call the rate limit refused (its context has a limits.Overdraft) never
// makes a kubelet call of its own. It joins the next call when one is in
// flight. When none is, it waits for the token its client could take next
// (at most 50 ms), and the call is made if others joined it meanwhile (a
// burst), with a caller within the limit arriving, or else refused: a client
// calling alone, one call after another, is refused as by the kubelet. A
// next call that only such calls wait for is made or refused in the same
// way. So the kubelet never sees more calls than the limit lets through.
//
// A shared call's error, the kubelet's code and message included, goes to
// every caller that shared it. A caller's own deadline or cancellation ends
// its wait, not a call others wait for; a call that nobody waits for any
// more is cancelled.
type Shared[T any] struct {
	method string
	// fn makes the call, with the time it started, which is after every
	// caller's arrival, and a context: the caller's when it has the call to
	// itself, the call's own (30 s) when others wait for it.
	fn      func(ctx context.Context, started time.Time) (T, error)
	metrics *metrics.Metrics

	mu   sync.Mutex
	cur  *flight[T] // the call in flight, if any
	next *flight[T] // the call that starts when cur ends, if anyone waits
}

// NewShared returns the shared calls of method (its name in errors and
// metrics), each made by fn.
func NewShared[T any](method string, fn func(ctx context.Context, started time.Time) (T, error), m *metrics.Metrics) *Shared[T] {
	return &Shared[T]{method: method, fn: fn, metrics: m}
}

// flight is one shared call and its callers.
type flight[T any] struct {
	started time.Time // when the call started: it saw nothing older
	waiters int       // callers still waiting
	paid    int       // waiters the rate limit let through
	callers int       // every caller that joined
	// overdraft is one of the refused waiters', to pay for the call when
	// no waiter within the limit is left.
	overdraft *limits.Overdraft
	cancel    context.CancelFunc
	done      chan struct{}
	val       T     // set before done is closed
	err       error // set before done is closed
}

// Do returns the result of a call that started after Do was called.
func (c *Shared[T]) Do(ctx context.Context) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, status.FromContextError(err).Err()
	}
	over := limits.OverdraftOf(ctx)
	c.mu.Lock()
	if c.cur == nil && c.next != nil {
		// Refused calls gather for a call (gather): join it; a caller
		// within the limit makes it now.
		f := c.next
		f.waiters++
		f.callers++
		if over == nil {
			f.paid++
			c.next = nil
			c.startLocked(f)
		}
		c.mu.Unlock()
		return c.wait(ctx, f, over)
	}
	if c.cur == nil && over != nil {
		// Refused by the limit, and no call to join: gather one.
		f := &flight[T]{done: make(chan struct{}), waiters: 1, callers: 1, overdraft: over}
		c.next = f
		c.mu.Unlock()
		c.gather(f, over)
		return c.wait(ctx, f, over)
	}
	if c.cur == nil {
		// Nothing in flight: this caller makes the call itself, in its own
		// goroutine and under its own deadline. Nobody else can join a call
		// in flight, so nobody else depends on it; those who arrive
		// meanwhile wait for the next, so it is bounded too, by a timer
		// that cancels it. (Another goroutine, or a deadline sent to the
		// kubelet with every call, made a steady List measurably slower.)
		f := &flight[T]{started: time.Now(), callers: 1, done: make(chan struct{})}
		c.cur = f
		c.mu.Unlock()
		callCtx, cancel := context.WithCancelCause(ctx)
		bound := time.AfterFunc(sharedTimeout, func() { cancel(c.timeoutCause()) })
		f.val, f.err = c.fn(callCtx, f.started)
		bound.Stop()
		f.err = c.timedOut(callCtx, f.err)
		cancel(nil)
		c.finish(f)
		return f.val, f.err
	}
	if c.next == nil {
		c.next = &flight[T]{done: make(chan struct{})}
	}
	f := c.next
	f.waiters++
	f.callers++
	if over == nil {
		f.paid++
	} else {
		f.overdraft = over
	}
	c.mu.Unlock()
	return c.wait(ctx, f, over)
}

// gather makes f, a call only refused callers wait for, with nothing in
// flight, once the token their client could take next is there, if others
// joined it meanwhile; else refuses it. A caller within the limit may start
// it before.
func (c *Shared[T]) gather(f *flight[T], over *limits.Overdraft) {
	delay, cancel, ok := over.Reserve()
	if ok && delay > 0 {
		t := time.NewTimer(delay) // at most 50 ms: the rate limit's own wait
		<-t.C
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.next != f {
		if ok {
			cancel() // a caller within the limit made the call
		}
		return
	}
	c.next = nil
	if ok && f.callers > 1 && f.waiters > 0 {
		c.startLocked(f)
		return
	}
	if ok {
		cancel()
	}
	c.refuseLocked(f)
}

// refuseLocked ends f, which nobody may pay for, with the rate limit's
// error. c.mu is held.
func (c *Shared[T]) refuseLocked(f *flight[T]) {
	f.err = limits.ErrRateLimited()
	for range f.waiters {
		c.metrics.RateLimited()
	}
	close(f.done)
}

// wait waits for f, which this caller joined, or for ctx.
func (c *Shared[T]) wait(ctx context.Context, f *flight[T], over *limits.Overdraft) (T, error) {
	var zero T
	select {
	case <-f.done:
		return f.val, f.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	f.waiters--
	if over == nil {
		f.paid--
	}
	if f.waiters == 0 && f.cancel != nil {
		f.cancel() // nobody waits for it any more
	}
	c.mu.Unlock()
	select {
	case <-f.done: // it ended as we gave up: the answer is there
		return f.val, f.err
	default:
		return zero, status.FromContextError(context.Cause(ctx)).Err()
	}
}

// timedOut turns the error of a call its timer cancelled into the
// DeadlineExceeded it is (the timer cancels, so gRPC reports Canceled).
func (c *Shared[T]) timedOut(ctx context.Context, err error) error {
	if err != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, context.Cause(ctx).Error())
	}
	return err
}

func (c *Shared[T]) timeoutCause() error {
	return fmt.Errorf("kubelet %s call took longer than %v: %w", c.method, sharedTimeout, context.DeadlineExceeded)
}

// startLocked makes f, a call that callers wait for, the call in flight
// and runs it in a goroutine of its own: it must go on when one of them
// gives up. c.mu is held.
func (c *Shared[T]) startLocked(f *flight[T]) {
	f.started = time.Now()
	ctx, cancel := context.WithTimeoutCause(context.Background(), sharedTimeout, c.timeoutCause())
	f.cancel = cancel
	c.cur = f
	go func() {
		f.val, f.err = c.fn(ctx, f.started)
		cancel()
		c.finish(f)
	}()
}

// finish ends the call in flight: it starts the next call if anyone waits
// for one, then hands f's result to its callers.
func (c *Shared[T]) finish(f *flight[T]) {
	c.mu.Lock()
	c.cur = nil
	if next := c.next; next != nil {
		c.next = nil
		switch {
		case next.waiters == 0:
		case next.paid == 0:
			// Only calls the limit refused wait: they gather for a token.
			c.next = next
			go c.gather(next, next.overdraft)
		default:
			c.startLocked(next)
		}
	}
	callers := f.callers
	c.mu.Unlock()
	close(f.done)
	c.metrics.Shared(c.method, callers-1)
}
