package report_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	eventsv1 "k8s.io/api/events/v1"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/report"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

// apiServer is a TLS API server that takes Events (POST and PATCH under
// /apis/events.k8s.io/v1) and, while hung, accepts them and answers none
// until released.
type apiServer struct {
	*httptest.Server
	caPath, tokenPath string

	release chan struct{} // closed: answer
	// refuse, when set, is the regarding UID whose Events are refused
	// (403), as a namespace being deleted refuses them.
	refuse  string
	mu      sync.Mutex
	hanging int                       // requests waiting for release
	created map[string]eventsv1.Event // by action
	patches []string                  // "name: body" of each PATCH
	gone    bool                      // PATCH answers 404, the Event expired
	busy    int                       // the next busy requests answer 503
	arrived chan struct{}             // a request arrived or was answered
}

func newAPIServer(t *testing.T, hung bool) *apiServer {
	t.Helper()
	s := &apiServer{release: make(chan struct{}), created: map[string]eventsv1.Event{}, arrived: make(chan struct{}, 1)}
	if !hung {
		close(s.release)
	}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	dir := t.TempDir()
	s.caPath, s.tokenPath = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	tlstest.ServerCA(t, s.caPath, s.Server)
	if err := os.WriteFile(s.tokenPath, []byte("sekret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.answer()
		s.Close()
	})
	return s
}

// answer releases the hung requests, and answers every one from now on.
func (s *apiServer) answer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.release:
	default:
		close(s.release)
	}
}

func (s *apiServer) signal() {
	select {
	case s.arrived <- struct{}{}:
	default:
	}
}

func (s *apiServer) serve(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/apis/events.k8s.io/v1/namespaces/") || r.Header.Get("Authorization") != "Bearer sekret" {
		http.Error(w, "not here: "+r.URL.Path+" "+r.Header.Get("Authorization"), http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return
	}
	s.mu.Lock()
	busy := s.busy > 0
	if busy {
		s.busy--
	}
	s.mu.Unlock()
	if busy {
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"ServiceUnavailable","code":503}`, http.StatusServiceUnavailable)
		return
	}
	s.mu.Lock()
	s.hanging++
	s.mu.Unlock()
	s.signal()
	select {
	case <-s.release:
	case <-r.Context().Done():
	}
	s.mu.Lock()
	s.hanging--
	s.mu.Unlock()
	if r.Context().Err() != nil {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodPatch {
		s.mu.Lock()
		s.patches = append(s.patches, filepath.Base(r.URL.Path)+": "+string(body))
		gone := s.gone
		s.mu.Unlock()
		s.signal()
		if gone {
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
			return
		}
		_, _ = fmt.Fprintf(w, `{"kind":"Event","apiVersion":"events.k8s.io/v1","metadata":{"name":%q,"namespace":"ns"}}`, filepath.Base(r.URL.Path))
		return
	}
	ev := &eventsv1.Event{}
	if err := json.Unmarshal(body, ev); err != nil || ev.Kind != "Event" {
		http.Error(w, fmt.Sprintf("not an Event (%v): %.200s", err, body), http.StatusBadRequest)
		return
	}
	if s.refuse != "" && string(ev.Regarding.UID) == s.refuse {
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}`, http.StatusForbidden)
		return
	}
	out, err := json.Marshal(ev)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	s.mu.Lock()
	s.created[ev.Action] = *ev
	s.mu.Unlock()
	s.signal()
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(out)
}

func (s *apiServer) state() (hanging int, created map[string]eventsv1.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]eventsv1.Event, len(s.created))
	for k, v := range s.created {
		out[k] = v
	}
	return s.hanging, out
}

// await waits until cond holds of the server, at each request.
func (s *apiServer) await(t *testing.T, what string, cond func(hanging int, created map[string]eventsv1.Event) bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		if cond(s.state()) {
			return
		}
		select {
		case <-s.arrived:
		case <-deadline:
			h, c := s.state()
			t.Fatalf("waiting for %s: %d requests hanging, %d Events created", what, h, len(c))
		}
	}
}

// counts is report.Metrics, counted.
type counts struct {
	mu                     sync.Mutex
	emitted, dropped, fail int
}

func (c *counts) EventEmitted(string) { c.mu.Lock(); c.emitted++; c.mu.Unlock() }
func (c *counts) EventDropped(string) { c.mu.Lock(); c.dropped++; c.mu.Unlock() }
func (c *counts) EventWriteFailed()   { c.mu.Lock(); c.fail++; c.mu.Unlock() }
func (c *counts) get() (emitted, dropped, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.emitted, c.dropped, c.fail
}

func newReporter(t *testing.T, s *apiServer, queue int, m report.Metrics, log ...logrus.FieldLogger) *report.Reporter {
	t.Helper()
	cfg, err := apiclient.Config(apiclient.Options{Server: s.URL, TokenFile: s.tokenPath, CAFile: s.caPath, QPS: 1000, Burst: 1000})
	if err != nil {
		t.Fatal(err)
	}
	o := report.Options{Config: cfg, Node: "node-a", Queue: queue, Timeout: time.Minute, Metrics: m}
	if len(log) > 0 {
		o.Log = log[0]
	}
	r, err := report.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run runs r until the test ends, and checks that Run returns then.
func run(t *testing.T, r *report.Reporter) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
}

