package proxy

import (
	"cmp"
	"fmt"
	"path/filepath"
	"slices"

	"google.golang.org/grpc"

	"github.com/podres-proxy/podres-proxy/internal/unixsock"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
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

// orderForDCGM moves the pods that anchor a shared GPU to the end of a
// DCGM view's List answer, by namespace and name, the other fields and
// pods keeping the kubelet's order. DCGM exporter's default mode labels a
// GPU with the last pod listing it ("<uuid>::<n>" counts as <uuid>), and
// the kubelet lists pods in an order that changes from call to call: the
// GPU's pod label would flip between its sharers from scrape to scrape.
// This way it is the GPU's anchor, every time (or, when anchors of
// different GPUs share each other's, the same one every time). The
// kubelet promises no order, so no client can rely on another. An answer
// without an anchor is returned as it is.
func orderForDCGM(out []byte, t *plans.Table) ([]byte, error) {
	if !t.SharesGPUs() {
		return out, nil
	}
	parts, err := reuse.Split(nil, out)
	if err != nil {
		return nil, err
	}
	type anchor struct {
		key   model.PodKey
		field []byte
	}
	var last []anchor
	rest := make([]byte, 0, len(out))
	for _, p := range parts {
		if p.Pod != nil {
			key, err := reuse.PodKey(p.Pod)
			if err != nil {
				return nil, err
			}
			if anchors(t, key) {
				last = append(last, anchor{key, p.Field})
				continue
			}
		}
		rest = append(rest, p.Field...)
	}
	if len(last) == 0 {
		return out, nil
	}
	slices.SortStableFunc(last, func(a, b anchor) int {
		return cmp.Or(cmp.Compare(a.key.Namespace, b.key.Namespace), cmp.Compare(a.key.Name, b.key.Name))
	})
	for _, a := range last {
		rest = append(rest, a.field...)
	}
	return rest, nil
}

// anchors reports whether the pod under key anchors a shared GPU: its plan
// in t (the table its answer was just built from) says so.
func anchors(t *plans.Table, key model.PodKey) bool {
	rec, ok := t.Pods().Current(key)
	if !ok {
		rec, ok = t.Pods().Named(key)
	}
	return ok && t.Plan(rec.UID).Anchors()
}
