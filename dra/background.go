package dra

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

// Run reads, in the background, what the answers lacked until ctx is done:
// the pods' extended resource claims (ViewOptions.Pods) and the
// allocations of claims that serve several containers or resources
// (ViewOptions.Allocation). Each has a queue and a loop of its own, so a
// hanging API server never holds up a pod's lookup; each loop makes one
// read at a time, and both have returned when Run does.
func (v *View) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { v.drain(ctx, &v.lookups, v.readPods) })
	if v.opts.Allocation != nil {
		wg.Go(func() { v.drain(ctx, &v.allocations, v.readAllocations) })
	}
	wg.Wait()
	v.mu.Lock()
	v.stopped = true
	close(v.lookups.done) // a Get waiting on it answers with what is known
	v.lookups.done = make(chan struct{})
	v.mu.Unlock()
	return nil
}

// queue is the pods one of Run's loops is to read, each with the claim
// names the kubelet listed for it and the pace of its retries.
type queue struct {
	wake  chan struct{} // holds one signal
	items map[model.PodKey]item
	// done is closed when the next read has ended (one under way has its
	// own): a Get waits for it.
	done chan struct{}
}

type item struct {
	claims string
	pace   pace
}

func newQueue() queue {
	return queue{wake: make(chan struct{}, 1), items: map[model.PodKey]item{}, done: make(chan struct{})}
}

// ask queues key unless it is queued already (its pace stays), and
// reports whether it is due now.
func (q *queue) ask(key model.PodKey, claims string) (due bool) {
	it, queued := q.items[key]
	if !queued || it.claims != claims {
		it = item{claims: claims}
		q.items[key] = it
	}
	signal(q.wake)
	return !time.Now().Before(it.pace.at)
}

// drain hands the pods of q that are due to read, all in one call, when
// woken and every retryFirst, until ctx is done. The pods read returns
// are queued again, and wait for their pace.
func (v *View) drain(ctx context.Context, q *queue, read func(context.Context, map[model.PodKey]item) (failed []model.PodKey)) {
	retries := time.NewTicker(retryFirst)
	defer retries.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		case <-retries.C:
		}
		now := time.Now()
		batch := map[model.PodKey]item{}
		v.mu.Lock()
		for k, it := range q.items {
			if !now.Before(it.pace.at) {
				batch[k] = it
				delete(q.items, k)
			}
		}
		done := q.done
		q.done = make(chan struct{})
		v.mu.Unlock()

		var failed []model.PodKey
		if len(batch) > 0 {
			failed = read(ctx, batch)
		}
		v.mu.Lock()
		for _, k := range failed {
			it := batch[k]
			it.pace.failed()
			if asked, ok := q.items[k]; ok {
				it.claims = asked.claims // asked again meanwhile
			}
			q.items[k] = it
		}
		v.mu.Unlock()
		close(done)
	}
}

// readPods reads the facts of the pods the answers met without facts, all
// in one call of Pods, keeps them and queues the allocations they need.
// A pod the pod sources do not know yet is dropped (its next answer asks
// again), unless the read failed.
func (v *View) readPods(ctx context.Context, batch map[model.PodKey]item) (failed []model.PodKey) {
	keys := slices.Collect(maps.Keys(batch))
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	found, err := v.opts.Pods(rctx, keys)
	cancel()
	if err != nil && ctx.Err() == nil {
		v.log.WithError(err).WithField("pods", len(keys)).Warn("DRA: reading the pods' extended resource claims failed; their devices stay under dynamic_resources until they are read")
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for key, it := range batch {
		claim, ok := found[key]
		if !ok {
			if err != nil {
				failed = append(failed, key)
			}
			continue
		}
		if e := v.pods[key]; e == nil || e.claims != it.claims {
			v.pods[key] = &podEntry{claims: it.claims, facts: PodFacts{Claim: claim}, reported: map[Unfolded]bool{}}
			if needsAllocation(claim) && v.opts.Allocation != nil {
				v.allocations.ask(key, it.claims)
			}
		}
	}
	return failed
}

// readAllocations reads the allocations of the pods' claims, one at a
// time; a pod forgotten or recreated meanwhile is skipped.
func (v *View) readAllocations(ctx context.Context, batch map[model.PodKey]item) (failed []model.PodKey) {
	for key, it := range batch {
		v.mu.Lock()
		e := v.pods[key]
		v.mu.Unlock()
		if ctx.Err() != nil || e == nil || e.claims != it.claims {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, readTimeout)
		alloc, err := v.opts.Allocation(rctx, key.Namespace, e.facts.Claim.ClaimName)
		cancel()
		switch {
		case err == nil:
			v.mu.Lock()
			e.facts.Allocation = alloc
			v.mu.Unlock()
		case ctx.Err() == nil:
			failed = append(failed, key)
			v.log.WithError(err).WithField("pod", key).Warn("DRA: reading the pod's extended resource claim failed; its devices stay under dynamic_resources until it is read")
		}
	}
	return failed
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
