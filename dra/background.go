package dra

import (
	"context"
	"sync"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

// Run reads, in the background, what the answers lacked until ctx is done:
// the pods' extended resource claims (ViewOptions.Pods) and the
// allocations of claims that serve several containers or resources
// (ViewOptions.Allocation). The two are read by loops of their own, so a
// hanging API server never holds up a pod's lookup; each loop makes one
// read at a time, and both have returned when Run does.
func (v *View) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { v.loop(ctx, v.lookupWake, v.lookup) })
	wg.Go(func() { v.loop(ctx, v.claimWake, v.readClaims) })
	wg.Wait()
	v.mu.Lock()
	v.stopped = true
	close(v.next) // a Get waiting on it answers with what is known
	v.next = make(chan struct{})
	v.mu.Unlock()
	return nil
}

// loop calls work when woken or when the retry it returned is due (zero:
// none) until ctx is done.
func (v *View) loop(ctx context.Context, wake <-chan struct{}, work func(context.Context) time.Time) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-timer.C:
		}
		timer.Stop()
		if due := work(ctx); !due.IsZero() {
			timer.Reset(time.Until(due))
		}
	}
}

// lookup reads the facts of the pods the answers met without facts, all in
// one call of Pods, and keeps them; then it wakes the Gets that waited and
// the claim reads. After a failure it waits (backoff) before the next.
func (v *View) lookup(ctx context.Context) time.Time {
	v.mu.Lock()
	if len(v.lookups) == 0 {
		v.mu.Unlock()
		return time.Time{}
	}
	if at := v.lookupPace.at; time.Now().Before(at) {
		v.mu.Unlock()
		return at
	}
	want, done := v.lookups, v.next
	v.lookups, v.next = map[model.PodKey]string{}, make(chan struct{})
	v.mu.Unlock()
	defer close(done)

	keys := make([]model.PodKey, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	found, err := v.opts.Pods(rctx, keys)
	cancel()
	if err != nil && ctx.Err() == nil {
		v.log.WithError(err).WithField("pods", len(keys)).Warn("DRA: reading the pods' extended resource claims failed; their devices stay under dynamic_resources until they are read")
	}

	v.mu.Lock()
	defer v.mu.Unlock()
	if err != nil {
		v.lookupPace.failed()
	} else {
		v.lookupPace = pace{}
	}
	added := false
	for key, claims := range want {
		claim, ok := found[key]
		if !ok {
			continue // not in the pod sources yet: its next answer asks again
		}
		if e := v.pods[key]; e == nil || e.claims != claims {
			v.pods[key] = &podEntry{claims: claims, facts: PodFacts{Claim: claim}, reported: map[Unfolded]bool{}}
			added = added || needsAllocation(claim)
		}
	}
	if added {
		signal(v.claimWake)
	}
	return time.Time{}
}

// readClaims reads, one at a time, the allocations that are needed, not
// known, and not waiting after a failure; it returns when the next retry is
// due.
func (v *View) readClaims(ctx context.Context) time.Time {
	if v.opts.Allocation == nil {
		return time.Time{}
	}
	for ctx.Err() == nil {
		key, e, due := v.nextClaim()
		if e == nil {
			return due
		}
		rctx, cancel := context.WithTimeout(ctx, readTimeout)
		alloc, err := v.opts.Allocation(rctx, key.Namespace, e.facts.Claim.ClaimName)
		cancel()
		v.mu.Lock()
		switch {
		case err == nil:
			e.facts.Allocation = alloc
		case ctx.Err() == nil:
			e.claimPace.failed()
			v.log.WithError(err).WithField("pod", key).Warn("DRA: reading the pod's extended resource claim failed; its devices stay under dynamic_resources until it is read")
		}
		v.mu.Unlock()
	}
	return time.Time{}
}

// nextClaim returns a pod whose claim's allocation is to be read now, or,
// when none is, when the next one is due (zero: none).
func (v *View) nextClaim() (model.PodKey, *podEntry, time.Time) {
	now := time.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	var due time.Time
	for key, e := range v.pods {
		if e.facts.Allocation != nil || !needsAllocation(e.facts.Claim) {
			continue
		}
		if !now.Before(e.claimPace.at) {
			return key, e, time.Time{}
		}
		if due.IsZero() || e.claimPace.at.Before(due) {
			due = e.claimPace.at
		}
	}
	return model.PodKey{}, nil, due
}

// pace spaces a read's retries: retryFirst after a failure, then twice as
// long after each further one, up to retryMax.
type pace struct {
	at    time.Time // the next read is not made before
	fails int       // in a row
}

func (p *pace) failed() {
	p.fails++
	d := retryFirst
	for i := 1; i < p.fails && d < retryMax; i++ {
		d *= 2
	}
	p.at = time.Now().Add(min(d, retryMax))
}

// signal wakes a loop; a wake already pending covers this one.
func signal(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
