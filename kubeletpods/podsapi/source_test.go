package podsapi_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/podsapitest"
)

// waitTimeout bounds every wait for an event. It only turns a hang into a
// failure; nothing waits for time to pass.
const waitTimeout = 20 * time.Second

var epoch = time.Date(2026, 11, 1, 8, 0, 0, 0, time.UTC)

// pod returns a running pod that requests one example.com/gpu and carries
// an allocator annotation, created minute minutes after epoch.
func pod(ns, name, uid string, minute int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, UID: types.UID(uid),
			CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(minute) * time.Minute)),
			Annotations: map[string]string{
				"example.com/gpu":                    "GPU-" + uid,
				"kubectl.kubernetes.io/last-applied": "{}",
			},
		},
		Spec: corev1.PodSpec{
			SchedulerName: "example-scheduler",
			Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{"example.com/gpu": resource.MustParse("1")},
			}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

// exampleBounds keeps the example allocator's keys as allocator.Set keeps
// an allocator's: its hint (which the pod's owner writes) within 4 KiB,
// the others within 64 KiB.
func exampleBounds(key string) int {
	switch {
	case key == "example.com/hint":
		return 4 << 10
	case strings.HasPrefix(key, "example.com/"):
		return 64 << 10
	}
	return 0
}

// socketPath returns a short socket path (a unix socket's path is limited
// to 107 bytes, which t.TempDir's can exceed) removed after the test.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "podsapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "pods-api.sock")
}

// harness is a Source watching a fake kubelet, with the events its
// handler was told.
type harness struct {
	t       *testing.T
	kubelet *podsapitest.Server
	src     *podsapi.Source
	events  chan podsapi.Event
	cancel  context.CancelFunc
	done    chan struct{} // closed when Run returns

	stopOnce sync.Once

	mu           sync.Mutex
	reconnects   []error
	initializing int
	relists      [][2]int
	eventTypes   map[string]int
	reads        map[string]int
}

// The harness is the Source's Metrics: it records what the source reports.

func (h *harness) PodsAPIEvent(typ string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.eventTypes == nil {
		h.eventTypes = map[string]int{}
	}
	h.eventTypes[typ]++
}

func (h *harness) PodsAPIRelisted(pods, deleted int, _ time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.relists = append(h.relists, [2]int{pods, deleted})
}

func (h *harness) PodsAPIReconnect(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reconnects = append(h.reconnects, err)
}

func (h *harness) PodsAPIInitializing() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.initializing++
}

func (h *harness) PodSourceRead(source string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reads == nil {
		h.reads = map[string]int{}
	}
	h.reads[source]++
}

// start runs a Source against kubelet, recording its events, reconnects
// and relists. opts.Handler, if set, is called before each event is
// recorded; a zero opts.Backoff is a fast one (5 ms growing to 50 ms);
// a nil opts.Log discards the logs.
func start(t *testing.T, kubelet *podsapitest.Server, opts podsapi.Options) *harness {
	t.Helper()
	h := &harness{t: t, kubelet: kubelet, events: make(chan podsapi.Event, 10000), done: make(chan struct{})}
	opts.Socket = "unix://" + kubelet.Socket()
	if opts.MaxAnnotationBytes == nil {
		opts.MaxAnnotationBytes = exampleBounds
	}
	if opts.Backoff.Duration == 0 {
		opts.Backoff = wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Cap: 50 * time.Millisecond}
	}
	handler := opts.Handler
	opts.Handler = func(ev podsapi.Event) {
		if handler != nil {
			handler(ev)
		}
		h.events <- ev
	}
	opts.Metrics = h
	if opts.Log == nil {
		log, _ := test.NewNullLogger()
		log.SetLevel(logrus.DebugLevel)
		opts.Log = log
	}
	src, err := podsapi.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	h.src = src
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.done)
		if err := src.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(h.stop)
	return h
}

// stop cancels Run, waits for it to return and closes the Source.
func (h *harness) stop() { h.stopOnce.Do(h.stopNow) }

func (h *harness) stopNow() {
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(waitTimeout):
		h.t.Fatal("Run did not return after its context was cancelled")
	}
	if err := h.src.Close(); err != nil {
		h.t.Errorf("Close: %v", err)
	}
}

