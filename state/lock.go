package state

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open lock file of state directory %s: %w", dir, err)
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
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err = f.Truncate(0); err == nil {
		_, err = f.WriteAt(pid, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("write pid into lock file %s: %w", path, err)
	}
	return f, nil
}

func readPID(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "unknown"
	}
	if pid := strings.TrimSpace(string(b)); pid != "" {
		return pid
	}
	return "unknown"
}
