// Package atomicfile replaces files so that a reader, or a crash, sees the
// old content or the new one and never a part of either. The state store's
// pod records and the published device inventory are written this way,
// because operators and `podres-proxy inspect` read them without a lock
// while serve writes them.
package atomicfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// TempSuffix ends the names of temporary files, which also start with a
// dot, so that readers listing a directory skip writes in progress.
const TempSuffix = ".tmp"

// TempPattern is the os.CreateTemp pattern of the temporary files of name:
// ".<name>.<random>.tmp".
func TempPattern(name string) string { return "." + name + ".*" + TempSuffix }

// IsTemp reports whether a file name is one of Write's temporary files.
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, TempSuffix)
}

// Write replaces path with data, with permissions perm: a temporary file in
// the same directory is written, fsynced and renamed over path. It does not
// fsync the directory, which makes the rename durable: callers writing many
// files call SyncDir once for all of them. On error the temporary file is
// removed and path keeps its previous content. Errors name path and the
// step, not the temporary file's random name, so that the same failure
// reads the same each time it repeats.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rename the temporary file over %s: %w", path, plain(err))
	}
	return nil
}

// Create writes path with data, as Write does, unless path exists: the
// complete temporary file is linked to the name, which fails if the name
// is taken, so a concurrent writer's file is never replaced. It reports
// whether it created path.
func Create(path string, data []byte, perm os.FileMode) (created bool, err error) {
	tmp, err := writeTemp(path, data, perm)
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("link the temporary file to %s: %w", path, plain(err))
	}
	return true, nil
}

// writeTemp writes data to a new temporary file beside path, fsynced and
// closed, and returns its name; on error it leaves no file behind.
func writeTemp(path string, data []byte, perm os.FileMode) (_ string, err error) {
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, TempPattern(name))
	if err != nil {
		return "", fmt.Errorf("create a temporary file for %s: %w", path, plain(err))
	}
	tmp, closed := f.Name(), false
	defer func() {
		if err != nil {
			if !closed {
				f.Close()
			}
			os.Remove(tmp)
		}
	}()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err != nil {
		return "", fmt.Errorf("write %s: %w", path, plain(err))
	}
	if err = f.Sync(); err != nil {
		return "", fmt.Errorf("fsync %s: %w", path, plain(err))
	}
	closed = true
	if err = f.Close(); err != nil {
		return "", fmt.Errorf("close %s: %w", path, plain(err))
	}
	return tmp, nil
}

// SyncDir makes a directory's entries (creations, renames, removals)
// durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s to fsync it: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}

// plain drops the temporary file's name from a file system error.
func plain(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}
