package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func tempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "prs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestSocketIsPrivateAndInItsOwnDirectory(t *testing.T) {
	dir := tempDir(t)
	path := filepath.Join(dir, "pod-resources", "kubelet.sock")
	l, err := Listen(path, filepath.Join(dir, "kubelet", "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm()&^socketFileMode != 0 {
		t.Errorf("socket mode %v, want a socket no wider than %o", fi.Mode(), socketFileMode)
	}
	di, _ := os.Stat(filepath.Dir(path))
	if di.Mode().Perm() != socketDirMode {
		t.Errorf("directory mode %o, want %o", di.Mode().Perm(), socketDirMode)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the socket (no temporary left)", len(entries))
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("the socket does not accept connections: %v", err)
	}
	c.Close()
}

func TestStaleSocketIsReplaced(t *testing.T) {
	dir := tempDir(t)
	path := filepath.Join(dir, "kubelet.sock")
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // a crashed instance leaves its socket file behind
	l, err := Listen(path, "")
	if err != nil {
		t.Fatalf("a stale socket must be replaced: %v", err)
	}
	defer l.Close()
	if c, err := net.Dial("unix", path); err != nil {
		t.Fatalf("the new socket does not answer: %v", err)
	} else {
		c.Close()
	}
}

func TestSocketNeverReplacesTheKubeletsSocket(t *testing.T) {
	dir := tempDir(t)
	kubelet := filepath.Join(dir, "pod-resources", "kubelet.sock")
	kl, err := net.Listen("unix", kubelet)
	if err != nil {
		if err := os.MkdirAll(filepath.Dir(kubelet), 0o750); err != nil {
			t.Fatal(err)
		}
		if kl, err = net.Listen("unix", kubelet); err != nil {
			t.Fatal(err)
		}
	}
	defer kl.Close()
	for _, path := range []string{kubelet, filepath.Join(dir, "pod-resources", ".", "kubelet.sock")} {
		if l, err := Listen(path, kubelet); err == nil {
			l.Close()
			t.Fatalf("Listen(%s) replaced the kubelet's socket", path)
		} else if !strings.Contains(err.Error(), "kubelet's own socket") {
			t.Errorf("unclear error: %v", err)
		}
	}
	if c, err := net.Dial("unix", kubelet); err != nil {
		t.Fatalf("the kubelet's socket was harmed: %v", err)
	} else {
		c.Close()
	}
}

func TestSocketRefusesToReplaceAFile(t *testing.T) {
	dir := tempDir(t)
	path := filepath.Join(dir, "kubelet.sock")
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := Listen(path, ""); err == nil {
		l.Close()
		t.Fatal("replaced a regular file")
	}
	if b, _ := os.ReadFile(path); string(b) != "not a socket" {
		t.Error("the file was changed")
	}
}

func TestCloseRemovesOnlyOurSocket(t *testing.T) {
	dir := tempDir(t)
	path := filepath.Join(dir, "kubelet.sock")
	first, err := Listen(path, "")
	if err != nil {
		t.Fatal(err)
	}
	// A new instance takes over before the old one shuts down (rolling update).
	second, err := Listen(path, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the old instance removed the new instance's socket: %v", err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("clean shutdown left the socket behind: %v", err)
	}
}

// A directory the socket is put in that existed before keeps its mode: it
// may be shared (--socket /run/podres-proxy.sock), and 0750 on /run would
// lock every non-root process out of it.
func TestSocketLeavesAnExistingDirectorysModeAlone(t *testing.T) {
	for _, mode := range []os.FileMode{0o755, 0o777 | os.ModeSticky} {
		dir := filepath.Join(tempDir(t), "run")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		l, err := Listen(filepath.Join(dir, "podres-proxy.sock"), "")
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		if fi, err := os.Stat(dir); err != nil || fi.Mode() != os.ModeDir|mode {
			t.Errorf("a %v directory became %v (%v)", os.ModeDir|mode, fi.Mode(), err)
		}
	}
}

// A directory reached through a symbolic link is not the proxy's to
// restrict: neither the link's target nor anything else changes mode.
func TestSocketNeverChmodsThroughASymlink(t *testing.T) {
	base := tempDir(t)
	target := filepath.Join(base, "shared")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(target, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "pod-resources")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(link, "kubelet.sock")
	l, err := Listen(path, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("the symbolic link's target directory became %v (%v), want it left 0755", fi.Mode(), err)
	}
	if c, err := net.Dial("unix", path); err != nil {
		t.Errorf("the socket through the link does not accept connections: %v", err)
	} else {
		c.Close()
	}
}
