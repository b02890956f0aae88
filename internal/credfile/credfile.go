// Package credfile reads the small files credentials come in (a bearer
// token, a CA bundle, a certificate and its key), each bounded, so that a
// wrong path given for one (a log, a device) cannot take the daemon's
// memory. The files are read through symbolic links: Kubernetes mounts a
// service account's token, a Secret and a ConfigMap through a ..data link,
// which is how a rotation replaces them at once.
package credfile

import (
	"fmt"
	"io"
	"os"
)

// MaxSize is the largest file Read returns: a CA bundle of every public
// root is about 200 KiB.
const MaxSize = 1 << 20

// Read returns path's content, or an error when it cannot be read or is
// larger than MaxSize.
func Read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, MaxSize)
	}
	return b, nil
}
