package allocfixture

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A checkout without the fixtures fails loudly: a test that found no
// fixtures must not pass as if it had checked them.
func TestLoadFailsWithoutTheFixtures(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "repo")
	if err := os.MkdirAll(filepath.Join(repo, "pkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(repo, "pkg"))
	_, err := Load()
	if err == nil || !strings.Contains(err.Error(), "is the checkout complete") {
		t.Errorf("Load = %v; want an error saying where the fixtures belong", err)
	}
}

// From a package folder, Load finds the module root and reads every
// fixture, each with a name, containers and a known attribution.
func TestLoadReadsEveryFixture(t *testing.T) {
	cases, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join("..", "..", Dir, "*", "*.json"))
	more, _ := filepath.Glob(filepath.Join("testdata", "*", "*.json"))
	if len(cases) != len(files)+len(more) || len(files) == 0 || len(more) == 0 {
		t.Errorf("Load = %d cases; the folders have %d and %d files", len(cases), len(files), len(more))
	}
}
