// Package devinfo writes the Network Plumbing Working Group's device-info
// files for the VFs and RDMA devices podres-proxy reports to pods.
//
// Multus, during CNI ADD, copies the file a device plugin wrote for the
// device it hands to the delegate CNI
// (/var/run/k8s.cni.cncf.io/devinfo/dp/<resource>-<device id>-device.json,
// "/" in either replaced by "-") into the pod's network-status annotation
// as device-info (nadutils.CopyDeviceInfoForCNIFromDP); OVN-Kubernetes
// reads the same file. The SR-IOV device plugin writes them for its own
// devices, but the devices a centralized scheduler allocated (Koordinator's
// koordinator.sh/rdma) have no device plugin, so without this package their
// pods' network-status has no device-info. The file is NPWG device-info
// spec 1.1.0, type "pci": the device's PCI address, its PF's address when it
// is a VF, and its RDMA device (mlx5_3) when it has one, from sysfs (the PF
// from the inventory when sysfs is off or does not show the VF).
//
// The Writer writes a device's file when the proxy answers a pod with it,
// before the answer leaves (Multus reads it right after its List), and
// removes it once no live pod of the state store has the device. It only
// ever touches files it wrote: a file it finds in its place that it did not
// write (a device plugin's) is neither overwritten nor removed. A file is
// created by linking a complete temporary file to its name, which fails if
// the name exists, so a reader never sees part of a file and a concurrent
// writer's file is never replaced.
package devinfo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
	"github.com/podres-proxy/podres-proxy/internal/nofollow"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// DefaultDir is where Multus and OVN-Kubernetes read device plugins'
// device-info files.
const DefaultDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"

// DefaultInterval is how often Run looks for devices no live pod holds.
const DefaultInterval = 5 * time.Second

// Options configure a Writer.
type Options struct {
	// Dir is where files are written; DefaultDir when empty.
	Dir string
	// SysfsRoot is where sysfs is mounted; empty means no sysfs at all
	// (an empty --sysfs-root), and files say what the inventory knows.
	SysfsRoot string
	// Log gets a warning per file that cannot be written or removed, and
	// a debug line per file another writer owns; nil: logrus's standard.
	Log logrus.FieldLogger
	// Inventory translates the devices an allocator named by minor only,
	// as the proxy does, when Release looks for the devices pods hold; it
	// also gives a VF's PF when sysfs is off or does not show the VF. nil
	// translates nothing.
	Inventory func() *inventory.Snapshot
}

// Writer writes and removes device-info files. It is safe for concurrent
// use.
type Writer struct {
	dir, sysfs string
	log        logrus.FieldLogger
	inv        func() *inventory.Snapshot

	// mu guards the fields below and is never held across I/O: the
	// directory is shared, and whatever is at one device's path must not
	// hold up the answers of pods with other devices. I/O on one path is
	// serialized by that path's entry in busy instead.
	mu    sync.Mutex
	owned map[string][]byte // path -> the content written there
	// foreign are paths found taken by another writer, logged once.
	foreign map[string]bool
	// busy holds, for each path whose file a goroutine is reading,
	// writing or removing, a channel closed when it is done.
	busy map[string]chan struct{}
	// releases counts Release calls; wanted[path] is its value when Hold
	// last wanted path's file, so that a Release removes no file that Hold
	// wanted after the Release read the records.
	releases uint64
	wanted   map[string]uint64
}

// New returns a Writer. Nothing is written until Hold.
func New(opts Options) *Writer {
	w := &Writer{
		dir: opts.Dir, sysfs: opts.SysfsRoot, log: opts.Log, inv: opts.Inventory,
		owned: map[string][]byte{}, foreign: map[string]bool{}, busy: map[string]chan struct{}{}, wanted: map[string]uint64{},
	}
	if w.dir == "" {
		w.dir = DefaultDir
	}
	if w.log == nil {
		w.log = logrus.StandardLogger()
	}
	return w
}

// Path returns the file Multus reads for a device id of a resource.
func (w *Writer) Path(resource, id string) string {
	return filepath.Join(w.dir, strings.ReplaceAll(resource, "/", "-")+"-"+strings.ReplaceAll(id, "/", "-")+"-device.json")
}

