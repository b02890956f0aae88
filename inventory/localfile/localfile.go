// Package localfile is the inventory source that reads the device file an
// operator writes (docs/inventory.md, --inventory-file), for what neither
// Koordinator's Device object nor sysfs knows: devices of other types, ids
// a tool assigns, a NUMA node sysfs cannot see. The file is read again at
// every interval; its parser is strict, so that a typo is an error
// that says where, not a device silently left without its NUMA node.
package localfile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"time"

	"github.com/podres-proxy/podres-proxy/inventory"
)

// DefaultInterval is how often a Source looks at its file. Reading a
// small file is cheaper than a watch that must survive ConfigMap symlink
// swaps, and the inventory changes rarely.
const DefaultInterval = 10 * time.Second

// maxFileSize bounds what a Source reads: an inventory of a few hundred
// devices is a few tens of KiB.
const maxFileSize = 4 << 20

// Source reads the local inventory file (format in docs/inventory.md) at
// every interval. A file that does not parse is reported and, by the
// Inventory, its last good content kept; a file that does not exist means
// no devices.
type Source struct {
	path     string
	interval time.Duration
}

// New returns a source reading path every interval (0 means
// DefaultInterval).
func New(path string, interval time.Duration) *Source {
	if interval == 0 {
		interval = DefaultInterval
	}
	return &Source{path: path, interval: interval}
}

// Name implements inventory.Source.
func (f *Source) Name() string { return inventory.SourceFile }

// Interval implements inventory.Source.
func (f *Source) Interval() time.Duration { return f.interval }

// Load implements inventory.Source.
func (f *Source) Load(ctx context.Context) ([]inventory.Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	content, err := readLimited(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("inventory file %s does not exist: %w", f.path, inventory.ErrAbsent)
	}
	if err != nil {
		return nil, fmt.Errorf("reading inventory file: %w", err)
	}
	devices, err := Parse(content)
	if err != nil {
		return nil, fmt.Errorf("inventory file %s: %w", f.path, err)
	}
	return devices, nil
}

// Version is the inventory file format version this package reads; a file
// may leave it out.
const Version = 1

// inventoryFile is the file format; docs/inventory.md documents it.
type inventoryFile struct {
	Version int          `json:"version"`
	Devices []fileDevice `json:"devices"`
}

type fileDevice struct {
	Type     string   `json:"type"`
	ID       string   `json:"id"`
	Vendor   string   `json:"vendor"`
	Minor    *int64   `json:"minor"`
	Index    *int64   `json:"index"`
	BusID    string   `json:"busID"`
	NUMANode *int64   `json:"numaNode"`
	Healthy  *bool    `json:"healthy"`
	VFs      []fileVF `json:"vfs"`
}

type fileVF struct {
	BusID    string `json:"busID"`
	NUMANode *int64 `json:"numaNode"`
}

var typePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Parse decodes an inventory file (docs/inventory.md). It is strict:
// unknown fields, a second JSON value, bad PCI addresses and an id or
// address used twice are errors naming the device, because a typo must not
// silently drop a device's NUMA node.
func Parse(data []byte) ([]inventory.Device, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var file inventoryFile
	if err := dec.Decode(&file); err != nil {
		return nil, jsonError(data, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the inventory object")
	}
	if file.Version != 0 && file.Version != Version {
		return nil, fmt.Errorf("unsupported version %d (this daemon reads version %d)", file.Version, Version)
	}
	devices := make([]inventory.Device, 0, len(file.Devices))
	used := make(map[string]string) // IDKey -> where it was first used
	claim := func(id, where string) error {
		if id == "" {
			return nil
		}
		k := inventory.IDKey(id)
		if first, dup := used[k]; dup {
			return fmt.Errorf("%s: %q is already used by %s", where, id, first)
		}
		used[k] = where
		return nil
	}
	for i, fd := range file.Devices {
		where := fmt.Sprintf("devices[%d]", i)
		d, err := fd.device(where)
		if err != nil {
			return nil, err
		}
		// A device whose id is its PCI address claims it once.
		if err := claim(d.ID, where+".id"); err != nil {
			return nil, err
		}
		if inventory.IDKey(d.BusID) != inventory.IDKey(d.ID) {
			if err := claim(d.BusID, where+".busID"); err != nil {
				return nil, err
			}
		}
		for j, vf := range d.VFs {
			if err := claim(vf.BusID, fmt.Sprintf("%s.vfs[%d].busID", where, j)); err != nil {
				return nil, err
			}
		}
		devices = append(devices, d)
	}
	return devices, nil
}

func (fd fileDevice) device(where string) (inventory.Device, error) {
	if !typePattern.MatchString(fd.Type) {
		return inventory.Device{}, fmt.Errorf("%s.type %q: want a lower-case device type such as gpu, rdma or fpga", where, fd.Type)
	}
	if fd.ID == "" && fd.BusID == "" {
		return inventory.Device{}, fmt.Errorf("%s: needs an id or a busID", where)
	}
	d := inventory.Device{
		Type:     fd.Type,
		ID:       fd.ID,
		Vendor:   fd.Vendor,
		Minor:    inventory.Known(fd.Minor),
		Index:    inventory.Known(fd.Index),
		NUMANode: inventory.Known(fd.NUMANode),
		Healthy:  fd.Healthy == nil || *fd.Healthy,
	}
	if c, ok := inventory.CanonicalPCIAddress(fd.ID); ok {
		d.ID = c
	}
	if fd.BusID != "" {
		c, ok := inventory.CanonicalPCIAddress(fd.BusID)
		if !ok {
			return inventory.Device{}, fmt.Errorf("%s.busID %q is not a PCI address (want 0000:3b:00.0)", where, fd.BusID)
		}
		d.BusID = c
	} else if c, ok := inventory.CanonicalPCIAddress(fd.ID); ok {
		d.BusID = c
	}
	for j, vf := range fd.VFs {
		c, ok := inventory.CanonicalPCIAddress(vf.BusID)
		if !ok {
			return inventory.Device{}, fmt.Errorf("%s.vfs[%d].busID %q is not a PCI address (want 0000:3b:02.1)", where, j, vf.BusID)
		}
		d.VFs = append(d.VFs, inventory.VF{BusID: c, NUMANode: inventory.Known(vf.NUMANode)})
	}
	return d, nil
}

// readLimited reads the file at path, following symbolic links (a
// ConfigMap volume's are), and fails if it holds more than maxFileSize
// bytes.
func readLimited(path string) ([]byte, error) {
	file, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer file.Close()
	content, err := io.ReadAll(io.LimitReader(file, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(content) > maxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxFileSize)
	}
	return content, nil
}

// jsonError adds the line and column to a JSON error, for the operator
// fixing the file.
func jsonError(data []byte, err error) error {
	var offset int64 = -1
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		offset = syntax.Offset
	case errors.As(err, &typ):
		offset = typ.Offset
	}
	if offset < 0 || offset > int64(len(data)) {
		return fmt.Errorf("decoding JSON: %w", err)
	}
	line := 1 + bytes.Count(data[:offset], []byte("\n"))
	col := int(offset) - bytes.LastIndexByte(data[:offset], '\n')
	return fmt.Errorf("decoding JSON at line %d, column %d: %w", line, col, err)
}
