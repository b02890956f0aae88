// Package report tells a pod's owner, and the node's operator, what the
// daemon decided, as Kubernetes Events (events.k8s.io/v1): a refused
// allocation, an annotation no allocator could decode, ... on the pod; the
// daemon's own trouble on the Node.
//
// Emitting never waits on the API server: Pod and Node put the Event in a
// bounded queue and return, and an Event the queue has no room for is
// dropped and counted (Metrics.EventDropped). One goroutine (Run) writes the
// queue, at most maxInFlight writes at once, each within Options.Timeout;
// while the API server does not answer (or answers that it is overloaded)
// it writes one Event every probeEvery and the rest stay queued (the newest
// dropped). An Event whose write found the API server so is queued again,
// up to maxTries writes; one the API server refused is logged and dropped.
//
// Each Event is a Warning from the reporting controller podres-proxy, with
// the node's name as its reporting instance, regarding the pod (its UID
// included) or the Node; its action and note are cut to the API server's
// bounds, control characters replaced. An Event like one written less than
// seriesWindow before (the same object, reason and action) updates that
// one's series (count, last observed time) instead of adding an object, as
// client-go's tools/events does; tools/events itself is not used, as it
// links client-go's scheme of every API group (docs/performance.md).
//
// Callers report decisions when they change, not per query: an Event is an
// API object, and a busy node must not write one per List.
package report

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/model"
)

// Controller is the reporting controller of every Event.
const Controller = "podres-proxy"

// The reasons of the Events, one per kind of decision (docs/troubleshooting.md).
const (
	// ReasonAllocationRefused: a decoded device the trust rules refused
	// (model.Refused); the pod is answered without it.
	ReasonAllocationRefused = "AllocationRefused"
	// ReasonAnnotationUndecodable: an allocator annotation no allocator
	// could decode; the pod is answered without its devices.
	ReasonAnnotationUndecodable = "AnnotationUndecodable"
	// ReasonDRADeviceNotFolded: a DRA device the legacy view left under
	// dynamic_resources.
	ReasonDRADeviceNotFolded = "DRADeviceNotFolded"
	// ReasonAnsweredUnavailable: a query about the pod, being created, was
	// answered Unavailable.
	ReasonAnsweredUnavailable = "AnsweredUnavailable"

	// On the Node: the daemon's own trouble.
	ReasonNRIDisconnected       = "NRIDisconnected"
	ReasonKubeletPodsUnreadable = "KubeletPodsUnreadable"
	ReasonStateWritesFailing    = "StateWritesFailing"
)

// Bounds of what one Event carries: the API server refuses a note over
// 1 KiB and an action over 128 bytes.
const (
	maxNote   = 1000
	maxAction = 128
	// MaxExcerpt bounds an excerpt of a tenant's input (why an annotation
	// could not be decoded) in a note.
	MaxExcerpt = 256
)

// Defaults of Options.
const (
	DefaultQueue   = 256
	DefaultTimeout = 10 * time.Second
)

// maxInFlight is how many Event writes may be in flight at once;
// probeEvery is how often, while writes fail, Run writes one anyway, to
// learn that the API server is back.
const (
	maxInFlight = 4
	probeEvery  = 30 * time.Second
	// maxTries bounds the writes of one Event the API server did not
	// answer (or answered that it is overloaded).
	maxTries = 5
)

// seriesWindow is how long after an Event a like one updates its series
// (client-go's tools/events: 6 minutes); maxSeries bounds the Events
// remembered for it.
const (
	seriesWindow = 6 * time.Minute
	maxSeries    = 1024
)

// maxAnswer bounds the API server's answer to one write: an Event, a
// Status.
const maxAnswer = 64 << 10

// eventsResource is where Events are written.
var eventsResource = eventsv1.SchemeGroupVersion.WithResource("events")

// Metrics is what the reporter counts (metrics.Metrics implements it).
type Metrics interface {
	// EventEmitted counts an Event handed to its first write, by reason.
	EventEmitted(reason string)
	// EventDropped counts an Event dropped because the queue was full, by
	// reason.
	EventDropped(reason string)
	// EventWriteFailed counts a write of an Event the API server refused
	// or did not answer in time.
	EventWriteFailed()
}

// Options configure a Reporter.
type Options struct {
	// Config is the API server's client configuration (apiclient.Config);
	// it is copied, with Timeout set.
	Config *rest.Config
	// Node is this node's name: the Events' reporting instance, and the
	// Node the daemon's own trouble is reported on.
	Node string
	// Queue is how many Events may wait for the API server; 0 means
	// DefaultQueue.
	Queue int
	// Timeout bounds each request to the API server; 0 means
	// DefaultTimeout.
	Timeout time.Duration
	// Metrics counts; nil counts nothing.
	Metrics Metrics
	// Log gets the writes that failed; nil: logrus's standard logger.
	Log logrus.FieldLogger
}

