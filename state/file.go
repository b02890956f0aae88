package state

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/podres-proxy/podres-proxy/internal/atomicfile"
	"github.com/podres-proxy/podres-proxy/model"
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
	recordExt      = ".json"
)

// isTempName reports whether a file name in the pods directory is a
// writer's temporary file: it starts with a dot, so no uid can produce it.
func isTempName(name string) bool { return atomicfile.IsTemp(name) }

// validUID reports whether a uid can name a record file. Kubernetes uids are
// UUIDs (or hashes for static pods); anything that could escape the
// directory, hide as a dot file or not survive JSON is refused.
func validUID(uid string) bool {
	if uid == "" || len(uid) > 200 || uid[0] == '.' || !utf8.ValidString(uid) {
		return false
	}
	for _, c := range []byte(uid) {
		if c == '/' || c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// encodeRecord is the file format: indented JSON, one trailing newline,
// lists that are empty written as [] rather than null so that jq filters such
// as '.devices[]' work on every file.
func encodeRecord(r *Record) ([]byte, error) {
	c := *r
	if c.Containers == nil {
		c.Containers = []Container{}
	}
	if c.Devices == nil {
		c.Devices = []model.Device{}
	}
	b, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode record of pod %s/%s (uid %s): %w", r.Namespace, r.Name, r.UID, err)
	}
	return append(b, '\n'), nil
}

// readableOlderVersions are the older schema versions read as the current
// one: each later version only added fields (2: countsRequests, the
// requesting-all scope, refused, edited, the spec's schedulerName; 3: a
// device's parent and container, gpuSlots), so an older file decodes as a
// current one and an upgrade keeps every record (what it learned, and
// when) instead of setting them aside. The one absence that means
// something is the spec's schedulerName: without it the trust gate cannot
// vet the pod, so its spec is read from /pods again before its devices are
// answered (resolver.vettable). Such a record is written back as the
// current version at its next change.
var readableOlderVersions = []int{1, 2}

// decodeRecord reads a record file's content. It accepts only what this
// version writes (and readableOlderVersions): the current SchemaVersion, known fields, known states, a
// usable uid, and nothing after the object. What it accepts can be encoded
// again.
func decodeRecord(data []byte) (*Record, error) {
	var head struct {
		SchemaVersion *int `json:"schemaVersion"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("not a JSON record: %w", err)
	}
	if head.SchemaVersion == nil {
		return nil, errors.New("no schemaVersion")
	}
	if *head.SchemaVersion != SchemaVersion && !slices.Contains(readableOlderVersions, *head.SchemaVersion) {
		return nil, fmt.Errorf("schemaVersion %d, this podres-proxy reads %v and %d", *head.SchemaVersion, readableOlderVersions, SchemaVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r Record
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("decode record: %w", err)
	}
	if err := validate(&r); err != nil {
		return nil, err
	}
	r.SchemaVersion = SchemaVersion
	if _, err := encodeRecord(&r); err != nil {
		return nil, err
	}
	return &r, nil
}

func validate(r *Record) error {
	if !validUID(r.UID) {
		return fmt.Errorf("invalid uid %q", r.UID)
	}
	switch r.State {
	case PhasePending, PhaseReady, PhaseStopped, PhaseRemoved:
	default:
		return fmt.Errorf("unknown state %q", r.State)
	}
	for _, c := range r.Containers {
		switch c.State {
		case model.ContainerCreated, model.ContainerRunning, model.ContainerStopped, model.ContainerRemoved, model.ContainerUnknown:
		default:
			return fmt.Errorf("container %q: unknown state %q", c.Name, c.State)
		}
	}
	for name, seen := range map[string]*Seen{
		"sandbox": r.Provenance.Sandbox, "annotations": r.Provenance.Annotations,
		"spec": r.Provenance.Spec, "containers": r.Provenance.Containers,
	} {
		if seen == nil {
			continue
		}
		switch seen.Origin {
		case OriginKubelet, OriginNRI, OriginCRI:
		default:
			return fmt.Errorf("sources.%s: unknown source %q", name, seen.Origin)
		}
	}
	return nil
}

// loadRecordFile decodes the file called name and checks that it is the
// record of the uid it is named after.
func loadRecordFile(name string, data []byte) (*Record, error) {
	r, err := decodeRecord(data)
	if err != nil {
		return nil, err
	}
	if want := strings.TrimSuffix(name, recordExt); r.UID != want {
		return nil, fmt.Errorf("holds uid %q, not the %q it is named after", r.UID, want)
	}
	return r, nil
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
func ReadDir(dir string) ([]*Record, []error) {
	podsDir := filepath.Join(dir, podsDirName)
	if err := checkDirNoFollow(podsDir); err != nil {
		return nil, []error{fmt.Errorf("read state directory %s: %w", dir, err)}
	}
	entries, err := os.ReadDir(podsDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(dir); serr == nil {
				return []*Record{}, nil
			}
		}
		return nil, []error{fmt.Errorf("read state directory %s: %w", dir, err)}
	}
	records := []*Record{}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if isTempName(name) || !strings.HasSuffix(name, recordExt) || e.IsDir() {
			continue
		}
		path := filepath.Join(podsDir, name)
		data, err := readFileNoFollow(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // pruned since the directory was listed
		}
		if err != nil {
			errs = append(errs, &FileError{Path: path, Err: err})
			continue
		}
		r, err := loadRecordFile(name, data)
		if err != nil {
			errs = append(errs, &FileError{Path: path, Err: err})
			continue
		}
		records = append(records, r)
	}
	SortRecords(records)
	return records, errs
}