// Hold writes the file of each VF or RDMA device of devices (what the proxy
// answers the pod with) that has none yet. Failures are logged, never
// returned: an answer is never failed for a missing device-info, which
// Multus treats as optional.
func (w *Writer) Hold(pod model.PodRef, devices []model.Device) {
	for _, d := range devices {
		if !w.Wants(d) {
			continue
		}
		for _, id := range d.IDs {
			if err := w.write(d.Resource, id); err != nil {
				w.log.WithField("pod", pod.String()).WithError(err).Warn("device-info file not written; Multus will show no device-info for it")
			}
		}
	}
}

// write writes the file of one device, unless this writer already did or
// another writer's file is there.
func (w *Writer) write(resource, id string) error {
	if _, ok := inventory.CanonicalPCIAddress(id); !ok {
		return fmt.Errorf("device %s: not a PCI address", id)
	}
	path := w.Path(resource, id)
	data, err := w.content(id)
	if err != nil {
		return err
	}
	defer w.lockPath(path)()
	w.mu.Lock()
	w.wanted[path] = w.releases
	old, ok := w.owned[path]
	w.mu.Unlock()
	if ok {
		if bytes.Equal(old, data) {
			return nil
		}
		// Ours, but sysfs says something else now: replace it, if it is
		// still what we wrote.
		if cur, err := readFile(path); othersFile(err) || err == nil && !bytes.Equal(cur, old) {
			w.own(path, nil) // another writer's now
			return nil
		}
		if err := atomicfile.Write(path, data, 0o644); err != nil {
			return fmt.Errorf("update device-info: %w", err)
		}
		w.own(path, data)
		return nil
	}
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return fmt.Errorf("create the device-info directory: %w", err)
	}
	created, err := atomicfile.Create(path, data, 0o644)
	if err != nil {
		return fmt.Errorf("create device-info: %w", err)
	}
	if created {
		w.own(path, data)
		return nil
	}
	// Someone's file is there: ours from before a restart if it says
	// exactly what we would, else another writer's, which stays.
	if cur, err := readFile(path); err == nil && bytes.Equal(cur, data) {
		w.own(path, data)
		return nil
	}
	w.mu.Lock()
	first := !w.foreign[path]
	w.foreign[path] = true
	w.mu.Unlock()
	if first {
		w.log.WithField("file", path).Debug("a device-info file another writer made is kept as it is")
	}
	return nil
}

// lockPath waits until no other goroutine does I/O on path and keeps
// others from doing so until the function it returns is called.
func (w *Writer) lockPath(path string) (unlock func()) {
	w.mu.Lock()
	for {
		ch, ok := w.busy[path]
		if !ok {
			break
		}
		w.mu.Unlock()
		<-ch
		w.mu.Lock()
	}
	ch := make(chan struct{})
	w.busy[path] = ch
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		delete(w.busy, path)
		w.mu.Unlock()
		close(ch)
	}
}

// own records that path holds data that this writer wrote; nil data: that
// it holds nothing of this writer's. The path is locked (lockPath).
func (w *Writer) own(path string, data []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if data == nil {
		delete(w.owned, path)
		return
	}
	w.owned[path] = data
}

// maxFileBytes bounds the device-info files read back. This writer's are
// about 150 bytes; anything much larger is someone else's and is not read.
const maxFileBytes = 4 << 10

// readFile reads a device-info file as it must be read in a directory that
// device plugins, Multus and anyone with a hostPath of it write into:
// without following a symbolic link (to /dev/zero, or a 200 MiB file),
// without blocking in open (a FIFO), and only when it is a small regular
// file, so that nothing planted there can hang an answer or grow the
// daemon.
func readFile(path string) ([]byte, error) {
	return nofollow.ReadFileMax(path, maxFileBytes)
}

// othersFile reports whether readFile's error says that what is at the
// path is not a file this writer could have written: a symbolic link, not
// a regular file, or too large. Such a file is another writer's.
func othersFile(err error) bool {
	return errors.Is(err, nofollow.ErrSymlink) || errors.Is(err, nofollow.ErrNotRegular) || errors.Is(err, nofollow.ErrTooLarge)
}