// Reporter emits Events. A nil *Reporter emits nothing, so that parts
// built without an API server need no check.
type Reporter struct {
	node    string
	queue   chan item
	metrics Metrics
	log     logrus.FieldLogger
	events  dynamic.NamespaceableResourceInterface
	timeout time.Duration

	slots chan struct{} // one per write in flight
	ended chan struct{} // a write ended

	mu        sync.Mutex
	failing   bool // the last write found the API server unavailable
	lastProbe time.Time
	series    map[seriesKey]*written
}

// item is one queued Event.
type item struct {
	regarding corev1.ObjectReference
	reason    string
	action    string
	note      string
	tries     int // writes that found the API server unavailable
}

// seriesKey is what makes Events alike: the object, the reason, the action
// (the type, controller and instance are the same for all).
type seriesKey struct {
	kind, namespace, name string
	uid                   types.UID
	reason, action        string
}

// written is an Event written, for the like ones after it: its series'
// count and last time.
type written struct {
	ev    *eventsv1.Event
	count int32
	last  time.Time
}

// New returns a reporter that writes through o.Config once Run runs.
func New(o Options) (*Reporter, error) {
	if o.Config == nil {
		return nil, fmt.Errorf("report: no API server configuration")
	}
	if o.Node == "" {
		return nil, fmt.Errorf("report: no node name (the Events' reporting instance)")
	}
	cfg := apiclient.Bounded(o.Config, maxAnswer, maxAnswer)
	cfg.Timeout = o.Timeout
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("report: events client: %w", err)
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.Metrics == nil {
		o.Metrics = noMetrics{}
	}
	if o.Log == nil {
		o.Log = logrus.StandardLogger()
	}
	return &Reporter{
		node:    o.Node,
		queue:   make(chan item, o.Queue),
		metrics: o.Metrics,
		log:     o.Log,
		events:  client.Resource(eventsResource),
		timeout: cfg.Timeout,
		slots:   make(chan struct{}, maxInFlight),
		ended:   make(chan struct{}, 1),
		series:  map[seriesKey]*written{},
	}, nil
}

// Pod reports a decision about a pod: a Warning Event regarding the pod
// (its UID included). action says what was decided about what (at most
// 128 bytes are kept): Events of one pod, reason and action are one series.
// It never blocks.
func (r *Reporter) Pod(pod model.PodRef, reason, action, note string) {
	if r == nil || pod.UID == "" {
		return
	}
	r.enqueue(item{
		regarding: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)},
		reason:    reason, action: action, note: note,
	})
}

// Node reports the daemon's own trouble: a Warning Event regarding this
// node. It never blocks.
func (r *Reporter) Node(reason, action, note string) {
	if r == nil {
		return
	}
	r.enqueue(item{
		// The kubelet's Events name a Node by its name as its UID too.
		regarding: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: r.node, UID: types.UID(r.node)},
		reason:    reason, action: action, note: note,
	})
}

func (r *Reporter) enqueue(it item) {
	it.action = Truncate(printable(it.action), maxAction)
	it.note = Truncate(printable(it.note), maxNote)
	select {
	case r.queue <- it:
	default:
		r.metrics.EventDropped(it.reason)
	}
}

// Run writes the queued Events until ctx is done, while the API server
// keeps up (see the package comment), and returns once the writes in
// flight have ended. Events still queued then are lost.
func (r *Reporter) Run(ctx context.Context) error {
	var writes sync.WaitGroup
	defer writes.Wait()
	for {
		var it item
		select {
		case <-ctx.Done():
			return nil
		case it = <-r.queue:
		}
		if !r.admit(ctx) {
			return nil
		}
		if it.tries == 0 {
			r.metrics.EventEmitted(it.reason)
		}
		writes.Go(func() {
			err := r.write(ctx, it, time.Now())
			r.done(err)
			if err == nil || ctx.Err() != nil {
				return
			}
			log := r.log.WithError(err).WithFields(logrus.Fields{"reason": it.reason, "object": it.regarding.Kind + " " + it.regarding.Namespace + "/" + it.regarding.Name})
			if it.tries++; unavailable(err) && it.tries < maxTries {
				log.Debug("Events: the API server did not answer; the Event is queued again")
				r.enqueue(it)
				return
			}
			log.Warn("Events: the API server did not take an Event")
		})
	}
}

// admit waits until a write may start: a slot among maxInFlight, and while
// writes fail, probeEvery since the last probe. It is false when ctx ended
// first.
func (r *Reporter) admit(ctx context.Context) bool {
	for {
		wait := probeEvery
		r.mu.Lock()
		now := time.Now()
		if !r.failing || now.Sub(r.lastProbe) >= probeEvery {
			select {
			case r.slots <- struct{}{}:
				if r.failing {
					r.lastProbe = now
				}
				r.mu.Unlock()
				return true
			default:
			}
		} else {
			wait = probeEvery - now.Sub(r.lastProbe)
		}
		r.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-r.ended:
		case <-t.C:
		}
		t.Stop()
	}
}

