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
// is a VF, and its RDMA device (mlx5_3) when it has one, from sysfs.
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
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
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

// SpecVersion is the NPWG device-info spec version written.
const SpecVersion = "1.1.0"

// Info is a device-info file's content (NPWG device-info spec 1.1.0,
// type pci; the field names are the spec's).
type Info struct {
	Type    string `json:"type"`
	Version string `json:"version"`
	PCI     PCI    `json:"pci"`
}

// PCI is the pci member of Info.
type PCI struct {
	PCIAddress   string `json:"pci-address"`
	RDMADevice   string `json:"rdma-device,omitempty"`
	PFPCIAddress string `json:"pf-pci-address,omitempty"`
}

// Options configure a Writer.
type Options struct {
	// Dir is where files are written; DefaultDir when empty.
	Dir string
	// SysfsRoot is where sysfs is mounted; "/sys" when empty.
	SysfsRoot string
	// Log gets a warning per file that cannot be written or removed, and
	// a debug line per file another writer owns; nil: logrus's standard.
	Log logrus.FieldLogger
	// Inventory translates the devices an allocator named by minor only,
	// as the proxy does, when Release looks for the devices pods hold;
	// nil translates nothing.
	Inventory func() *inventory.Snapshot
}

// Writer writes and removes device-info files. It is safe for concurrent
// use.
type Writer struct {
	dir, sysfs string
	log        logrus.FieldLogger
	inv        func() *inventory.Snapshot

	mu    sync.Mutex
	owned map[string][]byte // path -> the content written there
	// foreign are paths found taken by another writer, logged once.
	foreign map[string]bool
}

// New returns a Writer. Nothing is written until Hold.
func New(opts Options) *Writer {
	w := &Writer{dir: opts.Dir, sysfs: opts.SysfsRoot, log: opts.Log, inv: opts.Inventory, owned: map[string][]byte{}, foreign: map[string]bool{}}
	if w.dir == "" {
		w.dir = DefaultDir
	}
	if w.sysfs == "" {
		w.sysfs = "/sys"
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

// wanted reports whether a device gets device-info files: an RDMA NIC or
// VF (a PCI device Multus hands to sriov-cni, rdma-cni or host-device).
func wanted(d model.Device) bool { return d.Type == inventory.TypeRDMA }

// Hold writes the file of each VF or RDMA device of devices (what the proxy
// answers the pod with) that has none yet. Failures are logged, never
// returned: an answer is never failed for a missing device-info, which
// Multus treats as optional.
func (w *Writer) Hold(pod model.PodRef, devices []model.Device) {
	for _, d := range devices {
		if !wanted(d) {
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
	data, err := json.Marshal(w.info(id))
	if err != nil {
		return fmt.Errorf("encode the device-info of %s: %w", id, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.owned[path]; ok {
		if bytes.Equal(old, data) {
			return nil
		}
		// Ours, but sysfs says something else now: replace it, if it is
		// still what we wrote.
		if cur, err := os.ReadFile(path); err == nil && !bytes.Equal(cur, old) {
			delete(w.owned, path)
			return nil // another writer's now
		}
		if err := atomicfile.Write(path, data, 0o644); err != nil {
			return fmt.Errorf("update device-info: %w", err)
		}
		w.owned[path] = data
		return nil
	}
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return fmt.Errorf("create the device-info directory: %w", err)
	}
	created, err := createNew(path, data)
	if err != nil {
		return err
	}
	if created {
		w.owned[path] = data
		return nil
	}
	// Someone's file is there: ours from before a restart if it says
	// exactly what we would, else another writer's, which stays.
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		w.owned[path] = data
		return nil
	}
	if !w.foreign[path] {
		w.foreign[path] = true
		w.log.WithField("file", path).Debug("a device-info file another writer made is kept as it is")
	}
	return nil
}

// createNew creates path with data unless it exists: a complete temporary
// file is linked to the name, which fails if the name is taken.
func createNew(path string, data []byte) (created bool, err error) {
	dir, name := filepath.Split(path)
	f, err := os.CreateTemp(dir, atomicfile.TempPattern(name))
	if err != nil {
		return false, fmt.Errorf("create device-info %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return false, fmt.Errorf("write device-info %s: %w", path, err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return false, fmt.Errorf("write device-info %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return false, fmt.Errorf("sync device-info %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return false, fmt.Errorf("write device-info %s: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("create device-info %s: %w", path, err)
	}
	return true, nil
}

// info reads what sysfs says about a PCI device: its PF (a VF's physfn
// link) and its RDMA device (the entry of its infiniband directory).
// Whatever sysfs does not say is left out.
func (w *Writer) info(id string) Info {
	addr, _ := inventory.CanonicalPCIAddress(id)
	in := Info{Type: "pci", Version: SpecVersion, PCI: PCI{PCIAddress: addr}}
	dev := filepath.Join(w.sysfs, "bus", "pci", "devices", addr)
	if target, err := os.Readlink(filepath.Join(dev, "physfn")); err == nil {
		if pf, ok := inventory.CanonicalPCIAddress(filepath.Base(target)); ok {
			in.PCI.PFPCIAddress = pf
		}
	}
	if entries, err := os.ReadDir(filepath.Join(dev, "infiniband")); err == nil && len(entries) > 0 {
		names := make([]string, 0, len(entries))
		for _, e := range entries {
			names = append(names, e.Name())
		}
		slices.Sort(names)
		in.PCI.RDMADevice = names[0]
	}
	return in
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
	w.mu.Lock()
	defer w.mu.Unlock()
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
			path := w.Path(resource, id)
			want, err := json.Marshal(w.info(id))
			if err != nil {
				continue
			}
			if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, want) {
				w.owned[path] = want
				n++
			}
		}
	}
	return n
}

// Release removes the files this writer wrote whose device no live pod of
// records has (a running or pending pod the kubelet does not consider
// finished, with the device among its decoded devices), and returns how
// many it removed. A file changed by someone else since is left alone.
// records is called with the writer locked, so that a pod answered
// meanwhile, whose record the store has before the proxy answers it, is
// either among them or written after the release.
func (w *Writer) Release(records func() []*record.Record) int {
	w.mu.Lock()
	defer w.mu.Unlock()
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
		for _, d := range allocator.NormalizeIDs(devs) {
			if !wanted(d) {
				continue
			}
			for _, id := range d.IDs {
				held[w.Path(d.Resource, id)] = true
			}
		}
	}
	n := 0
	for path, data := range w.owned {
		if held[path] {
			continue
		}
		cur, err := os.ReadFile(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			w.log.WithField("file", path).WithError(err).Warn("device-info file not removed")
			continue
		case !bytes.Equal(cur, data):
			// Another writer replaced it: theirs now.
		default:
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				w.log.WithField("file", path).WithError(err).Warn("device-info file not removed")
				continue
			}
			n++
		}
		delete(w.owned, path)
	}
	return n
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
