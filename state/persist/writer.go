package persist

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// The background writer: changed records are written in batches, each file
// atomically (temp file, fsync, rename), retried with backoff when the disk
// fails, never blocking the store's callers.

// Writer is the one writer of a state directory: it holds the directory's
// lock and writes the store's records to it in the background.
//
// The store calls MarkDirty, with the store's lock held, for every uid whose
// record changed or was deleted. The writer goroutine takes the dirty set
// after a short batch window and writes each record's current version (or
// removes its file), then fsyncs the directory once. Changes carry sequence
// numbers so that Flush can tell when everything before it is durable.
// Lock order: the store's lock before Writer.mu; the writer never holds
// Writer.mu while it asks the store for a record or touches the disk.
type Writer struct {
	// get returns the current record of a uid (false: deleted); set by Start.
	get        func(uid string) (*record.Record, bool)
	takeOver   func(disk []*record.Record, ours func(uid string) bool)
	log        logrus.FieldLogger
	dir        string
	podsDir    string
	corruptDir string
	lock       *os.File // nil while a standby waits for it
	onDurable  func(time.Duration)

	wake      chan struct{} // cap 1: there are pending changes
	kick      chan struct{} // cap 1: a Flush waits; skip batch window and backoff
	stop      chan struct{} // closed by Close to stop the writer
	quit      chan struct{} // closed by Close to stop a standby's wait for the lock
	done      chan struct{} // closed when the writer has stopped
	writing   chan struct{} // closed once the writer holds the lock
	closeOnce sync.Once
	closeErr  error

	mu       sync.Mutex
	seq      uint64            // changes marked so far
	pending  map[string]change // dirty uids the writer has not taken yet
	inflight map[string]change // taken by the writer, not yet durable
	batches  uint64            // batches the writer started
	failedAt uint64            // the last batch that failed
	progress chan struct{}     // closed and replaced when a batch ends
	closed   bool              // Close began: changes are no longer persisted
	stopped  bool              // the writer has stopped

	writes, writeErrors, corrupt uint64
	lastErr                      string
	lastDurable, maxDurable      time.Duration
}

// change is a record's oldest change that is not on disk yet.
type change struct {
	since time.Time // when it happened (monotonic, for latency)
	seq   uint64
}

// MarkDirty notes that the record of uid changed. It is the store's dirty
// hook: called with the store's lock held, it only updates a map and never
// blocks.
func (p *Writer) MarkDirty(uid string) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.seq++
	if _, ok := p.pending[uid]; !ok {
		p.pending[uid] = change{since: time.Now(), seq: p.seq}
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// durableLocked returns the sequence number up to which every change is on
// disk. Called with mu held.
func (p *Writer) durableLocked() uint64 {
	first := p.seq + 1
	for _, m := range []map[string]change{p.pending, p.inflight} {
		for _, c := range m {
			first = min(first, c.seq)
		}
	}
	return first - 1
}

// Flush returns once every change marked before the call is on disk. When a
// write attempted after the call fails, it returns that error (the writer
// keeps retrying); it also returns when ctx is done, and ErrClosed when the
// writer stopped with changes still not on disk.
func (p *Writer) Flush(ctx context.Context) error {
	p.mu.Lock()
	target, started := p.seq, p.batches
	p.mu.Unlock()
	for {
		p.mu.Lock()
		durable := p.durableLocked() >= target
		failed, lastErr, stopped := p.failedAt > started, p.lastErr, p.stopped
		progress := p.progress
		p.mu.Unlock()
		switch {
		case durable:
			return nil
		case failed:
			return fmt.Errorf("flush state to %s: %s", p.podsDir, lastErr)
		case stopped:
			return ErrClosed
		}
		select {
		case p.kick <- struct{}{}:
		default:
		}
		select {
		case <-progress:
		case <-ctx.Done():
			return fmt.Errorf("flush state to %s: %w", p.podsDir, ctx.Err())
		}
	}
}

// Close writes what is still pending, stops the writer and releases the
// directory's lock. Changes marked after Close began are not written. It
// returns the error that kept pending changes from disk, if any.
func (p *Writer) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.quit)
		var err error
		select {
		case <-p.writing:
			err = p.Flush(context.Background())
		case <-p.done:
			// A standby that never became the writer: what it learned
			// is the writer's to write, not ours.
		}
		close(p.stop)
		<-p.done
		p.mu.Lock()
		p.stopped = true
		close(p.progress) // wake a Flush that is still waiting
		p.progress = make(chan struct{})
		p.mu.Unlock()
		if p.lock != nil {
			if cerr := p.lock.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("release lock of state directory: %w", cerr)
			}
		}
		p.closeErr = err
	})
	return p.closeErr
}