// next returns the next event the handler was told.
func (h *harness) next() podsapi.Event {
	h.t.Helper()
	select {
	case ev := <-h.events:
		return ev
	case <-time.After(waitTimeout):
		h.t.Fatal("no event from the Source")
		return podsapi.Event{}
	}
}

// expect reads the next events and checks their types and pods' UIDs
// ("" for events without a pod).
func (h *harness) expect(want ...string) {
	h.t.Helper()
	for i, w := range want {
		ev := h.next()
		got := string(ev.Type)
		if ev.Pod.UID != "" {
			got += " " + ev.Pod.UID
		}
		if got != w {
			h.t.Fatalf("event %d is %q, want %q (%v)", i, got, w, ev.Err)
		}
	}
}

// until skips events up to and including the first that match reports
// true for, and returns it.
func (h *harness) until(match func(podsapi.Event) bool) podsapi.Event {
	h.t.Helper()
	for {
		if ev := h.next(); match(ev) {
			return ev
		}
	}
}

func is(t podsapi.EventType) func(podsapi.Event) bool {
	return func(ev podsapi.Event) bool { return ev.Type == t }
}

func (h *harness) uidOf(ns, name string) string {
	h.t.Helper()
	p, ok := h.src.Lookup(ns, name)
	if !ok {
		return ""
	}
	return p.UID
}

