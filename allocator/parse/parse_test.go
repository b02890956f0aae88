package parse

import (
	"strings"
	"testing"
)

func TestQuantityReadsCountsAndShares(t *testing.T) {
	for _, tt := range []struct {
		in       string
		n        int64
		fraction bool
		ok       bool
	}{
		{"1", 1, false, true},
		{"2Ki", 2048, false, true},
		{"1e3", 1000, false, true},
		{"2000m", 2, false, true},
		{"9223372036854775807", 9223372036854775807, false, true},
		{"1500m", 0, true, true},
		{"0.5", 0, true, true},
		{"0", 0, false, false},
		{"-2", 0, false, false},
		{"", 0, false, false},
		{"two", 0, false, false},
		// Beyond any count: no device request, not a share of one.
		{"9223372036854775808", 0, false, false},
		{"1e99", 0, false, false},
		// Exponents whose arithmetic does not end in reasonable time:
		// resource.ParseQuantity of the first does not return, and a
		// comparison of the second takes time that grows with 10^exponent.
		{"1e-999999999", 0, false, false},
		{"1e999999999", 0, false, false},
		{"1E+999999999", 0, false, false},
		{strings.Repeat("1", MaxQuantityLen+1), 0, false, false},
	} {
		n, fraction, ok := Quantity(tt.in)
		if n != tt.n || fraction != tt.fraction || ok != tt.ok {
			t.Errorf("Quantity(%q) = %d, %v, %v; want %d, %v, %v", tt.in, n, fraction, ok, tt.n, tt.fraction, tt.ok)
		}
	}
}

func TestParseQuantityRefusesWhatItCannotReadInTime(t *testing.T) {
	for _, in := range []string{"1e-999999999", "5E100", strings.Repeat("9", 65)} {
		if _, err := ParseQuantity(in); err == nil {
			t.Errorf("ParseQuantity(%q) read it", in)
		}
	}
	// "1P" is a suffix, not an exponent, and two-digit exponents
	// are read.
	for in, milli := range map[string]int64{"1P": 1e18, "1e15": 1e18, "15e-1": 1500, "-15e-01": -1500} {
		q, err := ParseQuantity(in)
		if err != nil || q.MilliValue() != milli {
			t.Errorf("ParseQuantity(%q) = %v, %v; want %d milli", in, q.String(), err, milli)
		}
	}
}

// FuzzQuantity: any text is read, or refused, promptly (a hang fails the
// fuzzer), and a count is positive.
func FuzzQuantity(f *testing.F) {
	for _, seed := range []string{"1", "1500m", "2Ki", "1e3", "1E", "1e-999999999", "1e999999999", "0.5e-99", ""} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, fraction, ok := Quantity(v)
		if ok && !fraction && n <= 0 || (!ok || fraction) && n != 0 {
			t.Fatalf("Quantity(%q) = %d, %v, %v", v, n, fraction, ok)
		}
	})
}
