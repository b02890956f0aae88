package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"

	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
)

// PublishedFileName is the name of the file, in serve's state directory,
// that holds the inventory as serve last saw it (docs/inventory.md).
const PublishedFileName = "inventory.json"

// PublishedVersion is the version of the published file's format. It
// changes when a field is removed or changes meaning; readers ignore fields
// they do not know, so adding one does not change it.
const PublishedVersion = 1

// Published is the inventory as the daemon published it for readers that
// cannot ask it: `podres-proxy inspect` and `query --sources` read it to say
// on which NUMA node a device is and which source said so.
type Published struct {
	// Version is PublishedVersion when written.
	Version int `json:"version"`
	// WrittenAt is when the daemon wrote the file: at start and after every
	// change of the inventory.
	WrittenAt time.Time `json:"writtenAt"`
	// Sources are the sources the daemon was configured with, highest
	// precedence first.
	Sources []string `json:"sources"`
	// Devices are the merged inventory, each with the source that reported
	// it and the source of its NUMA node.
	Devices []Device `json:"devices"`
}

// Snapshot returns a snapshot of the published devices, to look them up by
// id as the daemon did.
func (p *Published) Snapshot() *Snapshot { return NewSnapshot(p.Devices) }

// ReadPublished reads a published file. It takes no lock: the file is
// replaced by a rename, so it is always complete. A file of another version
// is an error, not a guess. It lives in the state directory, so a symbolic
// link planted there is not followed (inspect and query run as root).
func ReadPublished(path string) (*Published, error) {
	data, err := readLimitedFlags(path, maxFileSize, syscall.O_NOFOLLOW|syscall.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("%s: %w", path, jsonError(data, err))
	}
	if head.Version == nil || *head.Version != PublishedVersion {
		v := "none"
		if head.Version != nil {
			v = fmt.Sprint(*head.Version)
		}
		return nil, fmt.Errorf("%s: version %s, this podres-proxy reads version %d", path, v, PublishedVersion)
	}
	var p Published
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("%s: %w", path, jsonError(data, err))
	}
	return &p, nil
}

// WritePublished writes p to path atomically, so that readers without a
// lock see the old content or the new one: a temporary file in the same
// directory is written and fsynced, renamed over path, and the directory is
// fsynced. The file is indented JSON with a final newline, mode 0640 like
// the state store's records.
func WritePublished(path string, p *Published) (err error) {
	c := *p
	if c.Sources == nil {
		c.Sources = []string{}
	}
	if c.Devices == nil {
		c.Devices = []Device{}
	}
	data, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the inventory: %w", err)
	}
	data = append(data, '\n')
	if err := atomicfile.Write(path, data, 0o640, nil); err != nil {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}

// Sources returns the names of the inventory's sources, highest precedence
// first.
func (inv *Inventory) Sources() []string {
	names := make([]string, len(inv.sources))
	for i, s := range inv.sources {
		names[i] = s.src.Name()
	}
	return names
}

// Retry delays of a Publisher whose write failed.
const (
	publishRetryMin = time.Second
	publishRetryMax = time.Minute
)

// Publisher keeps a published file in step with an Inventory: the daemon
// publishes once before serving, so that readers find the inventory as soon
// as the daemon is ready, then runs it to publish every change.
type Publisher struct {
	inv      *Inventory
	path     string
	clock    clock.PassiveClock
	retryMin time.Duration

	mu      sync.Mutex // serializes writes and guards the fields below
	last    *Snapshot  // the snapshot the file holds; nil before the first write
	lastErr string     // the last write error logged, to log changes only

	// written, when set (by tests), is called after each write attempt.
	written func(*Snapshot, error)
}

// NewPublisher returns a Publisher writing inv's snapshots to path.
func NewPublisher(inv *Inventory, path string) *Publisher {
	return &Publisher{inv: inv, path: path, clock: clock.RealClock{}, retryMin: publishRetryMin}
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
	err := WritePublished(p.path, &Published{
		Version:   PublishedVersion,
		WrittenAt: p.clock.Now().UTC(),
		Sources:   p.inv.Sources(),
		Devices:   snap.Devices(),
	})
	if err == nil {
		p.last = snap
		if p.lastErr != "" {
			p.inv.log.WithField("file", p.path).Info("inventory file written again")
		}
		p.lastErr = ""
	} else if msg := err.Error(); msg != p.lastErr {
		p.inv.log.WithError(err).WithField("file", p.path).Error("cannot write the inventory file for inspect and query; retrying")
		p.lastErr = msg
	}
	if p.written != nil {
		p.written(snap, err)
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
			p.inv.log.WithError(err).WithField("file", f).Warn("could not remove the temporary file of an interrupted write")
		}
	}
}

// Run publishes now and after every change of the inventory until ctx is
// done, and returns ctx's error. A failed write is logged and retried, with
// a delay doubling from a second to a minute, until it succeeds or the
// inventory changes again; it never stops the daemon, since the file only
// serves operators.
func (p *Publisher) Run(ctx context.Context) error {
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: p.retryMin, Factor: 2, Cap: publishRetryMax, Steps: math.MaxInt32}
	}
	backoff := newBackoff()
	for {
		// Take the channel before the snapshot Publish reads, so that a
		// change between the two is never missed.
		changed := p.inv.Changed()
		var retry *time.Timer
		var retryC <-chan time.Time
		if err := p.Publish(); err != nil {
			retry = time.NewTimer(backoff.Step())
			retryC = retry.C
		} else {
			backoff = newBackoff()
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-retryC:
		}
		if retry != nil {
			retry.Stop()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}