// run is the writer goroutine, started by Start.
func (p *Writer) run() {
	defer close(p.done)
	if p.lock == nil && !p.awaitLock() {
		return
	}
	select {
	case p.wake <- struct{}{}: // what a standby learned is pending
	default:
	}
	for {
		kicked := false
		select {
		case <-p.wake:
		case <-p.kick:
			kicked = true
		case <-p.stop:
			return
		}
		if !kicked && !p.wait(batchWindow) {
			return
		}
		backoff := wait.Backoff{Duration: minBackoff, Factor: 2, Cap: maxBackoff, Steps: math.MaxInt32}
		for p.writeBatch() != nil {
			if !p.wait(backoff.Step()) {
				return
			}
		}
	}
}

// wait sleeps for d, or less when a Flush kicks. It returns false when the
// writer must stop.
func (p *Writer) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.kick:
	case <-p.stop:
		return false
	}
	return true
}

// writeBatch writes every pending record and fsyncs the directory. Records it
// could not write stay pending; it returns the first error.
func (p *Writer) writeBatch() error {
	p.mu.Lock()
	if len(p.pending) == 0 {
		p.mu.Unlock()
		return nil
	}
	batch := p.pending
	p.pending = map[string]change{}
	p.inflight = batch
	p.batches++
	no := p.batches
	p.mu.Unlock()

	uids := make([]string, 0, len(batch))
	var rejected []string
	for uid := range batch {
		if record.ValidUID(uid) {
			uids = append(uids, uid)
		} else {
			rejected = append(rejected, uid)
		}
	}
	slices.Sort(uids)
	errs := p.writeAll(uids)
	var firstErr error
	var written []string
	for i, err := range errs {
		if err == nil {
			written = append(written, uids[i])
		} else if firstErr == nil {
			firstErr = err
		}
	}
	if len(written) > 0 {
		if err := atomicfile.SyncDir(p.podsDir); err != nil {
			// Nothing of this batch is known to be durable.
			for i := range errs {
				if errs[i] == nil {
					errs[i] = err
				}
			}
			written = nil
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	now := time.Now()

	p.mu.Lock()
	p.inflight = nil
	failed := 0
	for i, err := range errs {
		if err == nil {
			continue
		}
		failed++
		// Older than any change marked since the batch was taken.
		p.pending[uids[i]] = batch[uids[i]]
	}
	latencies := make([]time.Duration, len(written))
	for i, uid := range written {
		latencies[i] = now.Sub(batch[uid].since)
		p.lastDurable = latencies[i]
		p.maxDurable = max(p.maxDurable, latencies[i])
	}
	p.writes += uint64(len(written))
	p.writeErrors += uint64(failed + len(rejected))
	if len(rejected) > 0 && firstErr == nil {
		p.lastErr = fmt.Sprintf("pod uid %q cannot name a record file", rejected[0])
	}
	if firstErr != nil {
		p.lastErr = firstErr.Error()
		p.failedAt = no
	}
	// Flush waiters are woken after OnDurable has seen this batch, so that
	// whoever measures through OnDurable finds every write Flush waited for.
	progress := p.progress
	p.progress = make(chan struct{})
	p.mu.Unlock()
	defer close(progress)

	for _, uid := range rejected {
		p.log.WithField("uid", uid).Error("pod uid cannot name a file; its record is kept in memory only")
	}
	if firstErr != nil {
		p.log.WithError(firstErr).WithField("records", failed).Warn("could not write pod records; will retry")
	}
	if p.onDurable != nil {
		for _, l := range latencies {
			p.onDurable(l)
		}
	}
	return firstErr
}

// writeAll persists the records of uids, a few at a time, and returns one
// error (or nil) per uid.
func (p *Writer) writeAll(uids []string) []error {
	errs := make([]error, len(uids))
	if err := p.ensurePodsDir(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	workers := min(len(uids), maxParallelWrites)
	if workers <= 1 {
		for i, uid := range uids {
			errs[i] = p.persist(uid)
		}
		return errs
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				errs[i] = p.persist(uids[i])
			}
		})
	}
	for i := range uids {
		next <- i
	}
	close(next)
	wg.Wait()
	return errs
}

// persist makes the file of uid match its record: written when the store
// has one, removed when it does not.
func (p *Writer) persist(uid string) error {
	path := filepath.Join(p.podsDir, uid+record.Ext)
	r, ok := p.get(uid)
	if !ok {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove record file of deleted pod %s: %w", uid, err)
		}
		return nil
	}
	data, err := record.Encode(r)
	if err != nil {
		return err
	}
	// A reader or a crash sees the old content or the new; the directory
	// fsync that makes the rename durable is the batch's.
	return atomicfile.Write(path, data, 0o640)
}

// ensurePodsDir creates the records' directory when it is missing: on a
// full disk it may not have been possible at start, and a directory an
// operator removed comes back.
func (p *Writer) ensurePodsDir() error {
	if err := mkdirDurable(p.podsDir); err != nil {
		return fmt.Errorf("create %s: %w", p.podsDir, err)
	}
	return nil
}
