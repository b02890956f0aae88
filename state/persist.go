package state

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
)

// Tuning of the background writer.
const (
	// batchWindow is how long the writer waits after the first change of a
	// burst so that the rest of it (a Synchronize, a /pods read of every
	// pod) shares one directory fsync. It is most of the event-to-durable
	// latency of a lone event, well under the 100 ms target.
	batchWindow = 5 * time.Millisecond
	// maxParallelWrites bounds the files written at once in a batch: the
	// file system commits concurrent fsyncs together, so a burst of records
	// costs little more than one.
	maxParallelWrites = 8
	// Write errors are retried after a delay that doubles from minBackoff
	// up to maxBackoff.
	minBackoff = 100 * time.Millisecond
	maxBackoff = 10 * time.Second
)

// ErrClosed is returned by Flush on a store whose writer was stopped by
// Close while changes were still not on disk.
var ErrClosed = errors.New("state store closed")

// Open returns a store persisted in dir, one file per pod, and loads what an
// earlier run left there. It creates dir if needed and takes its writer
// lock: a second writer process is refused with an error matching ErrInUse.
// Files that cannot be loaded are set aside into <dir>/corrupt and counted,
// never fatal. Changes are written in the background; Close stops the writer
// and releases the lock.
func Open(dir string, opts Options) (*Store, error) {
	return open(dir, opts, nil)
}

// open is Open with a hook to tune the persister before it starts (tests).
func open(dir string, opts Options, tune func(*persister)) (*Store, error) {
	s := New(opts)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create state directory: %w", err)
	}
	log := s.opts.Log.WithField("stateDir", dir)
	lock, err := lockDir(dir, func(err error) { log.WithError(err).Warn("starting without the pid in the lock file") })
	if err != nil {
		return nil, err
	}
	for _, sub := range []string{podsDirName, corruptDirName} {
		if err := checkDirNoFollow(filepath.Join(dir, sub)); err != nil {
			lock.Close()
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	p := &persister{
		store:         s,
		log:           log,
		podsDir:       filepath.Join(dir, podsDirName),
		corruptDir:    filepath.Join(dir, corruptDirName),
		lock:          lock,
		onDurable:     s.opts.OnDurable,
		batchWindow:   batchWindow,
		minBackoff:    minBackoff,
		maxBackoff:    maxBackoff,
		pruneInterval: pruneInterval(s.opts.PruneAfter),
		wake:          make(chan struct{}, 1),
		kick:          make(chan struct{}, 1),
		stop:          make(chan struct{}),
		done:          make(chan struct{}),
		pruneStop:     make(chan struct{}),
		pruneDone:     make(chan struct{}),
		pending:       map[string]change{},
		progress:      make(chan struct{}),
	}
	if tune != nil {
		tune(p)
	}
	var redecoded []string
	if err := p.ensurePodsDir(); err != nil {
		if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
			lock.Close()
			return nil, fmt.Errorf("create state directory: %w", err)
		}
		// A full disk: a new state directory has no records to load, and
		// the persister creates it before its first write, retrying as
		// writes are retried. The kubelet and containerd start on a full
		// disk too.
		log.WithError(err).Warn("no room to create the records' directory: serving from memory, records are written once there is room")
	} else if redecoded, err = p.load(); err != nil {
		lock.Close()
		return nil, err
	}
	s.p = p
	s.dirty = p.markDirty
	for _, uid := range redecoded {
		p.markDirty(uid)
	}
	go p.run()
	go s.prune(p.pruneInterval, p.pruneStop, p.pruneDone)
	return s, nil
}

// mkdirDurable creates a directory and makes its entry in the parent durable.
func mkdirDurable(dir string) error {
	if fi, err := os.Lstat(dir); err == nil && fi.IsDir() {
		return nil
	}
	if err := os.Mkdir(dir, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(dir))
}

func pruneInterval(after time.Duration) time.Duration {
	return min(max(after/10, time.Second), time.Minute)
}

// prune deletes expired removed records every interval until stop closes.
func (s *Store) prune(interval time.Duration, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if n := s.Prune(); n > 0 {
				s.opts.Log.WithField("records", n).Debug("pruned removed pods")
			}
		case <-stop:
			return
		}
	}
}