func newKubelet(t *testing.T, pods ...*corev1.Pod) *podsapitest.Server {
	t.Helper()
	k := podsapitest.New(socketPath(t))
	for _, p := range pods {
		k.Add(p)
	}
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

func TestInitialSyncAddsEveryPodThenReportsSynced(t *testing.T) {
	k := newKubelet(t, pod("ns", "b", "uid-b", 1), pod("ns", "a", "uid-a", 0))
	h := start(t, k, podsapi.Options{})

	// The kubelet lists pods by UID.
	h.expect("added uid-a", "added uid-b", "synced")
	if !h.src.Synced() {
		t.Error("Synced() is false after the initial sync")
	}
	got, ok := h.src.Lookup("ns", "a")
	if !ok {
		t.Fatal("ns/a not found after the initial sync")
	}
	if got.Annotations["example.com/gpu"] != "GPU-uid-a" || len(got.Annotations) != 1 {
		t.Errorf("annotations %v, want only the allocator's", got.Annotations)
	}
	if got.Spec.SchedulerName != "example-scheduler" || got.Spec.Containers[0].Requests["example.com/gpu"] != "1" {
		t.Errorf("spec %+v", got.Spec)
	}
	if _, ok := h.src.Lookup("ns", "c"); ok {
		t.Error("Lookup found a pod the kubelet does not have")
	}
}

func TestWatchReportsAddedModifiedDeletedAndSkipsChangesNotKept(t *testing.T) {
	k := newKubelet(t)
	h := start(t, k, podsapi.Options{})
	h.expect("synced")

	p := pod("ns", "a", "uid-a", 0)
	k.Add(p)
	h.expect("added uid-a")

	// A status change the model does not keep is no event.
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	k.Update(p)
	p = p.DeepCopy()
	p.Annotations["example.com/gpu"] = "GPU-other"
	k.Update(p)
	ev := h.next()
	if ev.Type != podsapi.PodModified || ev.Pod.Annotations["example.com/gpu"] != "GPU-other" {
		t.Fatalf("event %v %+v, want modified with the new annotation", ev.Type, ev.Pod)
	}
	if got, _ := h.src.Lookup("ns", "a"); got.Annotations["example.com/gpu"] != "GPU-other" {
		t.Errorf("Lookup gives %v after the change", got.Annotations)
	}

	k.Delete(p)
	if ev := h.next(); ev.Type != podsapi.PodDeleted || ev.Pod.UID != "uid-a" || ev.ByRelist {
		t.Fatalf("event %v %s (by relist %v), want uid-a deleted by its DELETED", ev.Type, ev.Pod.UID, ev.ByRelist)
	}
	if _, ok := h.src.Lookup("ns", "a"); ok {
		t.Error("Lookup still finds a deleted pod")
	}
}

// PodResources has no UID: a name must mean the pod the kubelet has now
// under it, never its predecessor.
func TestPodRecreatedUnderItsNameLooksUpTheNewUID(t *testing.T) {
	old := pod("ns", "db-0", "uid-old", 0)
	k := newKubelet(t, old)
	h := start(t, k, podsapi.Options{})
	h.expect("added uid-old", "synced")

	// The new pod arrives while the old one is still being torn down.
	k.Add(pod("ns", "db-0", "uid-new", 5))
	h.expect("added uid-new")
	if got := h.uidOf("ns", "db-0"); got != "uid-new" {
		t.Errorf("Lookup gives %q beside its successor, want uid-new", got)
	}
	k.Delete(old)
	h.expect("deleted uid-old")
	if got := h.uidOf("ns", "db-0"); got != "uid-new" {
		t.Errorf("Lookup gives %q after the old pod went, want uid-new", got)
	}

	// A live pod is preferred to a newer finished one of the same name.
	done := pod("ns", "db-0", "uid-done", 9)
	done.Status.Phase = corev1.PodSucceeded
	k.Add(done)
	h.expect("added uid-done")
	if got := h.uidOf("ns", "db-0"); got != "uid-new" {
		t.Errorf("Lookup gives %q, want the live uid-new over the finished uid-done", got)
	}
}

// A kubelet restart loses nothing: the relist after reconnecting reports
// what was deleted while the source was away.
func TestKubeletRestartRelistReportsPodsDeletedMeanwhile(t *testing.T) {
	a, b := pod("ns", "a", "uid-a", 0), pod("ns", "b", "uid-b", 1)
	k := newKubelet(t, a, b)
	h := start(t, k, podsapi.Options{})
	h.expect("added uid-a", "added uid-b", "synced")

	k.Stop()
	h.expect("unsynced")
	if h.src.Synced() {
		t.Error("Synced() is true while the kubelet is away")
	}
	k.Delete(a)
	k.Add(pod("ns", "c", "uid-c", 2))
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}

	h.expect("added uid-c")
	if ev := h.next(); ev.Type != podsapi.PodDeleted || ev.Pod.UID != "uid-a" || !ev.ByRelist {
		t.Fatalf("event %v %s (by relist %v), want uid-a deleted by the relist", ev.Type, ev.Pod.UID, ev.ByRelist)
	}
	h.expect("synced")
	if !h.src.Synced() {
		t.Error("Synced() is false after the relist")
	}
	if _, ok := h.src.Lookup("ns", "a"); ok {
		t.Error("Lookup finds a pod deleted while the kubelet was away")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.reconnects) == 0 {
		t.Error("Metrics.PodsAPIReconnect was not called")
	}
	if n := len(h.relists); n != 2 || h.relists[1] != [2]int{2, 1} {
		t.Errorf("relists %v, want a second one of 2 pods with 1 deleted", h.relists)
	}
}

// The kubelet drops a watcher whose 100-event queue fills; what it missed
// comes back with the relist of the next watch.
func TestDroppedWatcherRecoversByRelist(t *testing.T) {
	a, b := pod("ns", "a", "uid-a", 0), pod("ns", "b", "uid-b", 1)
	k := newKubelet(t, a, b)
	h := start(t, k, podsapi.Options{})
	h.expect("added uid-a", "added uid-b", "synced")

	k.Stall()
	for i := range podsapitest.QueueLength + 10 {
		b = b.DeepCopy()
		b.Annotations["example.com/gpu"] = "GPU-" + string(rune('a'+i%26))
		k.Update(b)
	}
	k.Delete(a)
	k.Add(pod("ns", "c", "uid-c", 2))
	k.Resume()
	if k.Drops() != 1 {
		t.Fatalf("the fake kubelet dropped %d watchers, want 1", k.Drops())
	}

	h.until(is(podsapi.Unsynced))
	ev := h.until(func(ev podsapi.Event) bool { return ev.Type == podsapi.Synced || ev.Type == podsapi.PodDeleted })
	if ev.Type != podsapi.PodDeleted || ev.Pod.UID != "uid-a" {
		// uid-a's DELETED was queued after the drop: only the relist can
		// report it.
		t.Fatalf("event %v %s, want uid-a deleted by the relist", ev.Type, ev.Pod.UID)
	}
	h.until(is(podsapi.Synced))
	if got := h.uidOf("ns", "c"); got != "uid-c" {
		t.Errorf("ns/c is %q after the relist, want uid-c", got)
	}
	if got, _ := h.src.Lookup("ns", "b"); got.Annotations["example.com/gpu"] != b.Annotations["example.com/gpu"] {
		t.Errorf("ns/b has %v after the relist, want the last update's %q", got.Annotations, b.Annotations["example.com/gpu"])
	}
}

