// Package report tells a pod's owner, and the node's operator, what the
// daemon decided, as Kubernetes Events (events.k8s.io/v1, through client-go's
// tools/events, which folds repeats into a series): a refused allocation, an
// annotation no allocator could decode, ... on the pod; the daemon's own
// trouble on the Node.
//
// Emitting never waits on the API server: Pod and Node put the Event in a
// bounded queue and return, and an Event the queue has no room for is
// dropped and counted (Metrics.EventDropped). One goroutine (Run) hands the
// queue to client-go, and only while the API server keeps up: while a few
// writes are in flight, or the API server does not answer (or answers that
// it is overloaded), Events stay queued (and the newest are dropped)
// instead of piling up as client-go's retrying goroutines. Every request
// has a time limit (Options.Timeout).
//
// Each Event is a Warning from the reporting controller podres-proxy, with
// the node's name as its reporting instance, regarding the pod (its UID
// included) or the Node; its action and note are cut to the API server's
// bounds, control characters replaced.
//
// Callers report decisions when they change, not per query: an Event is an
// API object, and a busy node must not write one per List.
package report

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"

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

// maxInFlight is how many Event writes may be in flight at once before Run
// stops handing Events to client-go; probeEvery is how often, while writes
// fail, Run hands one over anyway, to learn that the API server is back.
const (
	maxInFlight = 4
	probeEvery  = 30 * time.Second
)

// Metrics is what the reporter counts (metrics.Metrics implements it).
type Metrics interface {
	// EventEmitted counts an Event handed to client-go, by reason.
	EventEmitted(reason string)
	// EventDropped counts an Event dropped because the queue was full, by
	// reason.
	EventDropped(reason string)
	// EventWriteFailed counts a write of an Event the API server refused
	// or did not answer in time (client-go retries it).
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
	// Log gets client-go's complaints about Events it could not write; nil:
	// logrus's standard logger.
	Log logrus.FieldLogger
}

// Reporter emits Events. A nil *Reporter emits nothing, so that parts
// built without an API server need no check.
type Reporter struct {
	node    string
	queue   chan item
	metrics Metrics
	sink    *sink
	log     logr.Logger

	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
}

// item is one queued Event.
type item struct {
	regarding *corev1.ObjectReference
	reason    string
	action    string
	note      string
}

// New returns a reporter that writes through o.Config once Run runs.
func New(o Options) (*Reporter, error) {
	if o.Config == nil {
		return nil, fmt.Errorf("report: no API server configuration")
	}
	if o.Node == "" {
		return nil, fmt.Errorf("report: no node name (the Events' reporting instance)")
	}
	cfg := rest.CopyConfig(o.Config)
	cfg.Timeout = o.Timeout
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	client, err := kubernetes.NewForConfig(cfg)
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
	s := &sink{inner: &events.EventSinkImpl{Interface: client.EventsV1()}, node: o.Node, metrics: o.Metrics,
		expiry: 2 * cfg.Timeout, freed: make(chan struct{}, 1)}
	b := events.NewBroadcaster(s)
	return &Reporter{
		node:        o.Node,
		queue:       make(chan item, o.Queue),
		metrics:     o.Metrics,
		sink:        s,
		log:         logr.New(&logSink{log: o.Log}),
		broadcaster: b,
		recorder:    b.NewRecorder(scheme.Scheme, Controller),
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
		regarding: &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)},
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
		regarding: &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: r.node, UID: types.UID(r.node)},
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

// Run hands the queued Events to client-go until ctx is done, while the
// API server keeps up (see the package comment). Events still queued then
// are lost.
func (r *Reporter) Run(ctx context.Context) error {
	// client-go logs the writes it gives up or retries with ctx's logger.
	if err := r.broadcaster.StartRecordingToSinkWithContext(klog.NewContext(ctx, r.log)); err != nil {
		return fmt.Errorf("report: start recording Events: %w", err)
	}
	defer r.broadcaster.Shutdown()
	for {
		var it item
		select {
		case <-ctx.Done():
			return nil
		case it = <-r.queue:
		}
		for !r.sink.admit(time.Now()) {
			wait := time.NewTimer(probeEvery)
			select {
			case <-ctx.Done():
				wait.Stop()
				return nil
			case <-r.sink.freed:
			case <-wait.C:
			}
			wait.Stop()
		}
		r.recorder.Eventf(it.regarding, nil, corev1.EventTypeWarning, it.reason, it.action, "%s", it.note)
		r.metrics.EventEmitted(it.reason)
	}
}

// sink is client-go's sink with the node as every Event's reporting
// instance (client-go names it after the host name, which is the daemon's
// pod's name), and the gate Run hands Events over by: at most maxInFlight
// handed over whose write has not ended (a hand-off whose write never
// ended, an Event client-go folded into a series, counts until twice the
// request timeout passed), and while writes fail, one every probeEvery.
type sink struct {
	inner   events.EventSink
	node    string
	metrics Metrics
	expiry  time.Duration
	freed   chan struct{} // a write ended

	mu        sync.Mutex
	handed    []time.Time // hand-offs whose write has not ended, oldest first
	failing   bool        // the last write failed
	lastProbe time.Time
}

// admit reports whether an Event may be handed over now, and counts it if
// so.
func (s *sink) admit(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.handed) > 0 && now.Sub(s.handed[0]) >= s.expiry {
		s.handed = s.handed[1:]
	}
	if len(s.handed) >= maxInFlight {
		return false
	}
	if s.failing {
		if now.Sub(s.lastProbe) < probeEvery {
			return false
		}
		s.lastProbe = now
	}
	s.handed = append(s.handed, now)
	return true
}

// ended records the end of a write.
func (s *sink) ended(err error) {
	s.mu.Lock()
	if len(s.handed) > 0 {
		s.handed = s.handed[1:]
	}
	s.failing = unavailable(err)
	s.mu.Unlock()
	if err != nil {
		s.metrics.EventWriteFailed()
	}
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// Create creates the Event, with this node as its reporting instance.
func (s *sink) Create(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	ev.ReportingInstance = s.node
	out, err := s.inner.Create(ctx, ev)
	s.ended(err)
	return out, err
}

// Update is client-go's; the events.k8s.io recorder does not call it.
func (s *sink) Update(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	ev.ReportingInstance = s.node
	out, err := s.inner.Update(ctx, ev)
	s.ended(err)
	return out, err
}

// Patch patches a series' count and last time.
func (s *sink) Patch(ctx context.Context, ev *eventsv1.Event, data []byte) (*eventsv1.Event, error) {
	out, err := s.inner.Patch(ctx, ev, data)
	s.ended(err)
	return out, err
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
