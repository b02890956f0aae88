package podsapi_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/podsapitest"
)

// fallback is a /pods that counts its reads.
type fallback struct {
	mu    sync.Mutex
	reads int
	pods  []model.KubeletPod
}

func (f *fallback) fetch(context.Context) ([]model.KubeletPod, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.pods, nil
}

func (f *fallback) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}

func uids(pods []model.KubeletPod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.UID)
	}
	return out
}

// The kubelet drops a watcher that falls 100 events behind (a slow
// reader). The source watches again at once and relists, rather than
// after its backoff; and while it is not synced, reads for new pods go to
// ListPods, not /pods.
func TestADroppedWatchIsRelistedAtOnceAndReadsMeanwhileUseListPods(t *testing.T) {
	a, b := pod("ns", "a", "uid-a", 0), pod("ns", "b", "uid-b", 1)
	k := newKubelet(t, a, b)
	// The handler holds the watch goroutine when the watch ends, so the
	// reads below come while the source is not synced.
	unsynced, release := make(chan struct{}), make(chan struct{})
	h := start(t, k, podsapi.Options{
		// Far longer than the test may run: a watch that waited for it
		// would never come.
		Backoff: wait.Backoff{Duration: time.Hour, Factor: 2, Cap: time.Hour},
		Handler: func(ev podsapi.Event) {
			if ev.Type != podsapi.Unsynced {
				return
			}
			select {
			case unsynced <- struct{}{}:
				<-release
			case <-release: // the test is over
			}
		},
	})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // before h.stop
	h.expect("added uid-a", "added uid-b", "synced")

	k.Stall()
	for i := range podsapitest.QueueLength + 10 {
		b = b.DeepCopy()
		b.Annotations["example.com/gpu"] = "GPU-" + string(rune('a'+i%26))
		k.Update(b)
	}
	k.Add(pod("ns", "c", "uid-c", 2))
	k.Add(pod("ns", "d", "uid-d", 3))
	k.Resume()
	select {
	case <-unsynced:
	case <-time.After(waitTimeout):
		t.Fatal("the watch did not end after the kubelet dropped it")
	}
	if h.src.Synced() {
		t.Fatal("Synced() is true after the watch was dropped")
	}

	// Two new pods' Gets, each a fresh read.
	pods := &fallback{}
	read := h.src.Or(pods.fetch)
	lists := k.ListCalls()
	for _, uid := range []string{"uid-c", "uid-d"} {
		got, err := read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(uids(got), uid) {
			t.Errorf("a read while the watch is down gives %v, without the new %s", uids(got), uid)
		}
	}
	if n := pods.count(); n != 0 {
		t.Errorf("/pods was read %d times while the Pods API answered, want 0", n)
	}
	if n := k.ListCalls() - lists; n != 2 {
		t.Errorf("%d ListPods calls for 2 reads, want 2", n)
	}

	once.Do(func() { close(release) })
	h.until(is(podsapi.Synced))
	if n := k.WatchCalls(); n != 2 {
		t.Errorf("%d WatchPods calls, want 2: the first and the one right after the drop", n)
	}
	if got := h.uidOf("ns", "d"); got != "uid-d" {
		t.Errorf("ns/d is %q after the relist, want uid-d", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.relists) != 2 || h.reads[podsapi.SourcePodsAPI] != 2 || h.reads[podsapi.SourcePods] != 0 {
		t.Errorf("relists %v, reads by source %v; want 2 relists and 2 reads, all from the Pods API", h.relists, h.reads)
	}
}

// A v1.37 kubelet answers FailedPrecondition "Kubelet is initializing"
// after every start until its pod sources are ready. That is seconds, not
// a failure: the source keeps trying at a bounded pace (not a backoff
// grown tenfold per attempt, which would put the 7th attempt 111 s
// away), reads go to /pods meanwhile, the refusals are counted and told
// once at info, and the watch syncs as soon as the kubelet serves.
func TestWhileTheKubeletInitializesReadsGoToPodsAndTheWatchSyncsRightAfter(t *testing.T) {
	k := podsapitest.New(socketPath(t))
	k.Add(pod("ns", "a", "uid-a", 0))
	k.SetInitializing(true)
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	log, logs := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	h := start(t, k, podsapi.Options{
		Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 10, Cap: time.Hour},
		Log:     log,
	})

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	const attempts = 8
	if err := k.AwaitWatchCalls(ctx, attempts); err != nil {
		t.Fatalf("the watch stopped trying while the kubelet initialized: %v", err)
	}
	pods := &fallback{pods: []model.KubeletPod{{UID: "uid-a", Namespace: "ns", Name: "a"}}}
	got, err := h.src.Or(pods.fetch)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pods.count() != 1 || len(got) != 1 {
		t.Errorf("a read while the kubelet initializes: %d /pods reads, %d pods; want /pods's one", pods.count(), len(got))
	}
	if h.src.Synced() {
		t.Error("Synced() while the kubelet initializes")
	}

	k.SetInitializing(false)
	h.expect("added uid-a", "synced")

	h.mu.Lock()
	refused, reads := h.initializing, h.reads[podsapi.SourcePods]
	h.mu.Unlock()
	if want := k.WatchCalls() - 1; refused != want || refused < attempts {
		t.Errorf("Metrics counted %d watches refused as initializing, want %d (all but the last)", refused, want)
	}
	if reads != 1 {
		t.Errorf("Metrics counted %d reads from /pods, want 1", reads)
	}
	var told int
	for _, e := range logs.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			t.Errorf("logged at %v: %s", e.Level, e.Message)
		}
		if e.Level == logrus.InfoLevel && strings.Contains(e.Message, "initializing") {
			told++
		}
	}
	if told != 1 {
		t.Errorf("the kubelet initializing was logged at info %d times, want once", told)
	}
}

// On a kubelet without the Pods API (no socket), every read tries ListPods
// first: it must go on to /pods at once, counted as /pods's, and log
// nothing at warn or above.
func TestWithoutAPodsAPISocketReadsGoToPodsQuietly(t *testing.T) {
	k := podsapitest.New(socketPath(t)) // never started: no socket
	log, logs := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	h := start(t, k, podsapi.Options{Log: log})
	pods := &fallback{}
	read := h.src.Or(pods.fetch)
	for range 20 {
		if _, err := read(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if pods.count() != 20 {
		t.Errorf("%d of 20 reads went to /pods", pods.count())
	}
	h.mu.Lock()
	if n := h.reads[podsapi.SourcePods]; n != 20 {
		t.Errorf("Metrics counted %d reads from /pods, want 20", n)
	}
	h.mu.Unlock()
	for _, e := range logs.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			t.Errorf("logged at %v: %s (%v)", e.Level, e.Message, e.Data[logrus.ErrorKey])
		}
	}
}
