// Package parse holds what the annotation formats share in reading
// annotations and pod requests: request quantities and counts as the
// schedulers read them, digits, quoting for error messages, and the resource
// name GPUs are reported as by default.
package parse

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"

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
// when it is not a whole number; ok is false when it cannot be read, is not
// positive or is beyond any count (more than an int64), which asks for
// nothing.
func Quantity(v string) (n int64, fraction, ok bool) {
	q, err := ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return 0, false, false
	}
	if q.Cmp(maxCount) > 0 {
		return 0, false, false
	}
	if n := q.Value(); q.CmpInt64(n) == 0 {
		return n, false, true
	}
	return 0, true, true
}

var maxCount = *resource.NewQuantity(math.MaxInt64, resource.DecimalSI)

// MaxQuantityLen bounds the text ParseQuantity reads: the longest quantity a
// count or a share is written as ("9223372036854775807" is 19 characters)
// with room to spare.
const MaxQuantityLen = 64

// maxExponentDigits bounds a decimal exponent ("1e18"): a count needs at
// most two digits of it.
const maxExponentDigits = 2

// ParseQuantity is resource.ParseQuantity for text from annotations and pod
// requests. resource.ParseQuantity takes time that grows with 10^exponent
// ("1e-999999999" does not return), and so do a Quantity's comparisons
// ("1e999999999" compared with 100), so text longer than MaxQuantityLen or
// with a decimal exponent of more than two digits is refused before it is
// parsed.
func ParseQuantity(v string) (resource.Quantity, error) {
	if len(v) > MaxQuantityLen {
		return resource.Quantity{}, fmt.Errorf("quantity of %d characters, more than %d", len(v), MaxQuantityLen)
	}
	if i := strings.IndexAny(v, "eE"); i >= 0 {
		exp := strings.TrimLeft(v[i+1:], "+-")
		if digits := len(exp) - len(strings.TrimLeft(exp, "0123456789")); digits > maxExponentDigits {
			return resource.Quantity{}, fmt.Errorf("%s: exponent of more than %d digits", Quote(v), maxExponentDigits)
		}
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%s: %w", Quote(v), err)
	}
	return q, nil
}

// Int32 reads a decimal the schedulers write as a non-negative int32 (HAMi's
// memory and cores, Volcano's GPU indices); what names it in errors.
func Int32(s, what string) (int64, error) {
	if strings.HasPrefix(s, "-") && IsDigits(s[1:]) {
		return 0, fmt.Errorf("%s %s is negative", what, s)
	}
	if !IsDigits(s) {
		return 0, fmt.Errorf("%s %s is not a number", what, Quote(s))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > math.MaxInt32 {
		return 0, fmt.Errorf("%s %s is out of range", what, s)
	}
	return n, nil
}

// IsDigits reports whether s is a non-empty string of ASCII digits.
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

// HasSpaceOrControl reports whether s has a space or a control character,
// which no id or name the formats read may hold: they end up in logs, CDI
// names and device-info files.
func HasSpaceOrControl(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0
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
