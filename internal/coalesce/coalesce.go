// Package coalesce lets concurrent callers share one call of a function
// while each still gets a result fresh enough for it: the primitive behind
// the kubelet client's shared PodResources calls (proxy/upstream) and the
// shared /pods reads (kubeletpods.Reader).
//
// The contract. Every caller names a time, after (normally when its query
// arrived), and gets the result of a call that started strictly after it
// (a call that started at the same clock reading may have started first).
// At most one call of a Group is in flight. A caller joins the call in
// flight when that call started after its after (never when after is now);
// otherwise it waits for the next call, which starts when the one in flight
// ends (and, with Options.MinInterval, no sooner than that after the one in
// flight started), shared by every caller that arrived meanwhile; so each
// caller waits for at most two calls. A call's result, error included, goes
// to every caller waiting for it when it ends; a result without error is
// kept until the next call starts, for a caller who arrived before the call
// started but asks only after it ended (its query had reached the daemon in
// time). Each
// call runs in a goroutine of its own, under a context that no caller's
// cancellation reaches: a caller whose context ends stops waiting at once,
// with an error wrapping its context's error and cause, and the call goes
// on for the others; a call that no caller waits for any more is cancelled,
// and a next call nobody waits for is never started. Every call has a
// deadline, Timeout after its first caller began waiting, so that no caller
// waits longer than Timeout in all, even behind a call that hung; a call
// whose deadline passed before it could start ends with
// context.DeadlineExceeded without being made. A panic in the function is
// re-raised, as a *PanicError, in every caller that was waiting for the
// call when it panicked, or in the call's own goroutine when none was (it
// is never swallowed); the Group goes on with the next call.
//
// Join is Do for a caller that may share a call but must not cause one (a
// call beyond the rate limit, see limits.Overdraft): it joins a call that
// others wait for, and with none to join it gathers riders like itself for
// the time its Ticket says; the call is then made only if its Ticket allowed
// it and another caller joined, otherwise its riders get ErrNotMade. A
// caller of Do who arrives meanwhile makes the call at once, and the riders
// share it.
package coalesce

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Func makes one call. started is when the call started, as the Group's
// clock tells: every caller that gets the result named an earlier time.
type Func[T any] func(ctx context.Context, started time.Time) (T, error)

// Options configure a Group.
type Options struct {
	// Name says what a call is, in errors ("kubelet pods read").
	Name string
	// Timeout bounds every caller's wait for a call, and so every call
	// (see the package doc). It must be positive.
	Timeout time.Duration
	// Clock tells when calls start; nil means the real clock. Deadlines
	// are the real clock's whatever Clock is.
	Clock clock.PassiveClock
	// MinInterval paces calls that callers keep asking for: a next call
	// that a caller who pays (Do) waited for while another ran starts no
	// sooner than MinInterval after the call before it started, and the
	// callers who arrive meanwhile share it. Callers that keep a method
	// busy are then served by one call per MinInterval however short calls
	// are, each waiting at most MinInterval longer; a caller that finds no
	// call in flight or waiting for its pace is never delayed. A call only
	// riders wait for is paced by their Ticket instead. Zero: next calls
	// start at once.
	MinInterval time.Duration
	// Shared, when set, is told how many callers beyond the first get a
	// call's result: when the call ends, before they get it, those that
	// waited for it; then one for each caller that takes it once it ended
	// (see Group.last). For metrics; it must not block.
	Shared func(others int)
}

// Ticket is what a rider (Join) pays for a call only riders wait for with.
type Ticket interface {
	// Reserve reserves the right to make a call: how long until it may be
	// made, and cancel, which gives the reservation back when the call is
	// not made; ok is false when no call may be made.
	Reserve() (delay time.Duration, cancel func(), ok bool)
}

// ErrNotMade is the error of riders whose call was not made: their Ticket
// did not allow it, or no other caller joined them.
var ErrNotMade = errors.New("no call to join")

// PanicError is what a caller panics with when the call it waited for
// panicked.
type PanicError struct {
	Value any    // what the function panicked with
	Stack []byte // the call's goroutine's stack when it panicked
}

func (p *PanicError) Error() string {
	return fmt.Sprintf("panic in a shared call: %v\n\n%s", p.Value, p.Stack)
}