// One tenant's oversize pod is refused alone, and its name answers nothing
// (not even an older pod of that name) until it is readable or gone.
func TestOversizePodIsRefusedAloneAndItsNameIsUnknown(t *testing.T) {
	small := pod("ns", "small", "uid-small", 0)
	old := pod("ns", "big", "uid-big-old", 1)
	k := newKubelet(t, small, old)
	h := start(t, k, podsapi.Options{MaxPodBytes: 16 << 10})
	h.expect("added uid-big-old", "added uid-small", "synced")

	big := pod("ns", "big", "uid-big", 2)
	big.Annotations["kubectl.kubernetes.io/last-applied"] = strings.Repeat("x", 64<<10)
	k.Add(big)
	ev := h.next()
	if ev.Type != podsapi.PodRefused || ev.Pod.UID != "uid-big" || ev.Pod.Name != "big" {
		t.Fatalf("event %v %+v, want uid-big refused and named", ev.Type, ev.Pod)
	}
	if !errors.Is(ev.Err, podsapi.ErrPodTooLarge) || !strings.Contains(ev.Err.Error(), "ns/big (uid uid-big)") {
		t.Errorf("refusal %v: want ErrPodTooLarge naming the pod", ev.Err)
	}
	if got := h.uidOf("ns", "big"); got != "" {
		t.Errorf("Lookup answers %q for the refused pod's name, want nothing", got)
	}
	if got := h.uidOf("ns", "small"); got != "uid-small" {
		t.Errorf("the other pod looks up as %q", got)
	}

	// The refused pod survives a relist as refused (it is listed), and
	// when it shrinks it is added.
	k.Stop()
	h.until(is(podsapi.Unsynced))
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	h.until(is(podsapi.Synced))
	if got := h.uidOf("ns", "big"); got != "" {
		t.Errorf("Lookup answers %q for the refused pod's name after a relist", got)
	}
	big = big.DeepCopy()
	delete(big.Annotations, "kubectl.kubernetes.io/last-applied")
	k.Update(big)
	h.expect("added uid-big")
	if got := h.uidOf("ns", "big"); got != "uid-big" {
		t.Errorf("Lookup answers %q once the pod is readable, want uid-big", got)
	}

	pods, err := h.src.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 3 {
		t.Errorf("Pods: %d pods, want 3, none refused", len(pods))
	}
}

