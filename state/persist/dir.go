// Package persist is the state store's directory on disk: its layout, the
// lock that admits one writer, files opened without following symbolic
// links, the background writer that replaces each record's file atomically
// (temp file, fsync, rename, one directory fsync per batch), loading what an
// earlier run left with files that cannot be loaded set aside, and ReadDir
// for readers that take no lock. What a record holds and how it is encoded
// is package state/record's; which records exist is package state's.
package persist

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
	"github.com/podres-proxy/podres-proxy/internal/nofollow"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// The layout of a state directory (docs/state-format.md describes it for
// operators):
//
//	<dir>/lock               flock'ed by the one writer; holds its pid
//	<dir>/pods/<uid>.json    one record per pod
//	<dir>/pods/.<uid>.json.<random>.tmp   a write in progress (or cut short)
//	<dir>/corrupt/<file>.<time>           files the writer could not load
const (
	podsDirName    = "pods"
	corruptDirName = "corrupt"
	lockFileName   = "lock"
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

// ErrClosed is returned by Flush on a writer stopped by Close while
// changes were still not on disk.
var ErrClosed = errors.New("state store closed")

// Options configure a Writer.
type Options struct {
	// Log receives what the writer has to say about files it set aside
	// and writes that failed.
	Log logrus.FieldLogger
	// OnDurable, when set, is called from the writer for every record file
	// written or removed, with the time from the record's first change that
	// was not yet on disk to the moment it became durable. It must return
	// quickly.
	OnDurable func(latency time.Duration)
	// Wait makes Open wait for a directory that another process writes
	// instead of refusing it: Open then returns a standby writer with the
	// records that process wrote, read without touching a file. The writer
	// takes the lock once the other process releases it (Start), and only
	// then writes (Writing).
	Wait bool
}

// Open takes the writer lock of the state directory dir, creating dir if
// needed, and returns its writer with the records an earlier run left
// there. A directory that another process writes is refused with an error
// matching ErrInUse, unless opts.Wait is set: the writer is then a standby
// (see Options.Wait). Files that cannot be loaded are set aside into
// <dir>/corrupt and counted, never fatal. Temporary files of writes a crash
// cut short are removed. The writer must be started with Start; Close stops
// it and releases the lock.
func Open(dir string, opts Options) (*Writer, []*record.Record, error) {
	if opts.Log == nil {
		opts.Log = logrus.StandardLogger()
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, nil, fmt.Errorf("create state directory: %w", err)
	}
	log := opts.Log.WithField("stateDir", dir)
	p := &Writer{
		log:        log,
		dir:        dir,
		podsDir:    filepath.Join(dir, podsDirName),
		corruptDir: filepath.Join(dir, corruptDirName),
		onDurable:  opts.OnDurable,
		wake:       make(chan struct{}, 1),
		kick:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		quit:       make(chan struct{}),
		done:       make(chan struct{}),
		writing:    make(chan struct{}),
		pending:    map[string]change{},
		progress:   make(chan struct{}),
	}
	lock, err := p.lockDir()
	if errors.Is(err, ErrInUse) && opts.Wait {
		return p, p.readStandby(err), nil
	}
	if err != nil {
		return nil, nil, err
	}
	loaded, err := p.takeDir(lock)
	if err != nil {
		return nil, nil, err
	}
	close(p.writing)
	return p, loaded, nil
}

// lockDir takes the directory's writer lock.
func (p *Writer) lockDir() (*os.File, error) {
	return lockDir(p.dir, func(err error) { p.log.WithError(err).Warn("starting without the pid in the lock file") })
}

// takeDir makes lock the writer's and loads the records, as the one writer
// of the directory. On an error, lock is released.
func (p *Writer) takeDir(lock *os.File) ([]*record.Record, error) {
	for _, sub := range []string{podsDirName, corruptDirName} {
		if err := nofollow.CheckDir(filepath.Join(p.dir, sub)); err != nil {
			lock.Close()
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	if err := p.ensurePodsDir(); err != nil {
		if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
			lock.Close()
			return nil, fmt.Errorf("create state directory: %w", err)
		}
		// A full disk: a new state directory has no records to load, and
		// the writer creates it before its first write, retrying as
		// writes are retried. The kubelet and containerd start on a full
		// disk too.
		p.log.WithError(err).Warn("no room to create the records' directory: serving from memory, records are written once there is room")
		p.lock = lock
		return nil, nil
	}
	loaded, err := p.load()
	if err != nil {
		lock.Close()
		return nil, err
	}
	p.lock = lock
	return loaded, nil
}

// readStandby reads the records of a directory another process writes, as
// any reader does (ReadDir): files it cannot read are logged and left where
// they are for their writer.
func (p *Writer) readStandby(inUse error) []*record.Record {
	p.log.WithError(inUse).Info("waiting to become the writer of the state directory: serving from the records it holds and from this instance's own sources until the other instance lets go")
	loaded, errs := ReadDir(p.dir)
	for _, err := range errs {
		p.log.WithError(err).Warn("while waiting to become the writer: a record file could not be read (its writer sets it aside)")
	}
	return loaded
}

// Start starts the writer; get returns a uid's current record, false when
// it was deleted (its file is then removed). A standby writer first waits
// for the directory's lock; once it has it, it loads the directory again
// and calls takeOver with the records there and ours, which reports
// whether a uid changed since Open (a change not on disk yet), before it
// writes anything: the store merges what the previous writer wrote with
// what it learned meanwhile. takeOver is never called for a writer that
// had the lock at Open.
func (p *Writer) Start(get func(uid string) (*record.Record, bool), takeOver func(disk []*record.Record, ours func(uid string) bool)) {
	p.get = get
	p.takeOver = takeOver
	go p.run()
}

// Writing returns a channel closed once this writer holds the directory's
// lock: at once for a writer that had it at Open, when the previous writer
// lets go for a standby.
func (p *Writer) Writing() <-chan struct{} { return p.writing }

// lockPoll is how often a standby writer tries the lock: the previous
// writer releases it as its last act, and the standby writes its first
// batch this long after at most.
const lockPoll = 50 * time.Millisecond

// awaitLock waits for the directory's lock and takes the directory over. It
// returns false when the writer was closed first.
func (p *Writer) awaitLock() bool {
	began := time.Now()
	t := time.NewTicker(lockPoll)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return false
		case <-t.C:
		}
		lock, err := p.lockDir()
		if errors.Is(err, ErrInUse) {
			continue
		}
		if err != nil {
			p.log.WithError(err).Error("while waiting to become the writer of the state directory")
			continue
		}
		loaded, err := p.takeDir(lock)
		if err != nil {
			p.log.WithError(err).Error("could not take the state directory over; trying again")
			continue
		}
		p.takeOver(loaded, p.changed)
		close(p.writing)
		p.log.WithFields(logrus.Fields{"waited": time.Since(began).Round(time.Millisecond), "records": len(loaded)}).
			Info("became the writer of the state directory: the previous writer let go")
		return true
	}
}