// done records the end of a write.
func (r *Reporter) done(err error) {
	r.mu.Lock()
	r.failing = unavailable(err)
	<-r.slots
	r.mu.Unlock()
	if err != nil {
		r.metrics.EventWriteFailed()
	}
	select {
	case r.ended <- struct{}{}:
	default:
	}
}

// write writes it: a new Event, or the series update of a like one written
// within seriesWindow (a new Event if that one is gone).
func (r *Reporter) write(ctx context.Context, it item, now time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	key := seriesKey{it.regarding.Kind, it.regarding.Namespace, it.regarding.Name, it.regarding.UID, it.reason, it.action}
	w, like := r.claim(key, r.event(it, now))
	if like {
		patch, err := json.Marshal(map[string]any{"series": eventsv1.EventSeries{Count: w.count, LastObservedTime: metav1.NewMicroTime(now)}})
		if err != nil {
			return fmt.Errorf("series of Event %s/%s: %w", w.ev.Namespace, w.ev.Name, err)
		}
		_, err = r.events.Namespace(w.ev.Namespace).Patch(ctx, w.ev.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if !apierrors.IsNotFound(err) {
			if err != nil {
				return fmt.Errorf("series of Event %s/%s: %w", w.ev.Namespace, w.ev.Name, err)
			}
			return nil
		}
		// Gone (expired, or its create failed): a new one.
		fresh := &written{ev: r.event(it, now), count: 1, last: now}
		r.remember(key, fresh)
		w = *fresh
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(w.ev)
	if err == nil {
		_, err = r.events.Namespace(w.ev.Namespace).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	}
	if err != nil {
		r.forget(key, w.ev)
		return fmt.Errorf("writing Event %s/%s: %w", w.ev.Namespace, w.ev.Name, err)
	}
	return nil
}

// event is the Event of it, named as client-go names one: the object's
// name and the time in hexadecimal nanoseconds. A Node's is in the default
// namespace.
func (r *Reporter) event(it item, now time.Time) *eventsv1.Event {
	ns := it.regarding.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return &eventsv1.Event{
		TypeMeta:            metav1.TypeMeta{APIVersion: eventsv1.SchemeGroupVersion.String(), Kind: "Event"},
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", it.regarding.Name, now.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: Controller,
		ReportingInstance:   r.node,
		Action:              it.action,
		Reason:              it.reason,
		Regarding:           it.regarding,
		Note:                it.note,
		Type:                corev1.EventTypeWarning,
	}
}

// claim returns the Event written for key within seriesWindow, its count
// and time advanced for the update, and true; or else ev, remembered for
// the like ones after it, and false.
func (r *Reporter) claim(key seriesKey, ev *eventsv1.Event) (written, bool) {
	now := ev.EventTime.Time
	r.mu.Lock()
	if w, ok := r.series[key]; ok && now.Sub(w.last) < seriesWindow {
		w.count++
		w.last = now
		c := *w
		r.mu.Unlock()
		return c, true
	}
	r.mu.Unlock()
	w := &written{ev: ev, count: 1, last: now}
	r.remember(key, w)
	return *w, false
}

// forget drops key's Event if it is ev, which was not written.
func (r *Reporter) forget(key seriesKey, ev *eventsv1.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.series[key]; ok && w.ev == ev {
		delete(r.series, key)
	}
}

// remember keeps w for the like Events after it, within maxSeries: the
// expired go first, then any.
func (r *Reporter) remember(key seriesKey, w *written) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.series) >= maxSeries {
		for k, old := range r.series {
			if w.last.Sub(old.last) >= seriesWindow {
				delete(r.series, k)
			}
		}
		for k := range r.series {
			if len(r.series) < maxSeries {
				break
			}
			delete(r.series, k)
		}
	}
	r.series[key] = w
}

// unavailable reports whether err says the API server is not there for
// Events: no answer, or an answer that it is overloaded or broken. A
// refusal of one Event (its namespace being deleted, a 403) is the Event's
// trouble, not the others'.
func unavailable(err error) bool {
	if err == nil {
		return false
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true
	}
	code := st.Status().Code
	return code == 0 || code >= 500 || code == http.StatusTooManyRequests
}

// Truncate returns s cut to at most n bytes, at a rune boundary, with "…"
// at the end when it was cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// printable returns s with each control character (a tenant's annotation
// may hold terminal escapes, which kubectl describe would print) and each
// invalid byte replaced by '?'.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}

type noMetrics struct{}

func (noMetrics) EventEmitted(string) {}
func (noMetrics) EventDropped(string) {}
func (noMetrics) EventWriteFailed()   {}