// Group shares the calls of one function between its callers. Its zero
// value is not usable; use New.
type Group[T any] struct {
	fn    Func[T]
	opts  Options
	clock clock.PassiveClock

	mu   sync.Mutex
	cur  *call[T] // the call in flight, if any
	next *call[T] // the call that starts after cur, or that riders gather for
	// last is the call that ended last, while no call is in flight, if it
	// succeeded: a caller who arrived before it started takes its result
	// instead of waiting for a call of its own (a caller whose query
	// arrived in time but who asks once the call ended: a Get that read
	// /pods first, one whose goroutine ran late). Cleared when the next
	// call starts, so a result is kept no longer than its waiters hold it.
	last *call[T]
}

// call is one call of fn and the callers waiting for it.
type call[T any] struct {
	started time.Time // zero until it starts
	paced   bool      // a next call waiting for MinInterval to pass
	// cut: its context ended while fn ran (nobody waited any more, or its
	// deadline passed), so that its result, even without error, may be
	// fn's reaction to that and is kept for no later caller.
	cut      bool
	deadline time.Time // Timeout after its first caller began waiting
	waiters  int       // callers waiting for it
	payers   int       // waiters that called Do
	joined   int       // every caller that joined it, waiting or not
	ticket   Ticket    // a rider's, for a call only riders wait for
	cancel   context.CancelFunc
	done     chan struct{}
	// Set before done is closed.
	val      T
	err      error
	panicked *PanicError
}

