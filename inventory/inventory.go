package inventory

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
)

// Source is one place devices are learned from.
type Source interface {
	// Name names the source in logs and in Device.Source.
	Name() string
	// Interval is how often Run asks the source again.
	Interval() time.Duration
	// Load returns the devices the source knows now. An error wrapping
	// ErrAbsent means the source has no devices (the Device object or the
	// file does not exist): the source's devices are dropped and the reason
	// is logged at info level. Any other error keeps the source's last good
	// answer and is logged as an error. Load is never called concurrently
	// with itself; it must honour ctx.
	Load(ctx context.Context) ([]Device, error)
}

// Notifier is a Source that says when its answer may have changed: one
// that keeps a watch on the API server. Run loads it again at each change
// (a load reads what the watch keeps, never the API server), as well as at
// its Interval when that is not 0.
type Notifier interface {
	Source
	// Changed returns a channel closed when Load's answer may differ from
	// the one it gave before the channel was returned.
	Changed() <-chan struct{}
}

// ErrAbsent marks a Source's answer "there is nothing here", which is not a
// failure: a node without Koordinator has no Device object.
var ErrAbsent = errors.New("absent")

// Options configure an Inventory.
type Options struct {
	// Sources in order of precedence, highest first (see the package doc).
	Sources []Source
	// Logger receives source failures and inventory changes; nil means
	// logrus's standard logger.
	Logger logrus.FieldLogger
}

// Inventory merges its sources' last good answers into a Snapshot and keeps
// them fresh. Its methods are safe for concurrent use.
type Inventory struct {
	sources []*sourceState
	log     logrus.FieldLogger

	current atomic.Pointer[Snapshot]

	mu      sync.Mutex // guards changed and the sources' devices
	changed chan struct{}
}

// sourceState is what the Inventory keeps per source.
type sourceState struct {
	src    Source
	loadMu sync.Mutex // serializes Load calls
	// Guarded by Inventory.mu:
	devices []Device
	lastErr string // the last error (or absence) logged, to log changes only
	loaded  bool   // a load has completed (Refresh or Run)
}

// New returns an Inventory with an empty snapshot. Call Refresh to load the
// sources once, Run to keep them fresh.
func New(opts Options) *Inventory {
	inv := &Inventory{log: opts.Logger, changed: make(chan struct{})}
	if inv.log == nil {
		inv.log = logrus.StandardLogger()
	}
	for _, s := range opts.Sources {
		inv.sources = append(inv.sources, &sourceState{src: s})
	}
	inv.current.Store(NewSnapshot(nil))
	return inv
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

// Snapshot returns the current inventory; never nil. Callers asking several
// questions that must agree ask one Snapshot.
func (inv *Inventory) Snapshot() *Snapshot { return inv.current.Load() }

// Changed returns a channel that is closed the next time the snapshot
// changes, so that callers (and tests) wait for an event, not a timer.
func (inv *Inventory) Changed() <-chan struct{} {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return inv.changed
}

// Refresh loads every source once, concurrently, and returns when all have
// answered. Failures are logged, never returned: a failing source keeps its
// last good answer and the others still count. The daemon calls it before
// serving so that the first GetAllocatableResources (NFD asks only once)
// sees the inventory.
func (inv *Inventory) Refresh(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range inv.sources {
		wg.Go(func() { inv.refresh(ctx, s) })
	}
	wg.Wait()
}

// Run loads every source now, unless Refresh already did (the daemon
// refreshes once before serving: the API server and sysfs are not asked
// twice), then again at its interval and, for a Notifier, at each change,
// until ctx is done; it returns ctx's
// error after all its goroutines have stopped.
func (inv *Inventory) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, s := range inv.sources {
		wg.Go(func() {
			inv.mu.Lock()
			loaded := s.loaded
			inv.mu.Unlock()
			if !loaded {
				inv.refresh(ctx, s)
			}
			var changed func() <-chan struct{}
			if n, ok := s.src.(Notifier); ok {
				changed = n.Changed
			}
			interval := s.src.Interval()
			if interval <= 0 && changed == nil {
				return // loaded once: the source never changes
			}
			var tick <-chan time.Time
			if interval > 0 {
				t := time.NewTicker(interval)
				defer t.Stop()
				tick = t.C
			}
			for {
				var change <-chan struct{}
				if changed != nil {
					// Asked before the load, so that no change after
					// Refresh's load is missed.
					change = changed()
					inv.refresh(ctx, s)
				}
				select {
				case <-ctx.Done():
					return
				case <-tick:
					if changed == nil {
						inv.refresh(ctx, s)
					}
				case <-change:
				}
			}
		})
	}
	wg.Wait()
	return ctx.Err()
}

// refresh loads one source and publishes a new snapshot if the merged
// inventory changed.
func (inv *Inventory) refresh(ctx context.Context, s *sourceState) {
	s.loadMu.Lock()
	devices, err := safeLoad(ctx, s.src)
	s.loadMu.Unlock()
	if err != nil && ctx.Err() != nil {
		return // shutting down: not the source's fault
	}

	inv.mu.Lock()
	defer inv.mu.Unlock()
	s.loaded = true
	log := inv.log.WithField("source", s.src.Name())
	switch {
	case err == nil:
		if s.lastErr != "" {
			log.Info("inventory source answers again")
		}
		s.lastErr = ""
		s.devices = withSource(devices, s.src.Name())
	case errors.Is(err, ErrAbsent):
		if msg := err.Error(); msg != s.lastErr {
			log.Infof("inventory source has no devices: %v", err)
			s.lastErr = msg
		}
		s.devices = nil
	default:
		if msg := err.Error(); msg != s.lastErr {
			log.WithError(err).Errorf("inventory source failed; keeping its last good answer (%d devices) and serving with the other sources", len(s.devices))
			s.lastErr = msg
		}
		return
	}

	lists := make([][]Device, 0, len(inv.sources))
	for _, st := range inv.sources {
		lists = append(lists, st.devices)
	}
	next := NewSnapshot(merge(lists...))
	if reflect.DeepEqual(next.devices, inv.current.Load().devices) {
		return
	}
	inv.current.Store(next)
	close(inv.changed)
	inv.changed = make(chan struct{})
	inv.log.WithField("devices", summary(next.devices)).Info("device inventory changed")
}

// safeLoad turns a panic in a source into an error: the inventory is an
// addition to the kubelet's answer and must never take the daemon down.
func safeLoad(ctx context.Context, src Source) (devices []Device, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("inventory source %s panicked: %v", src.Name(), r)
		}
	}()
	return src.Load(ctx)
}

// withSource marks a source's devices, and the NUMA nodes it reported, as
// coming from it.
func withSource(devices []Device, name string) []Device {
	out := make([]Device, len(devices))
	for i, d := range devices {
		out[i] = d.clone()
		out[i].Source = name
		out[i].NUMASource = sourceOf(d.NUMANode, name)
		for j := range out[i].VFs {
			out[i].VFs[j].NUMASource = sourceOf(out[i].VFs[j].NUMANode, name)
		}
	}
	return out
}

func sourceOf(numa *int64, name string) string {
	if numa == nil {
		return ""
	}
	return name
}

// summary counts devices per type for the change log line.
func summary(devices []Device) map[string]int {
	m := make(map[string]int)
	for _, d := range devices {
		m[d.Type]++
		if len(d.VFs) > 0 {
			m[d.Type+"-vf"] += len(d.VFs)
		}
	}
	return m
}
