package podlogs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podres-proxy/podres-proxy/internal/coalesce"
	"github.com/podres-proxy/podres-proxy/model"
)

// The directory's entries, <namespace>_<name>_<uid>, also say which UID a
// name is: the kubelet makes the entry of a pod it admitted before it asks
// for the pod's sandbox, so before the sandbox's CNI ADD, and it starts a
// pod recreated under a name (not a static pod) without waiting for its
// predecessor's sandbox to go. A running record of that name is then no
// longer the pod PodResources means by it, which a stat alone cannot tell
// from any other pod's sandbox beginning.

// MaxEntries bounds how many entries a read of the directory takes: far
// more than a node holds pods (the kubelet's maxPods, and finished pods
// until they are deleted). A directory with more says nothing (Newest).
const MaxEntries = 16384

// Names is one read of the directory's entries: for each pod name, the
// UIDs the kubelet made a directory for and when each last changed. It is
// immutable and shared by the queries that asked while it was current.
type Names struct {
	stamp  Stamp // the directory before the read
	err    error // why the read said nothing
	byName map[model.PodKey][]entry
}

type entry struct {
	uid   string
	ctime int64 // nanoseconds since the epoch
}

// NewestAfter returns the UID the newest entry of key gives the name,
// among the entries that changed at or after since's ctime (all of them
// when since is not a stamp of the same directory): what the directory
// says beyond a /pods read taken after since, which saw every pod whose
// entry is older; and at or after after too (all of them when it is zero):
// what the directory says beyond the moment a source last said which UID
// the name is (a watch event, a sandbox beginning). It returns "" when the
// directory says nothing beyond them of that name, and doubt when it
// cannot tell: two UIDs whose entries changed at the same time, or a read
// that failed and is not older than since.
func (n *Names) NewestAfter(key model.PodKey, since Stamp, after time.Time) (uid string, doubt bool) {
	comparable := since.ok && n.stamp.ok && since.dev == n.stamp.dev && since.ino == n.stamp.ino
	if n.err != nil {
		// The read's error is overtaken by a /pods read stamped after
		// it, on a directory that did not change in between.
		return "", !comparable || since.ctime != n.stamp.ctime || since.at.Before(n.stamp.at)
	}
	var newest int64
	for _, e := range n.byName[key] {
		switch {
		case comparable && e.ctime < since.ctime:
			continue // the /pods read saw its pod
		case !after.IsZero() && e.ctime < after.UnixNano():
			continue // older than what a source said since
		case uid == "" || e.ctime > newest:
			uid, newest, doubt = e.uid, e.ctime, false
		case e.ctime == newest && e.uid != uid:
			doubt = true
		}
	}
	if doubt {
		return "", true
	}
	return uid, false
}

// readNames reads the directory's entries after taking its stamp. Only
// directories count: an entry of another type, or a name that is not
// <namespace>_<name>_<uid>, is none of the kubelet's pods. No link is
// followed.
func (d *Dir) readNames() *Names {
	s, err := d.Stamp()
	n := &Names{stamp: s, byName: map[model.PodKey][]entry{}}
	if err != nil {
		n.err = err
		return n
	}
	fd, err := unix.Open(d.path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		n.err = fmt.Errorf("reading pod logs directory %s: %w", d.path, err)
		return n
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	count := 0
	for {
		batch, err := f.ReadDir(256)
		count += len(batch)
		if count > MaxEntries {
			n.err = fmt.Errorf("reading pod logs directory %s: more than %d entries", d.path, MaxEntries)
			return n
		}
		for _, de := range batch {
			key, uid, ok := parseEntry(de.Name())
			if !ok || !de.IsDir() {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd, de.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				continue // removed since (log garbage collection), or replaced
			}
			n.byName[key] = append(n.byName[key], entry{uid: uid, ctime: st.Ctim.Nano()})
		}
		if errors.Is(err, io.EOF) {
			return n
		}
		if err != nil {
			n.err = fmt.Errorf("reading pod logs directory %s: %w", d.path, err)
			return n
		}
	}
}

// parseEntry splits <namespace>_<name>_<uid>: a namespace (a DNS label), a
// pod name (a DNS subdomain) and a UID hold no underscore.
func parseEntry(s string) (model.PodKey, string, bool) {
	parts := strings.Split(s, "_")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return model.PodKey{}, "", false
	}
	return model.PodKey{Namespace: parts[0], Name: parts[1]}, parts[2], true
}

// NameReader shares reads of the directory's entries: one read while the
// directory stays as it was (a settled stamp, see Settle), and one at a
// time for concurrent callers when it changed (package coalesce), so a
// steady node reads it never and a burst of queries once or twice.
type NameReader struct {
	d     *Dir
	reads *coalesce.Group[*Names]

	mu   sync.Mutex
	last *Names
}

// readTimeout bounds a read of the directory: a local readdir, which a
// hung filesystem (a network mount) must not hold every query on.
const readTimeout = 5 * time.Second

// NewNameReader returns the NameReader of d; nil for a nil d.
func NewNameReader(d *Dir) *NameReader {
	if d == nil {
		return nil
	}
	r := &NameReader{d: d}
	r.reads = coalesce.New(func(context.Context, time.Time) (*Names, error) {
		n := d.readNames()
		r.mu.Lock()
		if r.last == nil || !n.stamp.at.Before(r.last.stamp.at) {
			r.last = n
		}
		r.mu.Unlock()
		return n, nil
	}, coalesce.Options{Name: "pod logs directory read", Timeout: readTimeout, Clock: d.clock})
	return r
}

// Read returns a read of the directory's entries that shows it as it was
// at now (a stamp the caller took) or later: the last one while the
// directory is unchanged since it, else a shared new one. A read it could
// not wait for says nothing of any name.
func (r *NameReader) Read(ctx context.Context, now Stamp) *Names {
	r.mu.Lock()
	last := r.last
	r.mu.Unlock()
	if last != nil && last.err == nil && last.stamp.Unchanged(now) {
		return last
	}
	n, err := r.reads.Do(ctx, now.at.Add(-time.Nanosecond))
	if err != nil {
		return &Names{stamp: now, err: fmt.Errorf("reading pod logs directory %s: %w", r.d.path, err)}
	}
	return n
}