// New returns the Group of fn.
func New[T any](fn Func[T], opts Options) *Group[T] {
	if opts.Timeout <= 0 {
		panic("coalesce: Options.Timeout must be positive")
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Group[T]{fn: fn, opts: opts, clock: clk}
}

// Do returns the result of a call that started after after.
func (g *Group[T]) Do(ctx context.Context, after time.Time) (T, error) {
	return g.do(ctx, after, nil)
}

// Join returns the result of a call that started after after and
// that another caller made it wait for; with none, ErrNotMade (see the
// package doc).
func (g *Group[T]) Join(ctx context.Context, after time.Time, t Ticket) (T, error) {
	if t == nil {
		panic("coalesce: Join without a Ticket")
	}
	return g.do(ctx, after, t)
}

func (g *Group[T]) do(ctx context.Context, after time.Time, ticket Ticket) (T, error) {
	if ctx.Err() != nil {
		var zero T
		return zero, g.gaveUp(ctx)
	}
	pays := ticket == nil
	gather := false
	g.mu.Lock()
	now := g.clock.Now()
	if n := g.next; n != nil && n.paced && n.waiters == 0 {
		g.next = nil // its callers all left: it is not waited for
	}
	var c *call[T]
	switch {
	case g.cur == nil && g.last != nil && g.last.started.After(after):
		c = g.last
		g.mu.Unlock()
		if g.opts.Shared != nil {
			g.opts.Shared(1)
		}
		return c.result()
	case g.cur != nil && g.cur.started.After(after):
		c = g.cur
	case g.cur != nil:
		if g.next == nil {
			g.next = g.newCall(now)
		}
		c = g.next
	case g.next != nil && g.next.paced:
		c = g.next // it starts when the pace allows
	case g.next != nil:
		// Riders gather for a call; one who pays makes it now.
		c = g.next
		if pays {
			g.next = nil
			g.startLocked(c)
		}
	case pays:
		c = g.newCall(now)
		g.startLocked(c)
	default:
		c = g.newCall(now)
		g.next = c
		gather = true
	}
	c.waiters++
	c.joined++
	if pays {
		c.payers++
	} else {
		c.ticket = ticket
	}
	g.mu.Unlock()
	if gather {
		g.gather(c)
	}
	return g.wait(ctx, c, pays)
}

func (g *Group[T]) newCall(now time.Time) *call[T] {
	return &call[T]{deadline: now.Add(g.opts.Timeout), done: make(chan struct{})}
}

// wait waits for c, which this caller joined, or for ctx.
func (g *Group[T]) wait(ctx context.Context, c *call[T], pays bool) (T, error) {
	select {
	case <-c.done:
		return c.result()
	case <-ctx.Done():
	}
	g.mu.Lock()
	c.waiters--
	if pays {
		c.payers--
	}
	if c.waiters == 0 && c.cancel != nil {
		c.cancel() // nobody waits for it any more
	}
	g.mu.Unlock()
	select {
	case <-c.done: // it ended as we gave up: the result is there
		return c.result()
	default:
		var zero T
		return zero, g.gaveUp(ctx)
	}
}

// result is what a caller of c gets once c ended.
func (c *call[T]) result() (T, error) {
	if c.panicked != nil {
		panic(c.panicked)
	}
	return c.val, c.err
}

// gaveUp is the error of a caller whose context ended before its call did.
func (g *Group[T]) gaveUp(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != ctx.Err() {
		return fmt.Errorf("wait for %s: %w: %w", g.opts.Name, ctx.Err(), cause)
	}
	return fmt.Errorf("wait for %s: %w", g.opts.Name, ctx.Err())
}

// gather waits, without g.mu, for c's ticket to allow a call that only
// riders wait for, then decides whether to make it.
func (g *Group[T]) gather(c *call[T]) {
	g.mu.Lock()
	ticket := c.ticket
	g.mu.Unlock()
	delay, cancel, ok := ticket.Reserve()
	if !ok {
		g.decide(c, nil)
		return
	}
	time.AfterFunc(delay, func() { g.decide(c, cancel) })
}

// decide makes c, a call only riders waited for, when its ticket allowed
// it (cancel is not nil) and more than one caller joined it; else ends it
// with ErrNotMade. A caller who pays may have made it meanwhile.
func (g *Group[T]) decide(c *call[T], cancel func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.next != c {
		if cancel != nil {
			cancel() // a caller who pays made it
		}
		return
	}
	g.next = nil
	if cancel != nil && c.joined > 1 && c.waiters > 0 {
		g.startLocked(c)
		return
	}
	if cancel != nil {
		cancel()
	}
	c.err = ErrNotMade
	close(c.done)
}

// paced starts n, a next call that waited for MinInterval, unless nobody
// waits for it any more; if only riders still wait (its payers left), they
// gather for it as riders alone do, so that no call is made that no caller
// within the rate paid for.
func (g *Group[T]) paced(n *call[T]) {
	g.mu.Lock()
	n.paced = false
	if g.next != n { // dropped meanwhile, its callers gone
		g.mu.Unlock()
		return
	}
	switch {
	case n.waiters == 0:
		g.next = nil
	case n.payers == 0:
		g.mu.Unlock()
		g.gather(n) // it stays next while its riders gather
		return
	default:
		g.next = nil
		g.startLocked(n)
	}
	g.mu.Unlock()
}

// startLocked makes c the call in flight and runs it. g.mu is held.
func (g *Group[T]) startLocked(c *call[T]) {
	c.started = g.clock.Now()
	g.cur = c
	g.last = nil
	cause := fmt.Errorf("%s: waited longer than %v: %w", g.opts.Name, g.opts.Timeout, context.DeadlineExceeded)
	ctx, cancel := context.WithTimeoutCause(context.Background(), c.deadline.Sub(c.started), cause)
	c.cancel = cancel
	go g.run(ctx, c)
}

// run makes call c and ends it.
func (g *Group[T]) run(ctx context.Context, c *call[T]) {
	if ctx.Err() != nil {
		c.err = context.Cause(ctx) // its deadline passed before it started
	} else {
		func() {
			defer func() {
				if v := recover(); v != nil {
					c.panicked = &PanicError{Value: v, Stack: debug.Stack()}
				}
			}()
			c.val, c.err = g.fn(ctx, c.started)
		}()
	}
	c.cut = ctx.Err() != nil
	c.cancel()
	g.finish(c)
}

// finish ends c, the call in flight: it starts the next call if a caller
// who pays waits for it, lets riders alone gather for it, and hands c's
// result to its waiters.
func (g *Group[T]) finish(c *call[T]) {
	g.mu.Lock()
	g.cur = nil
	if c.err == nil && c.panicked == nil && !c.cut {
		g.last = c
	}
	var gather *call[T]
	if n := g.next; n != nil {
		switch {
		case n.waiters == 0:
			g.next = nil
		case n.payers == 0:
			gather = n // it stays next while its riders gather
		default:
			if wait := c.started.Add(g.opts.MinInterval).Sub(g.clock.Now()); g.opts.MinInterval > 0 && wait > 0 {
				n.paced = true
				time.AfterFunc(wait, func() { g.paced(n) })
			} else {
				g.next = nil
				g.startLocked(n)
			}
		}
	}
	waiters := c.waiters
	g.mu.Unlock()
	if g.opts.Shared != nil && c.panicked == nil && waiters > 1 {
		g.opts.Shared(waiters - 1)
	}
	// Closed under g.mu, so that a caller who stops waiting either is not
	// counted in waiters or finds the result there.
	g.mu.Lock()
	close(c.done)
	waiters = c.waiters
	g.mu.Unlock()
	if gather != nil {
		g.gather(gather)
	}
	if c.panicked != nil && waiters == 0 {
		panic(c.panicked) // nobody to hand it to: never swallowed
	}
}
