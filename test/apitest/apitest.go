// Package apitest is an API server over TLS that speaks enough of the
// Kubernetes API for client-go's reflectors: list (with field selectors on
// any field path, and resourceVersion), watch (from a resourceVersion,
// 410 Gone before the oldest kept event), get by name; and that a test can
// make hang, refuse, or drop its watches. It answers a watch-list request
// (sendInitialEvents) with 400, as an API server without the feature does:
// the reflector then lists.
package apitest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

// Request is one request the server got.
type Request struct {
	Verb string // list, watch, get
	Path string
}

type event struct {
	rv   int
	typ  string
	coll string
	obj  map[string]any
}

// Server is the fake API server.
type Server struct {
	*httptest.Server
	CAFile, TokenFile string

	mu       sync.Mutex
	rv       int
	kinds    map[string]string                    // collection path: list kind
	objects  map[string]map[string]map[string]any // collection: name: object
	history  []event
	oldest   int           // events before this resourceVersion are forgotten
	hang     chan struct{} // non-nil: requests wait until it is closed
	refuse   int           // non-zero: every request gets this status
	drop     chan struct{} // closed to end the open watches
	drops    int           // DropWatches so far
	notify   chan struct{} // closed at the next event
	requests []Request
}

// New starts a server that serves the given collections, each a path
// ("/apis/resource.k8s.io/v1/resourceslices") and its list kind.
func New(t testing.TB, collections map[string]string) *Server {
	s := &Server{kinds: collections, objects: map[string]map[string]map[string]any{}, rv: 100,
		drop: make(chan struct{}), notify: make(chan struct{})}
	for c := range collections {
		s.objects[c] = map[string]map[string]any{}
	}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.EnableHTTP2 = true
	s.StartTLS()
	t.Cleanup(func() {
		s.Release()
		s.DropWatches()
		s.Close()
	})
	dir := t.TempDir()
	s.CAFile = filepath.Join(dir, "ca.crt")
	s.TokenFile = filepath.Join(dir, "token")
	tlstest.ServerCA(t, s.CAFile, s.Server)
	if err := os.WriteFile(s.TokenFile, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// Put creates or replaces an object (JSON with metadata.name) of
// collection, and tells the watches. A namespaced object is served under
// its namespace's path, and named namespace/name here.
func (s *Server) Put(collection, object string) {
	var obj map[string]any
	if err := json.Unmarshal([]byte(object), &obj); err != nil {
		panic(fmt.Sprintf("apitest: object %s: %v", object, err))
	}
	meta, _ := obj["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if ns, _ := meta["namespace"].(string); ns != "" {
		name = ns + "/" + name
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	typ := "ADDED"
	if _, ok := s.objects[collection][name]; ok {
		typ = "MODIFIED"
	}
	s.rv++
	meta["resourceVersion"] = strconv.Itoa(s.rv)
	s.objects[collection][name] = obj
	s.event(typ, collection, obj)
}

// Delete deletes an object, and tells the watches.
func (s *Server) Delete(collection, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, ok := s.objects[collection][name]
	if !ok {
		return
	}
	delete(s.objects[collection], name)
	s.rv++
	obj["metadata"].(map[string]any)["resourceVersion"] = strconv.Itoa(s.rv)
	s.event("DELETED", collection, obj)
}

func (s *Server) event(typ, coll string, obj map[string]any) {
	s.history = append(s.history, event{rv: s.rv, typ: typ, coll: coll, obj: obj})
	close(s.notify)
	s.notify = make(chan struct{})
}

// Hang makes every request, and the open watches' next events, wait until
// Release.
func (s *Server) Hang() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hang == nil {
		s.hang = make(chan struct{})
	}
}

// Release lets the requests Hang held go on.
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hang != nil {
		close(s.hang)
		s.hang = nil
	}
}

// Refuse answers every request with status (0: serve again).
func (s *Server) Refuse(status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = status
}

// DropWatches ends every open watch.
func (s *Server) DropWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.drop)
	s.drop = make(chan struct{})
	s.drops++
}

// Compact forgets the events so far: a watch from an older resourceVersion
// gets 410 Gone, and the reflector lists again.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.oldest = s.rv + 1
	s.history = nil
}

