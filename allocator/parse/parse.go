// Package parse holds what the annotation formats share in reading
// annotations and pod requests: request quantities and counts as the
// schedulers read them, digits, quoting for error messages, and the resource
// name GPUs are reported as by default.
package parse

import (
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// DefaultGPUResource is the resource name GPUs are reported as by default:
// the one DCGM exporter recognises.
const DefaultGPUResource = "nvidia.com/gpu"

// CountRequest reads a request that counts devices: whole devices, or a
// share for a fractional quantity; (0, false) when absent, unreadable or
// not positive.
func CountRequest(requests map[string]string, name string) (whole int64, share bool) {
	v, ok := requests[name]
	if !ok {
		return 0, false
	}
	n, fraction, ok := Quantity(v)
	switch {
	case !ok:
		return 0, false
	case fraction:
		return 0, true
	default:
		return n, false
	}
}

// Quantity reads a pod request: its value in whole units, or fraction=true
// when it is not a whole number; ok is false when it cannot be read or is
// not positive, which asks for nothing.
func Quantity(v string) (n int64, fraction, ok bool) {
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return 0, false, false
	}
	if n := q.Value(); q.CmpInt64(n) == 0 {
		return n, false, true
	}
	return 0, true, true
}

func IsDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// IsMIG reports whether id names a MIG instance ("MIG-...", any case).
func IsMIG(id string) bool { return len(id) > 4 && strings.EqualFold(id[:4], "MIG-") }

// Quote quotes annotation text for an error message, shortened: annotations
// can be long and end up in logs and records.
func Quote(s string) string {
	const max = 60
	if len(s) > max {
		s = s[:max] + "..."
	}
	return strconv.Quote(s)
}
