package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// helpFlag matches a flag line of a command's -h output ("  -o, --output string ...").
var helpFlag = regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z0-9-]+)`)

// docFlag matches a flag in the first column of a table row of docs/flags.md.
var docFlag = regexp.MustCompile("`--([a-z0-9-]+)`")

// documentedFlags returns, per command, the flags docs/flags.md lists in the
// first column of the tables under "## `podres-proxy COMMAND`".
func documentedFlags(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "flags.md"))
	if err != nil {
		t.Fatal(err)
	}
	flags := map[string][]string{}
	command := ""
	for line := range strings.Lines(string(doc)) {
		if name, ok := strings.CutPrefix(line, "## `podres-proxy "); ok {
			command, _, _ = strings.Cut(name, "`")
			flags[command] = []string{}
			continue
		}
		if command == "" || !strings.HasPrefix(line, "| `-") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range docFlag.FindAllStringSubmatch(first, -1) {
			flags[command] = append(flags[command], m[1])
		}
	}
	return flags
}

// The command-line reference lists exactly the flags each command accepts: a
// flag added without documentation, or documentation of a flag that is gone,
// fails here.
func TestEveryFlagIsDocumentedAndEveryDocumentedFlagExists(t *testing.T) {
	documented := documentedFlags(t)
	for _, c := range commands() {
		code, _, stderr := runCmd(t, c.name, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d: %s", c.name, code, stderr)
		}
		var accepted []string
		for _, m := range helpFlag.FindAllStringSubmatch(stderr, -1) {
			accepted = append(accepted, m[1])
		}
		docs, ok := documented[c.name]
		if !ok {
			t.Errorf("docs/flags.md has no section \"## `podres-proxy %s`\"", c.name)
			continue
		}
		for _, f := range accepted {
			if !slices.Contains(docs, f) {
				t.Errorf("podres-proxy %s --%s is not in docs/flags.md", c.name, f)
			}
		}
		for _, f := range docs {
			if !slices.Contains(accepted, f) {
				t.Errorf("docs/flags.md lists --%s for podres-proxy %s, which does not accept it", f, c.name)
			}
		}
	}
	if len(documented["serve"]) < 40 {
		t.Errorf("docs/flags.md lists %d flags of serve; the table was not read", len(documented["serve"]))
	}
}
