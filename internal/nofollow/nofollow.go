// Package nofollow opens files and checks directories without following
// symbolic links, for the state store's directory (state/persist) and the
// device-info directory shared with device plugins (devinfo).
//
// The daemon runs as root and its state directory is a hostPath: anything
// that can write there could plant a symbolic link (as the lock file, a
// record, pods/ or corrupt/) to make root truncate, overwrite or read a file
// elsewhere. So nothing in the state directory is followed through a
// symbolic link: files are opened with O_NOFOLLOW and directories are
// checked with Lstat. (Writes replace files by rename, which replaces a
// link itself, never its target.)
package nofollow

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
)

// ErrSymlink is what a planted symbolic link gives.
var ErrSymlink = errors.New("is a symbolic link, which podres-proxy does not follow in its state directory")

// ErrNotRegular is what anything but a regular file gives (a FIFO, a
// device, a socket, a directory).
var ErrNotRegular = errors.New("is not a regular file")

// ErrTooLarge is what ReadFileMax gives for a file over its bound.
var ErrTooLarge = errors.New("is larger than podres-proxy reads")

// ReadFile reads a regular file, refusing a symbolic link and
// anything that is not a regular file (a FIFO would block the reader).
func ReadFile(path string) ([]byte, error) {
	return ReadFileMax(path, -1)
}

// ReadFileMax is ReadFile for a file of at most max bytes (max < 0: any
// size), for directories others write into: a file over max, or one that
// grows past it while being read, gives ErrTooLarge without being read
// whole, so a planted huge file costs no memory.
func ReadFileMax(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s %w", path, ErrSymlink)
		}
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %w (%s)", path, ErrNotRegular, fi.Mode().Type())
	}
	if max < 0 {
		return io.ReadAll(f)
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s %w (%d bytes, at most %d)", path, ErrTooLarge, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s %w (it grew past %d bytes while read)", path, ErrTooLarge, max)
	}
	return b, nil
}

// CheckDir fails when path exists and is a symbolic link or not a
// directory; a path that does not exist yet passes.
func CheckDir(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode().Type() == fs.ModeSymlink:
		return fmt.Errorf("%s %w: move it away", path, ErrSymlink)
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory (%s)", path, fi.Mode().Type())
	}
	return nil
}
