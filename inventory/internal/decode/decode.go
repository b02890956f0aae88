// Package decode holds what the inventory's readers of files and JSON share:
// a read bounded in size, JSON errors that say at which line and column, and
// the -1 that sysfs and Koordinator write for "unknown". The local file, the
// Device object and the published inventory use it, so that a mistake reads
// the same wherever it is made.
package decode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// ReadLimited reads the file at path, opened with flags added to O_RDONLY,
// and fails if it holds more than limit bytes. With O_NOFOLLOW a symbolic
// link is refused with an error that says so.
func ReadLimited(path string, limit int64, flags int) ([]byte, error) {
	file, err := os.OpenFile(path, os.O_RDONLY|flags, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) && flags&syscall.O_NOFOLLOW != 0 {
			return nil, fmt.Errorf("%s is a symbolic link, which podres-proxy does not follow in its state directory", path)
		}
		return nil, err
	}
	defer file.Close()
	content, err := io.ReadAll(io.LimitReader(file, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(content)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return content, nil
}

// NonNegative maps the -1 that sysfs and Koordinator use for "unknown" (and
// any other negative number) to nil, and copies any other number.
func NonNegative(p *int64) *int64 {
	if p == nil || *p < 0 {
		return nil
	}
	v := *p
	return &v
}

// JSONError adds the line and column to a JSON error, for the operator
// fixing the file.
func JSONError(data []byte, err error) error {
	var offset int64 = -1
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		offset = syntax.Offset
	case errors.As(err, &typ):
		offset = typ.Offset
	}
	if offset < 0 || offset > int64(len(data)) {
		return fmt.Errorf("decoding JSON: %w", err)
	}
	line := 1 + bytes.Count(data[:offset], []byte("\n"))
	col := int(offset) - bytes.LastIndexByte(data[:offset], '\n')
	return fmt.Errorf("decoding JSON at line %d, column %d: %w", line, col, err)
}
