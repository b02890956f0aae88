package persist

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/podres-proxy/podres-proxy/internal/nofollow"
)

// ErrInUse is what the error Open returns matches (errors.Is) when another
// process already writes the state directory. Two writers would each
// believe their memory is the truth and overwrite each other's files.
var ErrInUse = errors.New("state directory is in use")

type inUseError struct {
	dir string
	pid string // "unknown" when the holder has not written it yet
}

func (e *inUseError) Error() string {
	return fmt.Sprintf("state directory %s is in use by another podres-proxy (pid %s)", e.dir, e.pid)
}

func (e *inUseError) Is(target error) bool { return target == ErrInUse }

// lockDir takes the writer lock of a state directory: an exclusive flock on
// <dir>/lock, which the kernel releases when the process dies however it
// dies, so a crash never leaves a stale lock behind. The file then holds our
// pid for the error another writer gets. The returned file keeps the lock
// until it is closed.
//
// The pid only feeds that error message, so failing to write it (a full
// disk: the kubelet and the runtime start on one too) is reported to warn,
// never fatal. The lock file is never followed through a symbolic link: a
// link planted there would make root truncate its target.
func lockDir(dir string, warn func(error)) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o640)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			err = fmt.Errorf("%s %w: move it away", path, nofollow.ErrSymlink)
		}
		return nil, fmt.Errorf("open lock file of state directory %s: %w", dir, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("lock file %s is not a regular file: move it away", path)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &inUseError{dir: dir, pid: readPID(path)}
		}
		return nil, fmt.Errorf("lock state directory %s: %w", dir, err)
	}
	if err := writePID(f, []byte(strconv.Itoa(os.Getpid())+"\n")); err != nil && warn != nil {
		warn(fmt.Errorf("write pid into lock file %s (only another writer's error message needs it): %w", path, err))
	}
	return f, nil
}

// writePID replaces the lock file's content with pid.
func writePID(f *os.File, pid []byte) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.WriteAt(pid, 0)
	return err
}

func readPID(path string) string {
	b, err := nofollow.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	if pid := strings.TrimSpace(string(b)); pid != "" {
		return pid
	}
	return "unknown"
}
