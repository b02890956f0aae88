package proxy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc"

	"github.com/podres-proxy/podres-proxy/internal/unixsock"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
)

// The server's views (merge.View, docs/views.md): every socket serves one.
// One kubelet call, and one Plan per pod, answer every view: a List's
// shared call builds the answer of each view served, each reused pod by
// pod from the view's own cache (a steady answer is one copying pass per
// view), and a Get renders its pod for the caller's view.

// socket is one socket the server listens on, and the view it serves.
type socket struct {
	path string
	view *view
	grpc *grpc.Server
	l    *unixsock.Listener
}

// view is one view served, with its List caches.
type view struct {
	name merge.View
	i    int // its index in Server.views and in viewAnswers
	// Each List method's pods, reused per pod (answers.go), by
	// lister.index.
	caches [2]reuse.Cache
}

// viewsOf returns the sockets cfg asks for, the default view's first, and
// the views they serve, each once. A socket path given twice is an error:
// two views cannot share a socket.
func viewsOf(cfg Config) ([]*socket, []*view, error) {
	all := append([]ViewSocket{{View: merge.Topology, Socket: cfg.Socket}}, cfg.Views...)
	var sockets []*socket
	var views []*view
	paths := map[string]merge.View{}
	for _, vs := range all {
		if _, err := merge.ParseView(string(vs.View)); err != nil {
			return nil, nil, fmt.Errorf("proxy: %w", err)
		}
		if vs.Socket == "" {
			return nil, nil, fmt.Errorf("proxy: view %s has no socket path", vs.View)
		}
		path := filepath.Clean(vs.Socket)
		if other, dup := paths[path]; dup {
			return nil, nil, fmt.Errorf("proxy: socket %s is given to views %s and %s: each socket serves one view", path, other, vs.View)
		}
		paths[path] = vs.View
		i := slices.IndexFunc(views, func(v *view) bool { return v.name == vs.View })
		if i < 0 {
			i = len(views)
			views = append(views, &view{name: vs.View, i: i})
		}
		sockets = append(sockets, &socket{path: path, view: views[i]})
	}
	return sockets, views, nil
}

// ParseViews reads serve's --view flags: each NAME=PATH a known view on a
// socket of its own, never --socket's, another view's or the kubelet's.
func ParseViews(flags []string, socket, kubeletSocket string) ([]ViewSocket, error) {
	used := map[string]string{filepath.Clean(socket): "--socket"}
	kubelet := filepath.Clean(strings.TrimPrefix(kubeletSocket, "unix://"))
	var out []ViewSocket
	for _, f := range flags {
		name, path, ok := strings.Cut(f, "=")
		if !ok || path == "" {
			return nil, fmt.Errorf("--view %q: want NAME=PATH, e.g. dcgm=/var/run/podres-proxy/dcgm/kubelet.sock", f)
		}
		v, err := merge.ParseView(name)
		if err != nil {
			return nil, fmt.Errorf("--view %q: %w", f, err)
		}
		path = filepath.Clean(path)
		if path == kubelet {
			return nil, fmt.Errorf("--view %q: %s is the kubelet's own socket: give each view a directory of its own", f, path)
		}
		if other, dup := used[path]; dup {
			return nil, fmt.Errorf("--view %q: %s is already served by %s: each socket serves one view", f, path, other)
		}
		used[path] = "--view " + name
		out = append(out, ViewSocket{View: v, Socket: path})
	}
	return out, nil
}

// viewAnswers are one List call's answers, one per view.
type viewAnswers []viewAnswer

type viewAnswer struct {
	out []byte
	err error
}

// of returns v's answer.
func (a viewAnswers) of(v *view) ([]byte, error) { return a[v.i].out, a[v.i].err }

// eachView builds every view's answer. A view whose answer fails does not
// fail the others'.
func (s *Server) eachView(build func(*view) ([]byte, error)) viewAnswers {
	out := make(viewAnswers, len(s.views))
	for _, v := range s.views {
		out[v.i].out, out[v.i].err = build(v)
	}
	return out
}
