package plugin

import "sync"

// updateQueue applies store updates one at a time, in the order they were
// queued, on a goroutine of its own. A handler can then stop waiting for a
// busy store without losing its update or letting a later one overtake it
// (a container's "running" must not be undone by its late "created").
//
// The goroutine exists only while updates are pending, so an idle plugin
// holds none. The queue is unbounded: the runtime sends one request at a
// time and waits for each, so it grows by at most one update per
// maxUpdateWait while the store is stuck.
type updateQueue struct {
	mu       sync.Mutex
	pending  []func()
	draining bool
}

// add queues update and returns a channel closed once it has been applied.
func (q *updateQueue) add(update func()) <-chan struct{} {
	done := make(chan struct{})
	q.mu.Lock()
	q.pending = append(q.pending, func() {
		update()
		close(done)
	})
	if !q.draining {
		q.draining = true
		go q.drain()
	}
	q.mu.Unlock()
	return done
}

func (q *updateQueue) drain() {
	for {
		q.mu.Lock()
		if len(q.pending) == 0 {
			q.draining = false
			q.pending = nil // let a large backlog's array go
			q.mu.Unlock()
			return
		}
		next := q.pending[0]
		q.pending[0] = nil
		q.pending = q.pending[1:]
		q.mu.Unlock()
		next()
	}
}