func pod(i int) model.PodRef {
	return model.PodRef{UID: fmt.Sprintf("uid-%d", i), Namespace: "ns", Name: fmt.Sprintf("pod-%d", i)}
}

// An API server that accepts connections and never answers delays no
// emission: each returns at once, at most a queue of Events waits (the
// rest dropped and counted) and a handful of requests is in flight; once
// it answers, every Event not dropped is delivered, once.
func TestAHungAPIServerDelaysNoEmissionAndGetsTheQueuedEventsOnceItAnswers(t *testing.T) {
	s := newAPIServer(t, true)
	m := &counts{}
	const queue, emitted = 8, 200
	r := newReporter(t, s, queue, m)
	goroutines := runtime.NumGoroutine()
	run(t, r)

	var slowest time.Duration
	for i := range emitted {
		start := time.Now()
		r.Pod(pod(i), report.ReasonAllocationRefused, fmt.Sprintf("Refuse %d", i), "refused")
		slowest = max(slowest, time.Since(start))
	}
	if slowest > 50*time.Millisecond {
		t.Errorf("the slowest of %d emissions took %s while the API server hangs", emitted, slowest)
	}
	s.await(t, "4 Events' requests to hang", func(hanging int, _ map[string]eventsv1.Event) bool { return hanging >= 4 })
	_, dropped, _ := m.get()
	// Held: the queue, the Event Run holds until a write ends, and those
	// handed over (at most 4 in flight).
	if held := emitted - dropped; held > queue+1+4 || held < queue {
		t.Errorf("%d Events dropped of %d, so %d held: want the queue's %d, plus at most 5", dropped, emitted, held, queue)
	}
	hanging, created := s.state()
	if hanging > 4 || len(created) > 0 {
		t.Errorf("while hung: %d requests in flight, %d Events created; want at most 4, none", hanging, len(created))
	}
	if n := runtime.NumGoroutine() - goroutines; n > 60 {
		t.Errorf("%d goroutines more while the API server hangs", n)
	}
	t.Logf("hung: slowest emission %s, %d dropped, %d requests in flight, %d goroutines more", slowest, dropped, hanging, runtime.NumGoroutine()-goroutines)

	s.answer()
	held := emitted - dropped
	s.await(t, fmt.Sprintf("the %d Events held to be created", held), func(_ int, created map[string]eventsv1.Event) bool { return len(created) >= held })
	_, created = s.state()
	if len(created) != held {
		t.Errorf("%d Events created, want the %d not dropped", len(created), held)
	}
	for action, ev := range created {
		if ev.Type != "Warning" || ev.Reason != report.ReasonAllocationRefused || ev.ReportingController != report.Controller ||
			ev.ReportingInstance != "node-a" || ev.Regarding.Kind != "Pod" || !strings.HasPrefix(string(ev.Regarding.UID), "uid-") {
			t.Errorf("Event %s: %+v", action, ev)
		}
	}
	if got, _, failed := m.get(); got != held || failed != 0 {
		t.Errorf("emitted %d, write errors %d; want %d, 0", got, failed, held)
	}
}

// An Event names the pod by UID, namespace and name, is reported by
// podres-proxy from this node, and carries no control characters of a
// tenant's input, within the API server's bounds.
func TestAnEventIsAWarningOnThePodFromThisNodeBoundedAndPrintable(t *testing.T) {
	s := newAPIServer(t, false)
	r := newReporter(t, s, 0, nil)
	run(t, r)
	note := "annotation k: \x1b[31mred\x1b[0m " + strings.Repeat("x", 5000)
	r.Pod(model.PodRef{UID: "u-1", Namespace: "team", Name: "p"}, report.ReasonAnnotationUndecodable, "Decode k", note)
	r.Node(report.ReasonStateWritesFailing, "Write state", "disk full")
	s.await(t, "two Events", func(_ int, created map[string]eventsv1.Event) bool { return len(created) == 2 })
	_, created := s.state()
	ev := created["Decode k"]
	if ev.Regarding.UID != "u-1" || ev.Regarding.Namespace != "team" || ev.Regarding.Name != "p" || ev.Namespace != "team" {
		t.Errorf("Event on the pod: regarding %+v in namespace %q", ev.Regarding, ev.Namespace)
	}
	if len(ev.Note) > 1024 || strings.ContainsRune(ev.Note, '\x1b') || !strings.HasPrefix(ev.Note, "annotation k: ?[31mred") {
		t.Errorf("note of %d bytes: %.80q", len(ev.Note), ev.Note)
	}
	node := created["Write state"]
	if node.Regarding.Kind != "Node" || node.Regarding.Name != "node-a" || node.Type != "Warning" || node.ReportingInstance != "node-a" {
		t.Errorf("Event on the node: %+v", node)
	}
}