// Adopt takes as its own the files of devices of these resources that an
// earlier run of the daemon left (a file named for a device whose content
// is exactly what this writer would write for it), so that Release removes
// those whose pod went while the daemon was down. It returns how many it
// adopted. A file it cannot read, or with other content, is not its own.
func (w *Writer) Adopt(resources ...string) int {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			w.log.WithError(err).Warn("device-info files of an earlier run not looked for")
		}
		return 0
	}
	n := 0
	for _, e := range entries {
		for _, resource := range resources {
			rest, named := strings.CutPrefix(e.Name(), strings.ReplaceAll(resource, "/", "-")+"-")
			id, device := strings.CutSuffix(rest, "-device.json")
			if !named || !device || !e.Type().IsRegular() {
				continue
			}
			if _, pci := inventory.CanonicalPCIAddress(id); !pci {
				continue
			}
			if want, err := w.content(id); err == nil && w.adopt(w.Path(resource, id), want) {
				n++
			}
		}
	}
	return n
}

// adopt takes path as this writer's if it holds exactly want.
func (w *Writer) adopt(path string, want []byte) bool {
	defer w.lockPath(path)()
	if cur, err := readFile(path); err != nil || !bytes.Equal(cur, want) {
		return false
	}
	w.own(path, want)
	return true
}

// Release removes the files this writer wrote whose device no live pod of
// records has (a running or pending pod the kubelet does not consider
// finished, with the device among its decoded devices), and returns how
// many it removed. A file changed by someone else since is left alone.
// records is called with the writer locked, so that a pod answered
// meanwhile, whose record the store has before the proxy answers it, is
// either among them or wanted by Hold after them, which keeps its file;
// the files are then read and removed without the lock, one path at a
// time.
func (w *Writer) Release(records func() []*record.Record) int {
	w.mu.Lock()
	w.releases++
	gen := w.releases
	var inv *inventory.Snapshot
	if w.inv != nil {
		inv = w.inv()
	}
	held := map[string]bool{}
	for _, r := range records() {
		if !live(r) {
			continue
		}
		devs, _ := allocator.Translate(r.Devices, inv)
		for _, d := range devids.NormalizeIDs(devs) {
			if !w.Wants(d) {
				continue
			}
			for _, id := range d.IDs {
				held[w.Path(d.Resource, id)] = true
			}
		}
	}
	var unheld []string
	for path := range w.owned {
		if !held[path] {
			unheld = append(unheld, path)
		}
	}
	// Only an owned file's wanted mark matters to a Release: a file Hold
	// is creating now is owned only after the records were read, so this
	// Release leaves it alone anyway.
	for path := range w.wanted {
		if _, ok := w.owned[path]; !ok {
			delete(w.wanted, path)
		}
	}
	w.mu.Unlock()
	n := 0
	for _, path := range unheld {
		if w.release(path, gen) {
			n++
		}
	}
	return n
}

// release removes path, a file this writer wrote whose device no live pod
// held when Release number gen read the records, unless Hold wanted it
// since or someone else changed it; it reports whether it removed it.
func (w *Writer) release(path string, gen uint64) bool {
	defer w.lockPath(path)()
	w.mu.Lock()
	data, ok := w.owned[path]
	if !ok || w.wanted[path] >= gen {
		w.mu.Unlock()
		return false
	}
	delete(w.wanted, path)
	w.mu.Unlock()
	cur, err := readFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist), othersFile(err):
	case err != nil:
		w.log.WithField("file", path).WithError(err).Warn("device-info file not removed")
		return false
	case !bytes.Equal(cur, data):
		// Another writer replaced it: theirs now.
	default:
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			w.log.WithField("file", path).WithError(err).Warn("device-info file not removed")
			return false
		}
		w.own(path, nil)
		return true
	}
	w.own(path, nil)
	return false
}

// live reports whether a record's pod can still hold devices.
func live(r *record.Record) bool {
	if r.KubeletPhase == "Succeeded" || r.KubeletPhase == "Failed" {
		return false
	}
	return r.State == record.PhaseReady || r.State == record.PhasePending
}

// Run releases the files of devices no live pod holds whenever the store
// has changed, checking every interval (DefaultInterval when not positive),
// until ctx is done; it returns ctx's error.
func (w *Writer) Run(ctx context.Context, store *state.Store, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var seen uint64
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		if v := store.Version(); v != seen {
			seen = v
			w.Release(store.Records)
		}
	}
}
