// Package layers checks that the module's packages stay in the layers
// CONTRIBUTING.md draws: each imports only packages of lower layers or,
// within its own layer, of its own tree. A package that imports upwards
// makes the house one where nothing can be read without what stands above
// it; a new package must be given its layer here before it builds.
package layers

import (
	"bytes"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/podres-proxy/podres-proxy"

// layers are the packages of each layer, bottom first, as CONTRIBUTING.md's
// "Layers" table gives them: a name stands for that package and those
// below it, the longest name that matches a package deciding its layer.
var layers = [][]string{
	{"internal", "inventory/internal"},
	{"model", "metrics"},
	{"allocator/parse", "allocator/hami", "allocator/koordinator", "allocator/volcano", "allocator/tensorfusion",
		"state/record", "state/decode", "state/persist", "state/names",
		"inventory",
		"kubeletpods/podsjson", "kubeletpods/podlogs",
		"report"},
	{"allocator", "state", "kubeletpods"},
	{"trust", "devinfo", "dra", "plugin"},
	{"proxy"},
	{"cli"},
	{"cmd"},
}

// outside are the trees the rule leaves out: tests' helpers, scripts and
// the manifests' tests.
var outside = []string{"test", "hack", "deploy"}

// layerOf returns the layer of a package path relative to the module, and
// the name that placed it there.
func layerOf(pkg string) (int, string, bool) {
	best, name := -1, ""
	for i, names := range layers {
		for _, n := range names {
			if (pkg == n || strings.HasPrefix(pkg, n+"/")) && len(n) > len(name) {
				best, name = i, n
			}
		}
	}
	return best, name, best >= 0
}

// tree is a package's top-level directory: packages of one layer may import
// each other only within it (proxy/merge imports proxy/plans).
func tree(pkg string) string {
	t, _, _ := strings.Cut(pkg, "/")
	return t
}

// goList returns what go list args prints, run in the module's root.
func goList(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	return string(out)
}

func TestEveryImportGoesDownTheLayers(t *testing.T) {
	out := goList(t, "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	var broken []string
	packages := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		if pkg == "" || isOutside(pkg) {
			continue
		}
		packages++
		from, _, ok := layerOf(pkg)
		if !ok {
			broken = append(broken, fmt.Sprintf("%s has no layer: give it one in test/layers and CONTRIBUTING.md", pkg))
			continue
		}
		for _, imp := range fields[1:] {
			rest, ours := strings.CutPrefix(imp, module+"/")
			if !ours || isOutside(rest) {
				continue
			}
			to, _, ok := layerOf(rest)
			switch {
			case !ok:
				// reported as the package it is
			case to > from:
				broken = append(broken, fmt.Sprintf("%s (layer %d) imports %s (layer %d): upwards", pkg, from, rest, to))
			case to == from && tree(pkg) != tree(rest):
				broken = append(broken, fmt.Sprintf("%s imports %s: the same layer (%d), another tree", pkg, rest, from))
			}
		}
	}
	if packages < 10 {
		t.Fatalf("go list found %d packages of the module: not the module's root?", packages)
	}
	sort.Strings(broken)
	for _, b := range broken {
		t.Error(b)
	}
}

// The rule must be able to fail: a table that placed everything in one
// layer, or a layerOf that matched nothing, would pass any house.
func TestTheLayersTellPackagesApart(t *testing.T) {
	for _, c := range []struct {
		pkg  string
		want int
	}{
		{"internal/coalesce", 0},
		{"inventory/internal/decode", 0},
		{"inventory/sysfs", 2},
		{"allocator/hami", 2},
		{"allocator", 3},
		{"allocator/registry", 3},
		{"state/record", 2},
		{"state", 3},
		{"proxy/plans", 5},
		{"cli/query", 6},
		{"cmd/podres-proxy", 7},
	} {
		if got, name, _ := layerOf(c.pkg); got != c.want {
			t.Errorf("layerOf(%s) = %d (by %q), want %d", c.pkg, got, name, c.want)
		}
	}
	if _, _, ok := layerOf("nowhere"); ok {
		t.Error("a package no name matches has a layer")
	}
}

func isOutside(pkg string) bool {
	for _, o := range outside {
		if pkg == o || strings.HasPrefix(pkg, o+"/") {
			return true
		}
	}
	return false
}

// unlinked are packages the daemon must not link, and why: each costs its
// resident memory on every node (docs/performance.md, "Memory").
var unlinked = map[string]string{
	// Registers every API group's types at start: 16 MB of binary and
	// about 10 MiB resident. Typed clients and tools/events import it; the
	// daemon's API server conversations use the dynamic client.
	"k8s.io/client-go/kubernetes/scheme": "client-go's scheme of every API group",
}

func TestTheDaemonLinksNoPackageKeptOutForItsMemory(t *testing.T) {
	deps := strings.Fields(goList(t, "-deps", "./cmd/podres-proxy"))
	if len(deps) < 100 {
		t.Fatalf("go list -deps found %d packages: not the daemon's?", len(deps))
	}
	for _, d := range deps {
		if why, ok := unlinked[d]; ok {
			t.Errorf("the daemon links %s (%s); `go mod why -m` does not, `go mod why %s` says what brings it", d, why, d)
		}
	}
}
