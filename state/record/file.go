package record

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/podres-proxy/podres-proxy/model"
)

// Ext ends the name of a record's file: <uid>.json.
const Ext = ".json"

// ValidUID reports whether a uid can name a record file. Kubernetes uids are
// UUIDs (or hashes for static pods); anything that could escape the
// directory, hide as a dot file or not survive JSON is refused.
func ValidUID(uid string) bool {
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

// Encode is the file format: indented JSON, one trailing newline,
// lists that are empty written as [] rather than null so that jq filters such
// as '.devices[]' work on every file.
func Encode(r *Record) ([]byte, error) {
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

// Decode reads a record file's content. It accepts only what this
// version writes: the current SchemaVersion, known fields, known states, a
// usable uid, and nothing after the object. A file of another version is
// refused like any file that cannot be read, and the store sets it aside
// (docs/state-format.md, "Schema version policy"). What it accepts can be
// encoded again.
func Decode(data []byte) (*Record, error) {
	var head struct {
		SchemaVersion *int `json:"schemaVersion"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("not a JSON record: %w", err)
	}
	if head.SchemaVersion == nil {
		return nil, errors.New("no schemaVersion")
	}
	if *head.SchemaVersion != SchemaVersion {
		return nil, fmt.Errorf("schemaVersion %d, this podres-proxy reads only %d", *head.SchemaVersion, SchemaVersion)
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
	if _, err := Encode(&r); err != nil {
		return nil, err
	}
	return &r, nil
}

func validate(r *Record) error {
	if !ValidUID(r.UID) {
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

// Load decodes the file called name and checks that it is the
// record of the uid it is named after.
func Load(name string, data []byte) (*Record, error) {
	r, err := Decode(data)
	if err != nil {
		return nil, err
	}
	if want := strings.TrimSuffix(name, Ext); r.UID != want {
		return nil, fmt.Errorf("holds uid %q, not the %q it is named after", r.UID, want)
	}
	return r, nil
}