// A tenant's 255 KiB hint, and an allocation too large to be one, cost
// their own pod's allocation only: both pods are known by name and UID
// with the annotation marked as refused (model.OversizedAnnotation, which
// the allocator refuses as malformed), in the watch and in ListPods, and
// every other pod is answered whole.
func TestAnOversizedAllocatorAnnotationIsMarkedAndEveryPodAnswered(t *testing.T) {
	hinted := pod("ns", "hinted", "uid-hinted", 1)
	hinted.Annotations["example.com/hint"] = `{"pad":"` + strings.Repeat("x", 255<<10) + `"}`
	huge := pod("ns", "huge", "uid-huge", 2)
	huge.Annotations["example.com/gpu"] = strings.Repeat("G", 100<<10)
	k := newKubelet(t, pod("ns", "a", "uid-a", 0), hinted, huge)
	h := start(t, k, podsapi.Options{})
	h.expect("added uid-a", "added uid-hinted", "added uid-huge", "synced")
	late := pod("ns", "late", "uid-late", 3)
	late.Annotations["example.com/hint"] = hinted.Annotations["example.com/hint"]
	k.Add(late)
	h.expect("added uid-late")
	k.Add(pod("ns", "b", "uid-b", 4))
	h.expect("added uid-b")

	// marked says which of p's annotations read as refused for their size.
	marked := func(p model.KubeletPod) []string {
		var keys []string
		for k, v := range p.Annotations {
			if _, ok := model.Oversized(v); ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		return keys
	}
	want := map[string]string{ // uid: the keys marked
		"uid-a": "", "uid-b": "",
		"uid-hinted": "example.com/hint", "uid-late": "example.com/hint",
		"uid-huge": "example.com/gpu",
	}
	check := func(from string, p model.KubeletPod) {
		t.Helper()
		if got := strings.Join(marked(p), " "); got != want[p.UID] {
			t.Errorf("%s: %s has %q marked as oversized, want %q", from, p.UID, got, want[p.UID])
		}
		if p.UID != "uid-huge" && p.Annotations["example.com/gpu"] != "GPU-"+p.UID {
			t.Errorf("%s: %s lost its allocation: %.80v", from, p.UID, p.Annotations)
		}
	}
	for _, name := range []string{"a", "b", "hinted", "huge", "late"} {
		p, ok := h.src.Lookup("ns", name)
		if !ok {
			t.Errorf("watch: ns/%s not answered", name)
			continue
		}
		check("watch", p)
	}

	pods, err := h.src.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != len(want) {
		t.Fatalf("ListPods: %d pods, want %d, none refused", len(pods), len(want))
	}
	for _, p := range pods {
		check("ListPods", p)
	}
}

func TestPodsReadsPodsOldestFirstAndLeavesOutARefusedPodsName(t *testing.T) {
	newer, older := pod("ns", "a", "uid-1", 5), pod("ns", "b", "uid-2", 1)
	big, predecessor := pod("ns", "c", "uid-3", 9), pod("ns", "c", "uid-0", 0)
	big.Annotations["example.com/gpu"] = strings.Repeat("x", 32<<10)
	k := newKubelet(t, newer, older, big, predecessor)
	log, logs := test.NewNullLogger()
	src, err := podsapi.New(podsapi.Options{Socket: k.Socket(), MaxPodBytes: 16 << 10, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	pods, err := src.Pods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var uids []string
	for _, p := range pods {
		uids = append(uids, p.UID)
	}
	if strings.Join(uids, " ") != "uid-2 uid-1" {
		t.Errorf("Pods gives %v, want uid-2 uid-1 (oldest first, ns/c left out)", uids)
	}
	// Each pod left out is told, with why.
	var told []string
	for _, e := range logs.AllEntries() {
		if e.Level != logrus.WarnLevel {
			continue
		}
		err, _ := e.Data[logrus.ErrorKey].(error)
		p, _ := e.Data["pod"].(model.PodRef)
		told = append(told, p.UID)
		if p.UID == "uid-3" && !errors.Is(err, podsapi.ErrPodTooLarge) {
			t.Errorf("uid-3 was left out for %v, want ErrPodTooLarge", err)
		}
	}
	if strings.Join(told, " ") != "uid-3 uid-0" {
		t.Errorf("pods told left out: %v, want uid-3 too large, then its predecessor uid-0", told)
	}
}

func TestPodsFailsUnavailableWithoutAKubelet(t *testing.T) {
	socket := socketPath(t)
	src, err := podsapi.New(podsapi.Options{Socket: socket, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	_, err = src.Pods(context.Background())
	if status.Code(err) != codes.Unavailable {
		t.Errorf("err %v, want Unavailable", err)
	}
	if !strings.Contains(err.Error(), socket) {
		t.Errorf("err %q does not name the socket", err)
	}
}

// The socket need not exist when the Source starts: it syncs once the
// kubelet serves.
func TestSourceStartsBeforeTheKubeletAndSyncsWhenItComes(t *testing.T) {
	k := podsapitest.New(socketPath(t))
	t.Cleanup(k.Stop)
	k.Add(pod("ns", "a", "uid-a", 0))
	h := start(t, k, podsapi.Options{})
	if h.src.Synced() {
		t.Fatal("Synced() before any kubelet")
	}
	if err := k.Start(); err != nil {
		t.Fatal(err)
	}
	h.expect("added uid-a", "synced")
}

// Cancelling Run's context stops it, and with it every goroutine of the
// package, whatever state the watch is in.
func TestCancelStopsEveryGoroutine(t *testing.T) {
	k := newKubelet(t, pod("ns", "a", "uid-a", 0))
	h := start(t, k, podsapi.Options{})
	h.expect("added uid-a", "synced")
	h.stop()

	// Run has returned (stop waited for it); nothing of the package may
	// remain.
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	if strings.Contains(stacks, "kubeletpods/podsapi.(*Source)") {
		t.Errorf("a Source goroutine outlived Run:\n%s", stacks)
	}

	// A second Run on a new context works too, and so does a Run that is
	// waiting to reconnect.
	k.Stop()
	src, err := podsapi.New(podsapi.Options{Socket: k.Socket()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- src.Run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run waiting to reconnect did not return after cancel")
	}
}

func TestNewRejectsWhatIsNotAUnixSocket(t *testing.T) {
	for _, s := range []string{"tcp://127.0.0.1:1", "unix://", "http://x/pods"} {
		if _, err := podsapi.New(podsapi.Options{Socket: s}); err == nil {
			t.Errorf("New accepted socket %q", s)
		}
	}
}

// A known pod whose next version cannot be read stops answering its name
// (its old version may be the one that changed), and DELETED still
// removes it; every kubelet event is counted for metrics.
func TestKnownPodThatBecomesUnreadableIsRefusedUntilDeleted(t *testing.T) {
	p := pod("ns", "a", "uid-a", 0)
	k := newKubelet(t, p)
	h := start(t, k, podsapi.Options{MaxPodBytes: 16 << 10})
	h.expect("added uid-a", "synced")

	big := p.DeepCopy()
	big.Annotations["example.com/gpu"] = strings.Repeat("g", 32<<10)
	k.Update(big)
	ev := h.next()
	if ev.Type != podsapi.PodRefused || ev.Pod.UID != "uid-a" || !errors.Is(ev.Err, podsapi.ErrPodTooLarge) {
		t.Fatalf("event %v %s %v, want uid-a refused for its size", ev.Type, ev.Pod.UID, ev.Err)
	}
	if got := h.uidOf("ns", "a"); got != "" {
		t.Errorf("Lookup still answers %q with the pod's old version", got)
	}

	// Bytes that are not a pod but name one (metadata with name b,
	// namespace ns and uid uid-b, then a spec cut short): refused, named.
	garbage := []byte{0x0a, 0x0e, 0x0a, 0x01, 'b', 0x1a, 0x02, 'n', 's', 0x2a, 0x05, 'u', 'i', 'd', '-', 'b', 0x12, 0x02, 0xff, 0xff}
	k.SetRaw("uid-b", garbage, podsv1alpha1.EventType_ADDED)
	ev = h.next()
	if ev.Type != podsapi.PodRefused || ev.Pod.UID != "uid-b" || ev.Pod.Namespace != "ns" || ev.Pod.Name != "b" {
		t.Fatalf("event %v %+v (%v), want uid-b refused and named", ev.Type, ev.Pod, ev.Err)
	}

	k.Delete(big)
	h.expect("deleted uid-a")
	h.mu.Lock()
	defer h.mu.Unlock()
	want := map[string]int{"ADDED": 2, "INITIAL_SYNC_COMPLETE": 1, "MODIFIED": 1, "DELETED": 1}
	for typ, n := range want {
		if h.eventTypes[typ] != n {
			t.Errorf("Metrics counted %v, want %v", h.eventTypes, want)
			break
		}
	}
}

// Pods is a kubeletpods.Fetch: reads of the Pods API can be shared as
// /pods reads are.
func TestPodsServesAKubeletpodsReader(t *testing.T) {
	k := newKubelet(t, pod("ns", "a", "uid-a", 0), pod("ns", "a", "uid-a2", 3))
	src, err := podsapi.New(podsapi.Options{Socket: k.Socket()})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	r := kubeletpods.NewReader(src.Pods, kubeletpods.ReaderOptions{})
	list, err := r.ReadAfter(context.Background(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := list.Lookup(model.PodKey{Namespace: "ns", Name: "a"}); !ok || p.UID != "uid-a2" {
		t.Errorf("the reader's list gives %+v for ns/a, want the newer uid-a2", p)
	}
}