// changed reports whether uid changed since Open and is not on disk yet.
func (p *Writer) changed(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.pending[uid]
	return ok
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

// Stats are the writer's counters, for metrics and `inspect`.
type Stats struct {
	// Pending is the number of records changed but not yet on disk.
	Pending int
	// Writes counts record files written or removed since Open.
	Writes uint64
	// WriteErrors counts record writes that failed (each is retried).
	WriteErrors uint64
	// LastWriteError is the most recent write error, kept after recovery;
	// empty if there was none.
	LastWriteError string
	// Writing is false while a standby waits for the directory's lock.
	Writing bool
	// CorruptFiles counts files Open set aside into <dir>/corrupt.
	CorruptFiles uint64
	// LastDurable and MaxDurable are the latest and the largest time from a
	// record's first unpersisted change to it being durable.
	LastDurable time.Duration
	MaxDurable  time.Duration
}

// Stats returns the writer's counters.
func (p *Writer) Stats() Stats {
	writing := false
	select {
	case <-p.writing:
		writing = true
	default:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		Writing:        writing,
		Pending:        len(p.pending) + len(p.inflight),
		Writes:         p.writes,
		WriteErrors:    p.writeErrors,
		LastWriteError: p.lastErr,
		CorruptFiles:   p.corrupt,
		LastDurable:    p.lastDurable,
		MaxDurable:     p.maxDurable,
	}
}

// load reads every record file. Temporary files of writes a crash cut
// short are removed; files that cannot be loaded are set aside. Only the
// pods directory being unreadable is an error.
func (p *Writer) load() ([]*record.Record, error) {
	entries, err := os.ReadDir(p.podsDir)
	if err != nil {
		return nil, fmt.Errorf("read state directory %s: %w", p.podsDir, err)
	}
	var loaded []*record.Record
	for _, e := range entries {
		name := e.Name()
		path := filepath.Join(p.podsDir, name)
		switch {
		case atomicfile.IsTemp(name):
			if err := os.Remove(path); err != nil {
				p.log.WithError(err).WithField("file", path).Warn("could not remove the temporary file of an interrupted write")
			} else {
				p.log.WithField("file", path).Info("removed the temporary file of an interrupted write")
			}
			continue
		case e.IsDir() || !strings.HasSuffix(name, record.Ext):
			p.log.WithField("file", path).Debug("ignoring a file that is not a pod record")
			continue
		}
		data, err := nofollow.ReadFile(path)
		var r *record.Record
		if err == nil {
			r, err = record.Load(name, data)
		}
		if err != nil {
			p.setAside(path, name, err)
			continue
		}
		loaded = append(loaded, r)
	}
	return loaded, nil
}

// setAside moves a file that cannot be loaded into the corrupt directory,
// where an operator can look at it, instead of failing or deleting it.
func (p *Writer) setAside(path, name string, why error) {
	p.mu.Lock()
	p.corrupt++
	p.mu.Unlock()
	log := p.log.WithField("file", path).WithField("reason", why.Error())
	err := nofollow.CheckDir(p.corruptDir)
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

// FileError is a record file that ReadDir could not read or decode.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return "record file " + e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// ReadDir reads the records of a state directory without taking its lock, for
// readers such as `podres-proxy inspect`; it works while the writer runs,
// since every file is replaced by a rename and is never seen half written.
// Files that cannot be read or decoded are reported as *FileError and left
// where they are (only the writer sets files aside). Any other error means
// the directory itself could not be read. A state directory without a pods
// directory yet has no records. Records come sorted by namespace, name, uid.
func ReadDir(dir string) ([]*record.Record, []error) {
	podsDir := filepath.Join(dir, podsDirName)
	if err := nofollow.CheckDir(podsDir); err != nil {
		return nil, []error{fmt.Errorf("read state directory %s: %w", dir, err)}
	}
	entries, err := os.ReadDir(podsDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(dir); serr == nil {
				return []*record.Record{}, nil
			}
		}
		return nil, []error{fmt.Errorf("read state directory %s: %w", dir, err)}
	}
	records := []*record.Record{}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if atomicfile.IsTemp(name) || !strings.HasSuffix(name, record.Ext) || e.IsDir() {
			continue
		}
		path := filepath.Join(podsDir, name)
		data, err := nofollow.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // pruned since the directory was listed
		}
		if err != nil {
			errs = append(errs, &FileError{Path: path, Err: err})
			continue
		}
		r, err := record.Load(name, data)
		if err != nil {
			errs = append(errs, &FileError{Path: path, Err: err})
			continue
		}
		records = append(records, r)
	}
	record.Sort(records)
	return records, errs
}
