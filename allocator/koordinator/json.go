package koordinator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
)

// Reading the annotation's JSON field by field: a malformed field names
// itself in the error, and unknown fields are ignored.

// allocation is one entry of a device type's list, validated.
type allocation struct {
	minor     *int64
	id        string
	resources map[string]resource.Quantity
	vfs       []string // busIDs, in annotation order
	template  string   // gpuSharedResourceTemplate
}

// parseAllocation reads one entry field by field, so that an error names the
// field and the value at fault. Fields it does not know are ignored (a newer
// Koordinator may add some); a null field counts as absent, like Go's
// omitempty would have left it.
func parseAllocation(raw json.RawMessage) (allocation, error) {
	var a allocation
	fields, err := object(raw, "allocation")
	if err != nil {
		return a, err
	}
	if v := fields["minor"]; !isNull(v) {
		n, err := integer(v, "minor")
		if err != nil {
			return a, err
		}
		if n < 0 || n > math.MaxInt32 {
			return a, fmt.Errorf("minor %d out of range [0, %d]", n, math.MaxInt32)
		}
		a.minor = &n
	}
	if v := fields["id"]; !isNull(v) {
		if a.id, err = str(v, "id"); err != nil {
			return a, err
		}
	}
	if v := fields["resources"]; !isNull(v) {
		if a.resources, err = quantities(v); err != nil {
			return a, err
		}
	}
	if v := fields["extension"]; !isNull(v) {
		if err := parseExtension(v, &a); err != nil {
			return a, fmt.Errorf("extension: %w", err)
		}
	}
	return a, nil
}

func parseExtension(raw json.RawMessage, a *allocation) error {
	fields, err := object(raw, "extension")
	if err != nil {
		return err
	}
	if v := fields["gpuSharedResourceTemplate"]; !isNull(v) {
		if a.template, err = str(v, "gpuSharedResourceTemplate"); err != nil {
			return err
		}
	}
	v := fields["vfs"]
	if isNull(v) {
		return nil
	}
	var vfs []json.RawMessage
	if err := json.Unmarshal(v, &vfs); err != nil {
		return fmt.Errorf("vfs: want a list, got %s", excerpt(v))
	}
	for i, vf := range vfs {
		where := fmt.Sprintf("vfs[%d]", i)
		f, err := object(vf, "VF")
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		// A VF's minor (0..n, omitted when 0) is not reported; only its type
		// is checked.
		if m := f["minor"]; !isNull(m) {
			if _, err := integer(m, "minor"); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		var busID string
		if b := f["busID"]; !isNull(b) {
			if busID, err = str(b, "busID"); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		if busID == "" {
			// Skipping it would shift every later VF onto the wrong network
			// attachment in Multus, which hands ids out in order.
			return fmt.Errorf("%s: no busID", where)
		}
		a.vfs = append(a.vfs, busID)
	}
	return nil
}

// quantities reads a resource list whose values are Kubernetes quantities,
// as strings ("23040Mi") or bare JSON numbers (100).
func quantities(raw json.RawMessage) (map[string]resource.Quantity, error) {
	fields, err := object(raw, "resources")
	if err != nil {
		return nil, fmt.Errorf("resources: %w", err)
	}
	out := make(map[string]resource.Quantity, len(fields))
	// Sorted, so that the first bad one reported is always the same.
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		v := fields[name]
		text := string(v)
		if len(v) > 0 && v[0] == '"' {
			if err := json.Unmarshal(v, &text); err != nil {
				return nil, fmt.Errorf("resources %s: %w", name, err)
			}
		} else if len(v) == 0 || !(v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
			return nil, fmt.Errorf("resources %s: want a quantity, got %s", name, excerpt(v))
		}
		q, err := parse.ParseQuantity(text)
		if err != nil {
			return nil, fmt.Errorf("resources %s: %w", name, err)
		}
		if q.Sign() < 0 {
			return nil, fmt.Errorf("resources %s: negative quantity %s", name, q.String())
		}
		out[name] = q
	}
	return out, nil
}

func object(raw json.RawMessage, what string) (map[string]json.RawMessage, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("null %s", what)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("want a JSON object, got %s", excerpt(raw))
	}
	return fields, nil
}

func integer(raw json.RawMessage, field string) (int64, error) {
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("%s: want an integer, got %s", field, excerpt(raw))
	}
	return n, nil
}

func str(raw json.RawMessage, field string) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: want a string, got %s", field, excerpt(raw))
	}
	return s, nil
}

// isNull reports whether a field is absent (nil) or JSON null.
func isNull(raw json.RawMessage) bool {
	return raw == nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// excerpt quotes a JSON value for an error message, shortened: annotations
// can be long and end up in logs and records.
func excerpt(raw json.RawMessage) string {
	const max = 40
	s := string(raw)
	if len(s) > max {
		s = s[:max] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
