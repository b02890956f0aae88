package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	socketDirMode  = 0o750
	socketFileMode = 0o660
)

// Listener is a unix listener whose socket file appeared atomically
// under its final name and is removed on Close only while it is still ours.
type Listener struct {
	net.Listener
	path string
	info os.FileInfo // the socket file we created, to recognise it later

	once sync.Once
}

// Listen creates path the way the kubelet creates its own socket, so
// that clients watching the directory never see a half-made socket: listen on
// a temporary name in the same directory, restrict its permissions, then
// rename it over any stale socket. The socket gets 0660, and the directory
// 0750 when Listen creates it (makeSocketDir): the API exposes every
// pod's devices and clients must be privileged.
// It refuses to replace anything that is not a socket, and refuses the
// kubelet's own socket path, which would break the kubelet's API.
func Listen(path, kubeletSocket string) (*Listener, error) {
	path = filepath.Clean(path)
	if kubeletSocket != "" && sameSocket(path, kubeletSocket) {
		return nil, fmt.Errorf("socket %s is the kubelet's own socket: give podres-proxy a directory of its own (default /var/run/podres-proxy/pod-resources)", path)
	}
	dir := filepath.Dir(path)
	if err := makeSocketDir(dir); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("%s exists and is not a socket (%s): refusing to replace it", path, fi.Mode().Type())
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	_ = os.Remove(tmp) // left over by a crashed run with our pid
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", tmp, err)
	}
	ul := l.(*net.UnixListener)
	// The socket file now belongs to us; closing must not unlink tmp after
	// the rename (it would unlink nothing, or worse, a successor's file).
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (*Listener, error) {
		l.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := chmodNoFollow(tmp, socketFileMode, unix.S_IFSOCK); err != nil {
		return fail(fmt.Errorf("restrict socket %s: %w", tmp, err))
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(fmt.Errorf("move socket into place at %s: %w", path, err))
	}
	info, err := os.Lstat(path)
	if err != nil {
		return fail(fmt.Errorf("stat socket %s: %w", path, err))
	}
	return &Listener{Listener: l, path: path, info: info}, nil
}

// makeSocketDir creates dir with mode 0750 (and its missing parents, as
// MkdirAll does) when it does not exist. A directory that exists is left as
// it is: it may be shared (--socket /run/podres-proxy.sock), and making
// /run 0750 would lock every non-root process out of it; the socket's own
// mode restricts who may connect.
func makeSocketDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), socketDirMode); err != nil {
		return fmt.Errorf("create socket directory %s: %w", filepath.Dir(dir), err)
	}
	err := os.Mkdir(dir, socketDirMode)
	if errors.Is(err, fs.ErrExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create socket directory %s: %w", dir, err)
	}
	// Ours: give it exactly 0750 whatever the umask, without following a
	// symbolic link someone may have put in its place meanwhile.
	if err := chmodNoFollow(dir, socketDirMode, unix.S_IFDIR); err != nil {
		return fmt.Errorf("restrict socket directory: %w", err)
	}
	return nil
}

// chmodNoFollow sets the mode of path, which must be of file type ifmt
// (unix.S_IFDIR, S_IFSOCK), and never of what a symbolic link at path
// points to. The directory may be writable by others, who could swap path
// for a link to a file of their choice: path is opened without following
// links (O_PATH, which works for sockets too) and the file opened is what
// changes mode.
func chmodNoFollow(path string, mode fs.FileMode, ifmt uint32) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("chmod %s: open: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("chmod %s: stat: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != ifmt {
		return fmt.Errorf("chmod %s: not what was created there any more (mode %o): refusing", path, st.Mode)
	}
	// fchmod does not take an O_PATH descriptor; its /proc link names
	// the very file opened.
	if err := os.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	return nil
}

// Owned reports whether the socket file at the listener's path is still the
// one it created: false once another instance renamed its own over it, or
// removed it.
func (l *Listener) Owned() bool {
	fi, err := os.Lstat(l.path)
	return err == nil && os.SameFile(fi, l.info)
}

// Answers reports whether a process accepts connections on the socket at
// path within timeout: false for a socket file whose listener is gone (a
// crashed process's), a path that is missing, or anything else.
func Answers(path string, timeout time.Duration) bool {
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Close stops listening and removes the socket file if it is still the one
// we created; a newer instance may already have replaced it.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() {
		if fi, statErr := os.Lstat(l.path); statErr == nil && os.SameFile(fi, l.info) {
			if rmErr := os.Remove(l.path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) && err == nil {
				err = fmt.Errorf("remove socket %s: %w", l.path, rmErr)
			}
		}
	})
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// sameSocket reports whether a and b name the same socket: the same path
// after cleaning and resolving the directory's symlinks, or the same file.
func sameSocket(a, b string) bool {
	a, b = filepath.Clean(a), filepath.Clean(b)
	if a == b {
		return true
	}
	if fa, err := os.Stat(a); err == nil {
		if fb, err := os.Stat(b); err == nil && os.SameFile(fa, fb) {
			return true
		}
	}
	ra, errA := filepath.EvalSymlinks(filepath.Dir(a))
	rb, errB := filepath.EvalSymlinks(filepath.Dir(b))
	return errA == nil && errB == nil && filepath.Join(ra, filepath.Base(a)) == filepath.Join(rb, filepath.Base(b))
}
