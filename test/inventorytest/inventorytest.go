// Package inventorytest builds, for tests, the sysfs and procfs trees of
// nodes whose devices the inventory's sysfs source discovers, so that tests
// of the inventory itself and of the daemon (serve with --sysfs-root and
// --procfs-root) run against the same node.
//
// The trees are described as txtar archives with two additions: a name
// "NAME -> TARGET" is a symbolic link and a name ending in "/" an empty
// directory. They are built on disk at test time because sysfs names hold
// colons, which Go module zips reject.
//
// It also holds what the tests of the inventory and of its sources share: a
// Source the test drives, one-line descriptions of devices and answers that
// compare and print well, and the checks every decoder's output passes.
// The inventory's own tests are therefore external (package inventory_test).
package inventorytest

import (
	"bytes"
	_ "embed"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The devices of TwoNUMANode, as the sysfs source reports them.
const (
	// GPU0 is the NVIDIA GPU at GPU0BusID on NUMA node 0 (minor 2, index 0).
	GPU0      = "GPU-5f1d6b3c-8a2e-4f0b-9c1d-2e3f4a5b6c7d"
	GPU0BusID = "0000:3b:00.0"
	// GPU1 is the NVIDIA GPU at GPU1BusID on NUMA node 1 (minor 0, index 1).
	GPU1      = "GPU-a0b1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c4d"
	GPU1BusID = "0000:af:00.0"
	// RDMAPF is the Mellanox RoCE PF (mlx5_0) on NUMA node 1; RDMAVF0 and
	// RDMAVF1 are its SR-IOV virtual functions, also on node 1.
	RDMAPF  = "0000:d8:00.0"
	RDMAVF0 = "0000:d8:00.2"
	RDMAVF1 = "0000:d8:00.3"
)

//go:embed testdata/two-numa.txtar
var twoNUMAArchive []byte

// Node is a materialised node: Sys is the sysfs root, Proc the procfs root.
type Node struct {
	Sys, Proc string
}

// PCI returns the sysfs directory of a PCI device, through the bus link as
// the sysfs source reads it, so that a test can change what it says.
func (n Node) PCI(addr string) string {
	return filepath.Join(n.Sys, "bus", "pci", "devices", addr)
}

// TwoNUMANode materialises a two-socket node under a temporary directory
// removed when the test ends: GPU0 on NUMA 0, GPU1 and the RDMA PF with its
// two VFs on NUMA 1, plus devices the inventory must ignore (PCI bridges, a
// BMC VGA without NUMA affinity, a GPU's audio function, a NIC without
// RDMA). testdata/two-numa.txtar describes it.
func TwoNUMANode(t testing.TB) Node {
	t.Helper()
	root := Materialize(t, twoNUMAArchive)
	return Node{Sys: filepath.Join(root, "sys"), Proc: filepath.Join(root, "proc")}
}

// Materialize builds the tree an archive describes (txtar with the
// additions above) under a temporary directory and returns that directory.
// Text before the first file name is a comment.
func Materialize(t testing.TB, archive []byte) string {
	t.Helper()
	root := t.TempDir()
	var name string
	var content bytes.Buffer
	flush := func() {
		if name == "" {
			return
		}
		defer content.Reset()
		if link, target, ok := strings.Cut(name, " -> "); ok {
			MkdirAll(t, filepath.Dir(filepath.Join(root, link)))
			if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
				t.Fatal(err)
			}
			return
		}
		if strings.HasSuffix(name, "/") {
			MkdirAll(t, filepath.Join(root, name))
			return
		}
		WriteFile(t, filepath.Join(root, name), content.String())
	}
	for line := range strings.SplitAfterSeq(string(archive), "\n") {
		if trimmed := strings.TrimSuffix(line, "\n"); strings.HasPrefix(trimmed, "-- ") && strings.HasSuffix(trimmed, " --") {
			flush()
			name = strings.TrimSuffix(strings.TrimPrefix(trimmed, "-- "), " --")
			continue
		}
		if name != "" {
			content.WriteString(line)
		}
	}
	flush()
	return root
}

// MkdirAll creates dir and its parents or fails the test.
func MkdirAll(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

// WriteFile writes content to path, creating its directory, or fails the
// test.
func WriteFile(t testing.TB, path, content string) {
	t.Helper()
	MkdirAll(t, filepath.Dir(path))
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
