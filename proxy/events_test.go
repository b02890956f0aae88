package proxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	eventsv1 "k8s.io/api/events/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/report"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

// eventsAPIServer is an API server that accepts every connection and answers
// no request until answer is called; then it creates every Event posted.
type eventsAPIServer struct {
	*httptest.Server
	caPath, tokenPath string
	release           chan struct{}
	once              sync.Once
	mu                sync.Mutex
	created           map[string]eventsv1.Event // by regarding UID and action
}

func newEventsAPI(t *testing.T) *eventsAPIServer {
	t.Helper()
	s := &eventsAPIServer{release: make(chan struct{}), created: map[string]eventsv1.Event{}}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		select {
		case <-s.release:
		case <-r.Context().Done():
			return
		}
		if err != nil || r.Method != http.MethodPost {
			http.Error(w, "only Events are created here", http.StatusBadRequest)
			return
		}
		ev := &eventsv1.Event{}
		if err := json.Unmarshal(body, ev); err != nil || ev.Kind != "Event" {
			http.Error(w, fmt.Sprintf("not an Event (%v): %.200s", err, body), http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		s.created[string(ev.Regarding.UID)+" "+ev.Action] = *ev
		s.mu.Unlock()
		w.Header().Set("Content-Type", r.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	dir := t.TempDir()
	s.caPath, s.tokenPath = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "token")
	tlstest.ServerCA(t, s.caPath, s.Server)
	if err := os.WriteFile(s.tokenPath, []byte("sekret"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.answer(); s.Close() })
	return s
}

func (s *eventsAPIServer) answer() { s.once.Do(func() { close(s.release) }) }

func (s *eventsAPIServer) createdCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.created)
}

// dropCounter is report.Metrics, counting the drops.
type dropCounter struct {
	mu      sync.Mutex
	dropped int
}

func (d *dropCounter) EventEmitted(string) {}
func (d *dropCounter) EventDropped(string) { d.mu.Lock(); d.dropped++; d.mu.Unlock() }
func (d *dropCounter) EventWriteFailed()   {}
func (d *dropCounter) count() int          { d.mu.Lock(); defer d.mu.Unlock(); return d.dropped }

