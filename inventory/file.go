package inventory

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
	"syscall"
	"time"
)

// DefaultFileInterval is how often a FileSource looks at its file. Reading a
// small file is cheaper than a watch that must survive ConfigMap symlink
// swaps, and the inventory changes rarely.
const DefaultFileInterval = 10 * time.Second

// maxFileSize bounds what a FileSource reads: an inventory of a few hundred
// devices is a few tens of KiB.
const maxFileSize = 4 << 20

// FileSource reads the local inventory file (format in docs/inventory.md)
// and reloads it when its content changes. A file that does not parse is
// reported and its last good content kept; a file that does not exist means
// no devices.
type FileSource struct {
	path     string
	interval time.Duration

	// Guarded by Inventory's per-source serialization of Load.
	loaded  bool
	content []byte
	devices []Device
	err     error
}

// NewFileSource returns a source reading path every interval (0 means
// DefaultFileInterval).
func NewFileSource(path string, interval time.Duration) *FileSource {
	if interval == 0 {
		interval = DefaultFileInterval
	}
	return &FileSource{path: path, interval: interval}
}

// Name implements Source.
func (f *FileSource) Name() string { return SourceFile }

// Interval implements Source.
func (f *FileSource) Interval() time.Duration { return f.interval }

// Load implements Source. It parses the file only when its content differs
// from the last read.
func (f *FileSource) Load(ctx context.Context) ([]Device, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	content, err := readLimited(f.path, maxFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		f.loaded, f.content = false, nil
		return nil, fmt.Errorf("inventory file %s does not exist: %w", f.path, ErrAbsent)
	}
	if err != nil {
		return nil, fmt.Errorf("reading inventory file: %w", err)
	}
	if f.loaded && bytes.Equal(content, f.content) {
		return f.devices, f.err
	}
	f.loaded, f.content = true, content
	f.devices, f.err = ParseFile(content)
	if f.err != nil {
		f.err = fmt.Errorf("inventory file %s: %w", f.path, f.err)
	}
	return f.devices, f.err
}

func readLimited(path string, limit int64) ([]byte, error) {
	return readLimitedFlags(path, limit, 0)
}

// readLimitedFlags is readLimited opening path with flags added to
// O_RDONLY.
func readLimitedFlags(path string, limit int64, flags int) ([]byte, error) {
	file, err := os.OpenFile(path, os.O_RDONLY|flags, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) && flags&syscall.O_NOFOLLOW != 0 {
			return nil, fmt.Errorf("%s is a symbolic link, which podres-proxy does not follow in its state directory", path)
		}
		return nil, err
	}
	defer file.Close()
	content, err := io.ReadAll(io.LimitReader(file, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(content)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return content, nil
}

// FileVersion is the inventory file format version this package writes and
// reads; a file may leave it out.
const FileVersion = 1

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

// ParseFile decodes an inventory file (docs/inventory.md). It is strict:
// unknown fields, a second JSON value, bad PCI addresses and an id or
// address used twice are errors naming the device, because a typo must not
// silently drop a device's NUMA node.
func ParseFile(data []byte) ([]Device, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var file inventoryFile
	if err := dec.Decode(&file); err != nil {
		return nil, jsonError(data, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the inventory object")
	}
	if file.Version != 0 && file.Version != FileVersion {
		return nil, fmt.Errorf("unsupported version %d (this daemon reads version %d)", file.Version, FileVersion)
	}
	devices := make([]Device, 0, len(file.Devices))
	used := make(map[string]string) // lookupKey -> where it was first used
	claim := func(id, where string) error {
		if id == "" {
			return nil
		}
		k := lookupKey(id)
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
		if lookupKey(d.BusID) != lookupKey(d.ID) {
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

func (fd fileDevice) device(where string) (Device, error) {
	if !typePattern.MatchString(fd.Type) {
		return Device{}, fmt.Errorf("%s.type %q: want a lower-case device type such as gpu, rdma or fpga", where, fd.Type)
	}
	if fd.ID == "" && fd.BusID == "" {
		return Device{}, fmt.Errorf("%s: needs an id or a busID", where)
	}
	d := Device{
		Type:     fd.Type,
		ID:       fd.ID,
		Vendor:   fd.Vendor,
		Minor:    nonNegative(fd.Minor),
		Index:    nonNegative(fd.Index),
		NUMANode: nonNegative(fd.NUMANode),
		Healthy:  fd.Healthy == nil || *fd.Healthy,
	}
	if c, ok := CanonicalPCIAddress(fd.ID); ok {
		d.ID = c
	}
	if fd.BusID != "" {
		c, ok := CanonicalPCIAddress(fd.BusID)
		if !ok {
			return Device{}, fmt.Errorf("%s.busID %q is not a PCI address (want 0000:3b:00.0)", where, fd.BusID)
		}
		d.BusID = c
	} else if c, ok := CanonicalPCIAddress(fd.ID); ok {
		d.BusID = c
	}
	for j, vf := range fd.VFs {
		c, ok := CanonicalPCIAddress(vf.BusID)
		if !ok {
			return Device{}, fmt.Errorf("%s.vfs[%d].busID %q is not a PCI address (want 0000:3b:02.1)", where, j, vf.BusID)
		}
		d.VFs = append(d.VFs, VF{BusID: c, NUMANode: nonNegative(vf.NUMANode)})
	}
	return d, nil
}

// nonNegative maps the -1 that sysfs and Koordinator use for "unknown" (and
// any other negative number) to nil.
func nonNegative(p *int64) *int64 {
	if p == nil || *p < 0 {
		return nil
	}
	return clonePtr(p)
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
