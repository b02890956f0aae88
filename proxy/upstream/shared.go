package upstream

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/internal/coalesce"
	"github.com/podres-proxy/podres-proxy/metrics"
)

// sharedTimeout bounds a call that callers wait for: a List's kubelet call
// plus, for a pod being created, the /pods read it waits for (itself
// bounded by kubeletpods.DefaultReadTimeout). Callers leave earlier on their
// own deadlines; the call goes on for the others.
const sharedTimeout = 30 * time.Second

// callInterval is the least time between the starts of a method's calls
// while callers keep it busy (coalesce.Options.MinInterval): the kubelet's
// rate limit, 100 calls a second, as an interval. A caller waits at most
// this much more; one that finds no call in flight (a client polling alone)
// is never delayed. Paced, more callers share each call
// (docs/performance.md, "What the mechanisms buy").
const callInterval = 10 * time.Millisecond

// Shared lets concurrent callers of one method share its work: a kubelet
// call and what is built from it (package coalesce says how). Every caller
// gets an answer that started after it arrived (a List asked while a pod is
// being created must list it). However many clients poll at once, the
// kubelet sees at most one call in flight per method, and most callers
// share one; its limit of 100 calls a second is shared with every other
// agent on the node.
//
// A call beyond the rate limit (it has a Ticket: limits.Overdraft) never
// makes a kubelet call of its own: it rides (coalesce.Group.Join) a call
// others make, or one it gathers with other calls beyond the limit once its
// client's next token is there (at most 50 ms); alone, it fails with
// coalesce.ErrNotMade, counted here as refused by the rate limit
// (podres_proxy_rate_limited_total), which the server answers as the
// kubelet's rate-limit error (proxy.shared, limits.ErrRateLimited). So the
// kubelet never sees more calls than the limit lets through.
//
// A shared call's error, the kubelet's code and message included, goes to
// every caller that shared it; a caller whose deadline passes or who is
// cancelled gets the gRPC code of that.
type Shared[T any] struct {
	group   *coalesce.Group[T]
	metrics *metrics.Metrics
}

// NewShared returns the shared calls of method (its name in errors and
// metrics), each made by fn with the time it started, which is after every
// caller's arrival.
func NewShared[T any](method string, fn func(ctx context.Context, started time.Time) (T, error), m *metrics.Metrics) *Shared[T] {
	return &Shared[T]{
		metrics: m,
		group: coalesce.New(func(ctx context.Context, started time.Time) (T, error) {
			v, err := fn(ctx, started)
			return v, timedOut(ctx, err)
		}, coalesce.Options{
			Name:        "kubelet " + method + " call",
			Timeout:     sharedTimeout,
			MinInterval: callInterval,
			Shared:      func(others int) { m.Shared(method, others) },
		}),
	}
}

// Do returns the result of a call that started after arrived (when the
// caller's call reached the server), or coalesce.ErrNotMade, counted as a
// refusal, for a caller with a ticket that found no call to join. A caller
// beyond the rate limit gives its ticket, and only joins calls (see
// Shared); others give nil, and always get a call.
func (c *Shared[T]) Do(ctx context.Context, arrived time.Time, ticket coalesce.Ticket) (T, error) {
	var v T
	var err error
	if ticket != nil {
		v, err = c.group.Join(ctx, arrived, ticket)
	} else {
		v, err = c.group.Do(ctx, arrived)
	}
	switch {
	case err == nil:
		return v, nil
	case errors.Is(err, coalesce.ErrNotMade):
		c.metrics.RateLimited()
		return v, err
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return v, status.FromContextError(err).Err() // this caller gave up
	default:
		return v, err
	}
}

// timedOut turns the error of a call that ran out of time into the
// DeadlineExceeded it is, with the cause's message, whatever fn made of its
// context's error.
func timedOut(ctx context.Context, err error) error {
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return status.Error(codes.DeadlineExceeded, context.Cause(ctx).Error())
	}
	return err
}