// Flush returns once every change made before the call is on disk. When a
// write attempted after the call fails, it returns that error (the writer
// keeps retrying); it also returns when ctx is done. On an in-memory store it
// returns nil at once.
func (s *Store) Flush(ctx context.Context) error {
	if s.p == nil {
		return nil
	}
	return s.p.flush(ctx)
}

// Close writes what is still pending, stops the background writer and
// pruner and releases the directory's lock. Changes made after Close began
// stay in memory only. It returns the error that kept pending changes from
// disk, if any. On an in-memory store it does nothing.
func (s *Store) Close() error {
	if s.p == nil {
		return nil
	}
	return s.p.close()
}

// Stats are the persistence counters, for metrics and `inspect`. They are
// zero for an in-memory store, except Records.
type Stats struct {
	// Records is the number of records in memory.
	Records int
	// Pending is the number of records changed but not yet on disk.
	Pending int
	// Writes counts record files written or removed since Open.
	Writes uint64
	// WriteErrors counts record writes that failed (each is retried).
	WriteErrors uint64
	// LastWriteError is the most recent write error, kept after recovery;
	// empty if there was none.
	LastWriteError string
	// CorruptFiles counts files Open set aside into <dir>/corrupt.
	CorruptFiles uint64
	// LastDurable and MaxDurable are the latest and the largest time from a
	// record's first unpersisted change to it being durable.
	LastDurable time.Duration
	MaxDurable  time.Duration
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	st := Stats{Records: len(s.byUID)}
	s.mu.RUnlock()
	if p := s.p; p != nil {
		p.mu.Lock()
		st.Pending = len(p.pending) + len(p.inflight)
		st.Writes = p.writes
		st.WriteErrors = p.writeErrors
		st.LastWriteError = p.lastErr
		st.CorruptFiles = p.corrupt
		st.LastDurable = p.lastDurable
		st.MaxDurable = p.maxDurable
		p.mu.Unlock()
	}
	return st
}

// load reads every record file into the store. Temporary files of writes a
// crash cut short are removed; files that cannot be loaded are set aside. It
// returns the uids whose records changed when their annotations were decoded
// again, which must be written back. Only the pods directory being
// unreadable is an error.
func (p *persister) load() ([]string, error) {
	entries, err := os.ReadDir(p.podsDir)
	if err != nil {
		return nil, fmt.Errorf("read state directory %s: %w", p.podsDir, err)
	}
	s := p.store
	s.mu.Lock()
	defer s.mu.Unlock()
	var redecoded []string
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(p.podsDir, name)
		switch {
		case isTempName(name):
			if err := os.Remove(path); err != nil {
				p.log.WithError(err).WithField("file", path).Warn("could not remove the temporary file of an interrupted write")
			} else {
				p.log.WithField("file", path).Info("removed the temporary file of an interrupted write")
			}
			continue
		case e.IsDir() || !strings.HasSuffix(name, recordExt):
			p.log.WithField("file", path).Debug("ignoring a file that is not a pod record")
			continue
		}
		data, err := readFileNoFollow(path)
		var r *Record
		if err == nil {
			r, err = loadRecordFile(name, data)
		}
		if err != nil {
			p.setAside(path, name, err)
			continue
		}
		if s.adopt(r) {
			redecoded = append(redecoded, r.UID)
		}
	}
	return redecoded, nil
}

// setAside moves a file that cannot be loaded into the corrupt directory,
// where an operator can look at it, instead of failing or deleting it.
func (p *persister) setAside(path, name string, why error) {
	p.mu.Lock()
	p.corrupt++
	p.mu.Unlock()
	log := p.log.WithField("file", path).WithField("reason", why.Error())
	err := checkDirNoFollow(p.corruptDir)
	if err == nil {
		err = os.MkdirAll(p.corruptDir, 0o750)
	}
	if err != nil {
		log.WithError(err).Error("cannot load a pod record file and cannot set it aside")
		return
	}
	dest := filepath.Join(p.corruptDir, name+"."+time.Now().UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(path, dest); err != nil {
		log.WithError(err).Error("cannot load a pod record file and cannot set it aside")
		return
	}
	log.WithField("movedTo", dest).Warn("set aside a pod record file that cannot be loaded")
}
