// Package publish writes the device inventory serve sees to a file in its
// state directory (docs/inventory.md), and reads it back, for the commands
// that cannot ask the daemon: inspect and query --sources read it to say
// on which NUMA node a device is and which source said so. The file is
// replaced atomically at start and after every change.
package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
	"github.com/podres-proxy/podres-proxy/internal/nofollow"
	"github.com/podres-proxy/podres-proxy/inventory"
)

// FileName is the name of the file, in serve's state directory,
// that holds the inventory as serve last saw it (docs/inventory.md).
const FileName = "inventory.json"

// Version is the version of the published file's format. It
// changes when a field is removed or changes meaning; readers ignore fields
// they do not know, so adding one does not change it.
const Version = 1

// File is the inventory as the daemon published it for readers that
// cannot ask it: `podres-proxy inspect` and `query --sources` read it to say
// on which NUMA node a device is and which source said so.
type File struct {
	// Version is Version when written.
	Version int `json:"version"`
	// WrittenAt is when the daemon wrote the file: at start and after every
	// change of the inventory.
	WrittenAt time.Time `json:"writtenAt"`
	// Sources are the sources the daemon was configured with, highest
	// precedence first.
	Sources []string `json:"sources"`
	// Devices are the merged inventory, each with the source that reported
	// it and the source of its NUMA node.
	Devices []inventory.Device `json:"devices"`
}

// Snapshot returns a snapshot of the published devices, to look them up by
// id as the daemon did.
func (p *File) Snapshot() *inventory.Snapshot { return inventory.NewSnapshot(p.Devices) }

// maxFileSize bounds what Read reads: an inventory of a few hundred devices
// is a few tens of KiB.
const maxFileSize = 4 << 20

// Read reads a published file. It takes no lock: the file is
// replaced by a rename, so it is always complete. A file of another version
// is an error, not a guess. It lives in the state directory, so a symbolic
// link planted there is not followed (inspect and query run as root).
func Read(path string) (*File, error) {
	data, err := nofollow.ReadFileMax(path, maxFileSize)
	if err != nil {
		return nil, err
	}
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	if head.Version == nil || *head.Version != Version {
		v := "none"
		if head.Version != nil {
			v = fmt.Sprint(*head.Version)
		}
		return nil, fmt.Errorf("%s: version %s, this podres-proxy reads version %d", path, v, Version)
	}
	var p File
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	return &p, nil
}

// Write writes p to path atomically, so that readers without a
// lock see the old content or the new one: a temporary file in the same
// directory is written and fsynced, renamed over path, and the directory is
// fsynced. The file is indented JSON with a final newline, mode 0640 like
// the state store's records.
func Write(path string, p *File) (err error) {
	c := *p
	if c.Sources == nil {
		c.Sources = []string{}
	}
	if c.Devices == nil {
		c.Devices = []inventory.Device{}
	}
	data, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the inventory: %w", err)
	}
	data = append(data, '\n')
	if err := atomicfile.Write(path, data, 0o640); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}

// Retry delays of a Publisher whose write failed.
const (
	retryMin = time.Second
	retryMax = time.Minute
)

// Publisher keeps a published file in step with an Inventory: the daemon
// publishes once before serving, so that readers find the inventory as soon
// as the daemon is ready, then runs it to publish every change.
type Publisher struct {
	inv  *inventory.Inventory
	path string
	log  logrus.FieldLogger

	mu      sync.Mutex          // serializes writes and guards the fields below
	last    *inventory.Snapshot // the snapshot the file holds; nil before the first write
	lastErr string              // the last write error logged, to log changes only
}

// New returns a Publisher writing inv's snapshots to path and logging its
// failures to log; nil means logrus's standard logger.
func New(inv *inventory.Inventory, path string, log logrus.FieldLogger) *Publisher {
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &Publisher{inv: inv, path: path, log: log}
}

// Publish writes the current snapshot unless the file already holds it.
// Temporary files that a crash left next to path are removed first: only
// the state directory's single writer publishes there.
func (p *Publisher) Publish() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	snap := p.inv.Snapshot()
	if snap == p.last {
		return nil
	}
	if p.last == nil {
		p.removeTemporaryFiles()
	}
	err := Write(p.path, &File{
		Version:   Version,
		WrittenAt: time.Now().UTC(),
		Sources:   p.inv.Sources(),
		Devices:   snap.Devices(),
	})
	if err == nil {
		p.last = snap
		if p.lastErr != "" {
			p.log.WithField("file", p.path).Info("inventory file written again")
		}
		p.lastErr = ""
	} else if msg := err.Error(); msg != p.lastErr {
		p.log.WithError(err).WithField("file", p.path).Error("cannot write the inventory file for inspect and query; retrying")
		p.lastErr = msg
	}
	if err != nil {
		return fmt.Errorf("publish the inventory: %w", err)
	}
	return nil
}

func (p *Publisher) removeTemporaryFiles() {
	dir, name := filepath.Split(p.path)
	stale, _ := filepath.Glob(filepath.Join(dir, atomicfile.TempPattern(name)))
	for _, f := range stale {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.log.WithError(err).WithField("file", f).Warn("could not remove the temporary file of an interrupted write")
		}
	}
}

// Run publishes now and after every change of the inventory until ctx is
// done, and returns ctx's error. A failed write is logged and retried, with
// a delay doubling from a second to a minute, until it succeeds or the
// inventory changes again; it never stops the daemon, since the file only
// serves operators.
func (p *Publisher) Run(ctx context.Context) error {
	delay := retryMin
	for {
		// Take the channel before the snapshot Publish reads, so that a
		// change between the two is never missed.
		changed := p.inv.Changed()
		var retry <-chan time.Time
		if err := p.Publish(); err != nil {
			retry = time.After(delay) // collected when abandoned (Go 1.23)
			delay = min(2*delay, retryMax)
		} else {
			delay = retryMin
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-retry:
		}
	}
}
