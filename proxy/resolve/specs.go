package resolve

import (
	"context"
	"time"

	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// The runtime (NRI, CRI) reports a pod's sandbox with its annotations but
// not its spec: which scheduler placed it and what its containers request,
// which is what vets and attributes its devices. Reading that spec at the
// first query that includes the pod would leave a running pod answered
// without its devices if /pods fails before that query, so the spec is read
// in the background as soon as a running pod needs it. The reads are the
// queries' shared reads (kubeletpods.Reader): a query arriving meanwhile
// joins one instead of starting its own.

const (
	// specRetryMin and specRetryMax bound the wait before reading /pods
	// again after a read failed while a running pod still needs its spec.
	specRetryMin = time.Second
	specRetryMax = 30 * time.Second
)

// ReadSpecs reads /pods whenever a running pod has devices that cannot be
// vetted for want of its spec, until ctx is done. A read that started after
// such a pod last changed and still did not show it (the API no longer has
// the pod) is not repeated until the pod changes again; a failed read is
// retried with backoff.
func (r *Resolver) ReadSpecs(ctx context.Context) {
	if r.o.Pods == nil {
		return
	}
	var (
		readSince time.Time // when the last successful read started
		retry     <-chan time.Time
		backoff   = specRetryMin
	)
	for {
		changed := r.o.Store.Changed()
		if retry == nil && r.specNeeded(readSince) {
			started := time.Now()
			if _, err := r.o.Pods.ReadAfter(ctx, started); err != nil {
				if ctx.Err() != nil {
					return
				}
				r.o.Log.WithError(err).Debugf("reading the specs of running pods; again in %v", backoff)
				retry = time.After(backoff)
				backoff = min(2*backoff, specRetryMax)
			} else {
				readSince, backoff = started, specRetryMin
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-retry:
			retry = nil
		}
	}
}

// specNeeded reports whether a running pod that changed at or after since
// has devices that cannot be vetted without its spec.
func (r *Resolver) specNeeded(since time.Time) bool {
	for _, rec := range r.o.Store.Records() {
		if needsSpec(rec) && !rec.UpdatedAt.Before(since) {
			return true
		}
	}
	return false
}

// needsSpec reports whether r is a running pod whose devices wait for its
// spec to be vetted.
func needsSpec(r *record.Record) bool { return r.Live() && !plans.Vettable(r) }
