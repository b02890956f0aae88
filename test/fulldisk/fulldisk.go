// Package fulldisk gives tests a real full disk: a small tmpfs that they
// fill, so that file system calls fail with ENOSPC as they do on a node whose
// disk is full, with no fault hook in the code under test.
package fulldisk

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// Mount mounts a small tmpfs (256 KiB, 64 inodes) on a new directory and
// returns it; it is unmounted when the test ends. Mounting needs root: the
// test is skipped without it, or where mounts are not allowed.
func Mount(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a full disk is a small tmpfs, and mounting one needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=256k,nr_inodes=64,mode=0700"); err != nil {
		t.Skipf("cannot mount a tmpfs for a full disk: %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill takes what is left of the disk mounted at disk: every data block
// and, with inodes, every inode too, so that creating a file or a directory
// fails as well as writing one. free gives it all back.
func Fill(t testing.TB, disk string, inodes bool) (free func()) {
	t.Helper()
	dir, err := os.MkdirTemp(disk, "filler")
	if err != nil {
		t.Fatalf("fill %s: %v", disk, err)
	}
	free = func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("free %s: %v", disk, err)
		}
	}
	f, err := os.Create(filepath.Join(dir, "blocks"))
	if err != nil {
		free()
		t.Fatalf("fill %s: %v", disk, err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err = f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		free()
		t.Fatalf("fill %s: %v, want ENOSPC", disk, err)
	}
	for i := 0; inodes; i++ {
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
		if errors.Is(err, syscall.ENOSPC) {
			break
		}
		if err != nil {
			free()
			t.Fatalf("fill %s: %v", disk, err)
		}
		f.Close()
	}
	return free
}