// Requests returns the requests so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Count returns how many requests of verb the server got for path.
func (s *Server) Count(verb, path string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Verb == verb && r.Path == path {
			n++
		}
	}
	return n
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	coll, name := s.route(r.URL.Path)
	q := r.URL.Query()
	verb := "get"
	switch {
	case name != "":
	case q.Get("watch") == "true" || q.Get("watch") == "1":
		verb = "watch"
	default:
		verb = "list"
	}
	s.mu.Lock()
	s.requests = append(s.requests, Request{Verb: verb, Path: r.URL.Path})
	hang, refuse, drops := s.hang, s.refuse, s.drops
	s.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
			return
		}
	}
	switch {
	case refuse != 0:
		status(w, refuse, "refused by the test")
		return
	case r.Header.Get("Authorization") != "Bearer token-1":
		status(w, http.StatusUnauthorized, "Unauthorized")
		return
	case coll == "":
		status(w, http.StatusNotFound, "the server could not find the requested resource")
		return
	}
	sel, err := selector(q.Get("fieldSelector"))
	if err != nil {
		status(w, http.StatusBadRequest, err.Error())
		return
	}
	switch verb {
	case "get":
		s.mu.Lock()
		obj, ok := s.objects[coll][name]
		body, _ := json.Marshal(obj)
		s.mu.Unlock()
		if !ok {
			status(w, http.StatusNotFound, name+" not found")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	case "list":
		s.list(w, coll, sel)
	case "watch":
		if q.Get("sendInitialEvents") == "true" {
			status(w, http.StatusBadRequest, "sendInitialEvents is not supported")
			return
		}
		from, _ := strconv.Atoi(q.Get("resourceVersion"))
		s.watch(w, r, coll, sel, from, drops)
	}
}

// route splits a path into a served collection and an object's name.
func (s *Server) route(path string) (coll, name string) {
	if _, ok := s.kinds[path]; ok {
		return path, ""
	}
	i := strings.LastIndex(path, "/")
	if i > 0 {
		if _, ok := s.kinds[path[:i]]; ok {
			return path[:i], path[i+1:]
		}
	}
	// A namespaced object: /apis/G/V/namespaces/NS/R/NAME is served as
	// the collection /apis/G/V/R, its objects named NS/NAME.
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if len(parts) == 7 && parts[3] == "namespaces" {
		c := "/" + strings.Join(append(parts[:3:3], parts[5]), "/")
		if _, ok := s.kinds[c]; ok {
			return c, parts[4] + "/" + parts[6]
		}
	}
	return "", ""
}

func (s *Server) list(w http.ResponseWriter, coll string, sel func(map[string]any) bool) {
	s.mu.Lock()
	items := []map[string]any{}
	for _, o := range s.objects[coll] {
		if sel(o) {
			items = append(items, o)
		}
	}
	body, _ := json.Marshal(map[string]any{
		"kind": s.kinds[coll], "apiVersion": apiVersion(coll),
		"metadata": map[string]any{"resourceVersion": strconv.Itoa(s.rv)},
		"items":    items,
	})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// watch streams coll's events after from until the request ends or a
// DropWatches after the drops-th, even one made before the stream began.
func (s *Server) watch(w http.ResponseWriter, r *http.Request, coll string, sel func(map[string]any) bool, from, drops int) {
	s.mu.Lock()
	if from < s.oldest-1 {
		s.mu.Unlock()
		status(w, http.StatusGone, "too old resource version")
		return
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	flusher.Flush()
	enc := json.NewEncoder(w)
	for {
		s.mu.Lock()
		var send []event
		for _, e := range s.history {
			if e.rv > from && e.coll == coll {
				send = append(send, e)
			}
		}
		notify, drop, hang := s.notify, s.drop, s.hang
		if s.drops != drops {
			s.mu.Unlock()
			return
		}
		// encode under the lock: the objects are the server's
		var frames [][]byte
		for _, e := range send {
			from = e.rv
			if !sel(e.obj) {
				continue
			}
			b, _ := json.Marshal(map[string]any{"type": e.typ, "object": e.obj})
			frames = append(frames, b)
		}
		s.mu.Unlock()
		if hang != nil {
			select {
			case <-hang:
			case <-r.Context().Done():
				return
			}
		}
		for _, f := range frames {
			if err := enc.Encode(json.RawMessage(f)); err != nil {
				return
			}
		}
		flusher.Flush()
		select {
		case <-notify:
		case <-drop:
			return
		case <-r.Context().Done():
			return
		}
	}
}

func apiVersion(coll string) string {
	parts := strings.Split(strings.Trim(coll, "/"), "/")
	if parts[0] == "api" {
		return parts[1]
	}
	return parts[1] + "/" + parts[2]
}

// selector parses a field selector of a=b terms joined by commas.
func selector(s string) (func(map[string]any) bool, error) {
	type term struct {
		path []string
		want string
	}
	var terms []term
	for _, t := range strings.Split(s, ",") {
		if t == "" {
			continue
		}
		k, v, ok := strings.Cut(t, "=")
		if !ok {
			return nil, fmt.Errorf("field selector %q: want a=b", t)
		}
		terms = append(terms, term{strings.Split(k, "."), strings.TrimPrefix(v, "=")})
	}
	return func(obj map[string]any) bool {
		for _, t := range terms {
			var v any = obj
			for _, p := range t.path {
				m, _ := v.(map[string]any)
				v = m[p]
			}
			if s, _ := v.(string); s != t.want {
				return false
			}
		}
		return true
	}, nil
}

func status(w http.ResponseWriter, code int, msg string) {
	reason := map[int]string{400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 410: "Expired", 500: "InternalError"}[code]
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	b, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": msg, "reason": reason, "code": code})
	_, _ = w.Write(b)
}