// An Event the API server refuses (its pod's namespace being deleted) is
// logged on the daemon's log, without holding up the others as an API
// server that does not answer does.
func TestAnEventTheAPIServerRefusesHoldsUpNoOther(t *testing.T) {
	s := newAPIServer(t, false)
	s.refuse = "uid-refused"
	log, hook := test.NewNullLogger()
	r := newReporter(t, s, 0, nil, log)
	run(t, r)
	r.Pod(model.PodRef{UID: "uid-refused", Namespace: "gone", Name: "p"}, report.ReasonAllocationRefused, "Refuse", "refused")
	for i := range 10 {
		r.Pod(pod(i), report.ReasonAllocationRefused, fmt.Sprintf("Refuse %d", i), "refused")
	}
	start := time.Now()
	s.await(t, "the 10 others", func(_ int, created map[string]eventsv1.Event) bool { return len(created) == 10 })
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the others took %s after one was refused", took)
	}
	// The refusal is logged by the goroutine that wrote it, which may
	// finish after the others' writes.
	poll.UntilWith(t, "the refusal on the daemon's log", func() bool {
		for _, e := range hook.AllEntries() {
			if e.Level == logrus.WarnLevel && strings.HasPrefix(e.Message, "Events: ") && e.Data[logrus.ErrorKey] != nil {
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprint(hook.AllEntries()) })
}

// An Event the API server could not take (503: overloaded, a restart) is
// written again, and is there once, without the daemon's log warning of it.
func TestAnEventTheAPIServerCouldNotTakeIsWrittenAgain(t *testing.T) {
	s := newAPIServer(t, false)
	s.busy = 1
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	m := &counts{}
	r := newReporter(t, s, 0, m, log)
	run(t, r)
	r.Pod(pod(1), report.ReasonAllocationRefused, "Refuse gpu-1", "refused")
	s.await(t, "the Event, written again", func(_ int, created map[string]eventsv1.Event) bool { return len(created) == 1 })
	if emitted, _, failed := m.get(); emitted != 1 || failed != 1 {
		t.Errorf("%d Events emitted, %d write errors counted; want the one Event, the one 503", emitted, failed)
	}
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			t.Errorf("logged at %s: %s", e.Level, e.Message)
		}
	}
}

// The same decision reported again (a refusal that went and came back)
// updates the first Event's series, as kubectl describe shows "(x2 over
// ...)", instead of adding an object; once that Event is gone (expired), a
// new one is written.
func TestALikeEventUpdatesTheSeriesInsteadOfAddingAnObject(t *testing.T) {
	s := newAPIServer(t, false)
	r := newReporter(t, s, 0, nil)
	run(t, r)
	patched := func(n int) func(int, map[string]eventsv1.Event) bool {
		return func(int, map[string]eventsv1.Event) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.patches) >= n
		}
	}
	r.Pod(pod(1), report.ReasonAllocationRefused, "Refuse gpu-1", "refused")
	s.await(t, "the first Event", func(_ int, created map[string]eventsv1.Event) bool { return len(created) == 1 })
	_, created := s.state()
	first := created["Refuse gpu-1"].Name
	r.Pod(pod(1), report.ReasonAllocationRefused, "Refuse gpu-1", "refused")
	s.await(t, "the series update", patched(1))
	r.Pod(pod(1), report.ReasonAllocationRefused, "Refuse gpu-1", "refused")
	s.await(t, "the second series update", patched(2))
	s.mu.Lock()
	patches := append([]string(nil), s.patches...)
	s.gone = true
	s.mu.Unlock()
	for i, p := range patches {
		if want := fmt.Sprintf(`%s: {"series":{"count":%d,`, first, i+2); !strings.HasPrefix(p, want) {
			t.Errorf("PATCH %d: %s; want %s...", i, p, want)
		}
	}
	if _, created = s.state(); len(created) != 1 {
		t.Errorf("%d Events created for one decision reported thrice; want 1", len(created))
	}

	r.Pod(pod(1), report.ReasonAllocationRefused, "Refuse gpu-1", "refused")
	s.await(t, "a new Event for the expired one", func(int, map[string]eventsv1.Event) bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.created["Refuse gpu-1"].Name != first
	})
}

// A nil reporter (Events off) takes every call and reports nothing.
func TestANilReporterReportsNothing(t *testing.T) {
	var r *report.Reporter
	r.Pod(pod(1), report.ReasonAllocationRefused, "a", "n")
	r.Node(report.ReasonNRIDisconnected, "a", "n")
}

func TestTruncateCutsAtARuneAndSaysSo(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"short", "short"},
		{"abcdefghij", "abcde…"}, // "…" is 3 bytes
		{"ééééé", "éé…"},
	} {
		if got := report.Truncate(c.in, 8); got != c.want {
			t.Errorf("Truncate(%q, 8) = %q, want %q", c.in, got, c.want)
		}
	}
}
