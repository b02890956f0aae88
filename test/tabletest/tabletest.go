// Package tabletest reads, for tests, the tables podres-proxy's commands
// print: rows split into fields, and lines holding words in order.
package tabletest

import (
	"slices"
	"strings"
	"testing"
)

// Rows returns the lines of a table after its header, split into fields.
func Rows(t testing.TB, table string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	var out [][]string
	for _, l := range lines[1:] {
		out = append(out, strings.Fields(l))
	}
	return out
}

// EqualRows reports rows that differ from want, each want a row's fields
// joined by single spaces.
func EqualRows(t testing.TB, what string, got [][]string, want ...string) {
	t.Helper()
	var g []string
	for _, r := range got {
		g = append(g, strings.Join(r, " "))
	}
	if !slices.Equal(g, want) {
		t.Errorf("%s:\ngot:\n\t%s\nwant:\n\t%s", what, strings.Join(g, "\n\t"), strings.Join(want, "\n\t"))
	}
}

// HasLine reports whether a line of text holds the words in this order.
func HasLine(text string, words ...string) bool {
	for _, line := range strings.Split(text, "\n") {
		rest, ok := line, true
		for _, w := range words {
			i := strings.Index(rest, w)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(w):]
		}
		if ok {
			return true
		}
	}
	return false
}