// While the API server accepts connections and answers nothing, every List
// and Get is answered in its usual time, though the pods' refusals are
// being reported; at most a queue of Events waits, the rest counted as
// dropped, and once the API server answers the Events are there.
func TestQueriesAreAnsweredInTheirUsualTimeWhileTheAPIServerHangs(t *testing.T) {
	api := newEventsAPI(t)
	cfg, err := apiclient.Config(apiclient.Options{Server: api.URL, TokenFile: api.tokenPath, CAFile: api.caPath})
	if err != nil {
		t.Fatal(err)
	}
	drops := &dropCounter{}
	const queue = 8
	reporter, err := report.New(report.Options{Config: cfg, Node: "node-a", Queue: queue, Timeout: time.Minute, Metrics: drops})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = reporter.Run(rctx) }()
	t.Cleanup(func() { stop(); <-stopped })

	h := newHarness(t, withNode(), withProviders(func(p *proxy.Providers) { p.Report = reporter }))
	gpu := fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})
	victim := fk.NewPod("ml", "victim", "uid-victim", fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, oneGPU), gpu)
	pods := []fk.Pod{victim}
	const copycats = 30
	for i := range copycats {
		pods = append(pods, fk.NewPod("tenant", fmt.Sprintf("copycat-%d", i), fmt.Sprintf("uid-copycat-%d", i), fk.WithAnnotation(koordKey, oneGPU), gpu))
	}
	h.k.SetPods(pods...)
	for _, p := range pods {
		h.markLive(p, "sandbox-"+p.Name)
	}
	awaitStore(t, h.store, "every copycat's allocation refused", func() bool {
		for i := range copycats {
			if len(refusedReasons(h, fmt.Sprintf("uid-copycat-%d", i))) == 0 {
				return false
			}
		}
		return true
	})

	client := h.v1() // one connection, as an agent keeps
	// queries returns the slowest of 50 rounds of a List and two Gets.
	queries := func() time.Duration {
		var slowest time.Duration
		for i := range 50 {
			start := time.Now()
			if _, err := client.List(ctx(t), &v1.ListPodResourcesRequest{}); err != nil {
				t.Fatalf("List: %v", err)
			}
			for _, name := range []string{fmt.Sprintf("copycat-%d", i%copycats), "victim"} {
				ns := map[bool]string{true: "ml", false: "tenant"}[name == "victim"]
				if _, err := client.Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: ns, PodName: name}); err != nil {
					t.Fatalf("Get %s/%s: %v", ns, name, err)
				}
			}
			slowest = max(slowest, time.Since(start))
		}
		return slowest
	}
	if _, err := client.List(ctx(t), &v1.ListPodResourcesRequest{}); err != nil { // the connection made
		t.Fatalf("List: %v", err)
	}
	slowest := queries()
	if slowest > 2*time.Second {
		t.Errorf("the slowest List and two Gets took %s while the API server hangs", slowest)
	}
	if n := api.createdCount(); n != 0 {
		t.Fatalf("%d Events created by an API server that answers nothing", n)
	}
	dropped := drops.count()
	if held := copycats - dropped; held < queue || held > queue+5 {
		t.Errorf("%d of %d Events dropped: %d held, want the queue's %d and at most 5 more (4 in flight, 1 waiting)", dropped, copycats, held, queue)
	}
	t.Logf("while hung: the slowest List and two Gets %s, %d of %d Events dropped", slowest, dropped, copycats)

	api.answer()
	want := copycats - dropped
	deadline := time.Now().Add(30 * time.Second)
	for api.createdCount() < want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the server offers no event to await
	}
	t.Logf("with the API server answering: the slowest List and two Gets %s", queries())
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.created) != want {
		t.Fatalf("%d Events created once the API server answered, want %d", len(api.created), want)
	}
	for key, ev := range api.created {
		if ev.Reason != report.ReasonAllocationRefused || !strings.HasPrefix(string(ev.Regarding.UID), "uid-copycat-") ||
			!strings.Contains(ev.Note, gpuUUID) || !strings.Contains(ev.Note, "wrong-scheduler") {
			t.Errorf("Event %s: reason %s regarding %s: %q", key, ev.Reason, ev.Regarding.UID, ev.Note)
		}
	}
}

// podReports records what a server reports.
type podReports struct {
	mu  sync.Mutex
	got []string
}

func (r *podReports) Pod(pod model.PodRef, reason, _, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, pod.UID+" "+reason+": "+note)
}

// A pod being created that is answered Unavailable (the kubelet's /pods
// down) is reported on the pod, once, however often it is asked about.
func TestAPodAnsweredUnavailableWhileCreatedIsReportedOnce(t *testing.T) {
	r := &podReports{}
	h := newHarness(t, withProviders(func(p *proxy.Providers) { p.Report = r }))
	h.k.SetPods(fk.NewPod("default", "creating", "uid-1", byKoord, fk.WithAnnotation(koordKey, oneGPU), koordApp, fk.WithPhase("Pending")))
	h.list() // the kubelet's names give the pod its UID
	h.k.BeginSandbox("default", "creating", "uid-1")
	h.k.SetPodsDown(true)
	for range 5 {
		if _, err := h.v1().Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "default", PodName: "creating"}); status.Code(err) != codes.Unavailable {
			t.Fatalf("Get of a pod being created with /pods down = %v, want Unavailable", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) != 1 || !strings.HasPrefix(r.got[0], "uid-1 "+report.ReasonAnsweredUnavailable+": ") {
		t.Errorf("reported %q, want one %s on uid-1", r.got, report.ReasonAnsweredUnavailable)
	}
}
