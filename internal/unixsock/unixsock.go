// Package unixsock reads the unix socket flags (--socket, --kubelet-socket,
// --cri-socket) one way: a path, or a unix:// URL as the kubelet and CRI
// clients write them; and listens on a socket the way the kubelet makes
// its own (Listen): atomically, privately, never over another file.
package unixsock

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Target turns an absolute socket path or a unix URL (unix:///abs/path,
// unix:/abs/path) into a gRPC target. Relative paths, whose meaning would
// depend on the daemon's working directory, and other schemes are errors.
func Target(socket string) (string, error) {
	path := socket
	if scheme, rest, ok := strings.Cut(socket, "://"); ok {
		if scheme != "unix" {
			return "", fmt.Errorf("socket %q: only unix sockets are supported", socket)
		}
		path = rest
	} else if rest, ok := strings.CutPrefix(socket, "unix:"); ok {
		path = rest
	}
	if path == "" {
		return "", errors.New("empty socket path")
	}
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("socket %q: want unix:///absolute/path or /absolute/path", socket)
	}
	return "unix://" + path, nil
}
