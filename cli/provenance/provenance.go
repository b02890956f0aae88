// Package provenance says where each device of a PodResources answer came
// from, and where its NUMA node came from: the kubelet's own answer, the
// allocator whose annotation serve's state store decoded it from, or the
// inventory source that reported it. query --sources labels answers with
// it, and inspect shows where the inventory serve published puts each
// device of the state store.
package provenance

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/inventory/publish"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Where a device and its NUMA node came from, as inspect and query
// --sources name it: the allocator names of model.Device.Allocator, the
// inventory sources of inventory.Device.Source, and these.
const (
	// Kubelet: the kubelet's own answer has the device (its device
	// plugin's); its NUMA node is the kubelet's too.
	Kubelet = "kubelet"
	// Unknown: neither the kubelet nor the state store accounts for it,
	// or they could not be asked.
	Unknown = "unknown"
)

// ErrNoInventoryFile is returned, with the file's path, by ReadInventory
// when serve has not written the file (an older serve, or none ever ran on
// this directory).
var ErrNoInventoryFile = errors.New("no inventory file (podres-proxy serve writes it at start)")

// ReadInventory reads the inventory serve published in a state directory,
// and returns the file's path.
func ReadInventory(stateDir string) (*publish.File, string, error) {
	path := filepath.Join(stateDir, publish.FileName)
	p, err := publish.Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, path, fmt.Errorf("%s: %w", path, ErrNoInventoryFile)
	}
	return p, path, err
}

// ReadRecords reads the records of serve's state store in dir, without a
// lock. A file that cannot be read is passed to warn and left out; the
// error is the directory's own.
func ReadRecords(dir string, warn func(error)) ([]*record.Record, error) {
	records, errs := persist.ReadDir(dir)
	for _, err := range errs {
		var fe *persist.FileError
		if !errors.As(err, &fe) {
			return nil, err
		}
		warn(err)
	}
	return records, nil
}

// recordOf picks the record that stands for a pod known only by namespace
// and name, as PodResources answers name pods: the one live record, as the
// proxy does; else the newest one not stopped or removed (a pod being
// created, which the proxy answers from a fresh /pods read of the same
// annotations); else the newest. nil when there is none.
func recordOf(records []*record.Record, key model.PodKey) *record.Record {
	var live, current, newest *record.Record
	lives := 0
	for _, r := range records {
		if r.Key() != key {
			continue
		}
		if r.Live() {
			live = r
			lives++
		}
		if r.State != record.PhaseStopped && r.State != record.PhaseRemoved && (current == nil || r.UpdatedAt.After(current.UpdatedAt)) {
			current = r
		}
		if newest == nil || r.UpdatedAt.After(newest.UpdatedAt) {
			newest = r
		}
	}
	switch {
	case lives == 1:
		return live
	case current != nil:
		return current
	}
	return newest
}

// allocatorOf returns the allocator of the record's device with this
// resource and id, after translating devices named by minor or index
// through the inventory as the proxy does; "" when the record has none.
func allocatorOf(rec *record.Record, inv *inventory.Snapshot, resource, id string) string {
	if rec == nil {
		return ""
	}
	// The proxy answers ids as consumers spell them, a shared GPU's other
	// sharers as <uuid>::<slot>, and MIG instances perhaps under
	// --mig-resource-name (devids.NormalizeID, trust/sharedgpu.go,
	// allocator/devids/mig.go).
	base, _, _ := strings.Cut(id, "::")
	devs, _ := allocator.Translate(rec.Devices, inv)
	for _, d := range devs {
		for _, x := range d.IDs {
			if x != id && devids.NormalizeID(x) != base {
				continue
			}
			if d.Resource == resource || strings.HasPrefix(base, "MIG-") {
				return d.Allocator
			}
		}
	}
	return ""
}

// NUMAFacts describes where the inventory puts a device: its NUMA node and
// the source that said so, or why it cannot.
type NUMAFacts struct {
	known  bool   // the inventory has the device
	numa   *int64 // nil when the inventory does not know the node
	source string // the source of numa, else of the device
}

// NUMAOf looks a device id up in the inventory; inv nil means there is no
// inventory to ask.
func NUMAOf(inv *inventory.Snapshot, id string) NUMAFacts {
	if inv == nil || id == "" {
		return NUMAFacts{}
	}
	d, ok := inv.Lookup(id)
	if !ok {
		return NUMAFacts{}
	}
	return NUMAFactsOf(d)
}

// NUMAFactsOf is NUMAOf for a device already looked up.
func NUMAFactsOf(d inventory.Device) NUMAFacts {
	src := d.NUMASource
	if src == "" {
		src = d.Source // no node, or a file written by hand without numaSource
	}
	return NUMAFacts{known: true, numa: d.NUMANode, source: src}
}

// String is how inspect prints it: "1 from sysfs".
func (f NUMAFacts) String() string {
	switch {
	case !f.known:
		return "not in the inventory"
	case f.numa == nil:
		return "unknown (device from " + f.source + ")"
	}
	return strconv.FormatInt(*f.numa, 10) + " from " + f.source
}
