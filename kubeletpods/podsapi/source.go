package podsapi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
)

// DefaultSocket is where a kubelet with the default root directory serves
// the Pods API (<root>/pods-api/pods-api.sock).
const DefaultSocket = "/var/lib/kubelet/pods-api/pods-api.sock"

// More defaults for Options.
const (
	// DefaultMaxMessageBytes bounds one gRPC message from the kubelet:
	// a ListPods answer (every pod of the node) or one watch event. It is
	// far above DefaultMaxPodBytes so that an oversize pod still arrives
	// and is refused alone; were the message refused by gRPC, the stream
	// would fail at that pod at every reconnection and the source would
	// never sync.
	DefaultMaxMessageBytes = 64 << 20
	// DefaultTimeout bounds a ListPods call.
	DefaultTimeout = 5 * time.Second
)

// DefaultBackoff is the wait between watch attempts that fail to sync:
// from half a second (a kubelet restart takes seconds) doubling to 30 s,
// with jitter so that the daemons of many nodes do not retry in step. It
// starts again from the beginning after each successful sync. A watch
// that had synced is followed by the next at once, and attempts refused
// while the kubelet initializes wait no more than 2 s (see pace).
var DefaultBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Cap: 30 * time.Second}

// EventType says what happened to a pod, or to the view.
type EventType int

const (
	// PodAdded: a pod the view did not have (or had refused) is now known.
	PodAdded EventType = iota + 1
	// PodModified: what is kept of a known pod changed.
	PodModified
	// PodDeleted: the kubelet no longer has the pod: it said so, or a
	// relist did not include it. Event.Pod is the last version known.
	PodDeleted
	// PodRefused: the pod's event could not be read (too large, not
	// decodable, no identity). Event.Pod holds what identity could be
	// read and Event.Err says why. Until the pod is read again or deleted,
	// Lookup answers nothing for its name.
	PodRefused
	// Synced: a relist is complete. The view holds every pod the kubelet
	// has; pods missing from the relist have been reported PodDeleted.
	Synced
	// Unsynced: the watch stream ended after a sync; the view is kept but
	// misses whatever happens until the next Synced.
	Unsynced
)

func (t EventType) String() string {
	switch t {
	case PodAdded:
		return "added"
	case PodModified:
		return "modified"
	case PodDeleted:
		return "deleted"
	case PodRefused:
		return "refused"
	case Synced:
		return "synced"
	case Unsynced:
		return "unsynced"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is what Source tells its handler.
type Event struct {
	Type EventType
	// Pod is the pod the event is about; zero for Synced and Unsynced. It
	// is shared with the view and must not be modified.
	Pod model.KubeletPod
	// Err is why a pod was refused (PodRefused only). errors.Is(Err,
	// ErrPodTooLarge) tells a pod refused for its size.
	Err error
	// ByRelist marks a PodDeleted that no DELETED event announced: the
	// pod was missing from a relist. A kubelet that has just restarted
	// relists before its pod sources have given it every pod, and adds
	// the missing ones back moments later, so such a deletion says "not
	// known now" rather than "gone for good".
	ByRelist bool
}

// Options configure a Source. The zero value watches DefaultSocket and
// keeps every annotation.
type Options struct {
	// Socket is the kubelet's Pods API socket, as a path or a unix:// URL;
	// empty means DefaultSocket. It need not exist yet.
	Socket string
	// MaxAnnotationBytes says which pod annotations to keep (the
	// allocators' own) and how large each may be, exactly as
	// kubeletpods.Config.MaxAnnotationBytes does for /pods
	// (allocator.Set.MaxAnnotationBytes): the bound of the key's value,
	// 0 for a key not kept; a value over its bound, or over what is left
	// of the pod's annotationbound.MaxPodBytes, is kept as
	// model.OversizedAnnotation, which its allocator refuses as
	// malformed, and the pod is otherwise kept. nil keeps every
	// annotation whole.
	MaxAnnotationBytes func(key string) int
	// MaxPodBytes bounds the protobuf encoding of one pod; 0 means
	// DefaultMaxPodBytes. A larger pod is refused without being decoded.
	MaxPodBytes int
	// MaxMessageBytes bounds one gRPC message (a ListPods answer, a watch
	// event); 0 means DefaultMaxMessageBytes.
	MaxMessageBytes int
	// Timeout bounds a ListPods call; 0 means DefaultTimeout.
	Timeout time.Duration
	// Backoff paces watch attempts that fail to sync: Duration, growing
	// by Factor up to Cap (0: DefaultBackoff.Cap), with Jitter; Steps is
	// ignored. While the kubelet says it is initializing, the growth
	// stops at 4 times Duration. A zero Duration means DefaultBackoff.
	Backoff wait.Backoff

	// Handler, when set, is told every event, in order, from the watch
	// goroutine, after the view reflects it (so Lookup in the handler
	// sees the change). It must not block for long: the kubelet drops a
	// watcher that falls 100 events behind, which costs a relist.
	Handler func(Event)
	// Metrics receives what the source measures; nil: nothing.
	Metrics Metrics
	// Log receives the source's logs; nil means logrus's standard logger.
	Log logrus.FieldLogger
}

// Source watches the kubelet's Pods API and keeps a view of its pods. Run
// does the watching; Lookup, Synced and List may be called from any
// goroutine, before, during or after Run.
type Source struct {
	socket  string // for errors and logs
	dec     decoder
	maxMsg  int
	timeout time.Duration
	backoff wait.Backoff
	handler func(Event)
	metrics Metrics
	log     logrus.FieldLogger

	conn    *grpc.ClientConn
	client  podsv1alpha1.PodsClient
	running atomic.Bool

	mu     sync.RWMutex
	synced bool
	view   view
	// changed is closed, and replaced, whenever the view changes: Await
	// waits on it.
	changed chan struct{}
}

// New checks opts and returns a Source. It does no I/O: the socket is
// dialled by Run and List, and may appear later.
func New(opts Options) (*Source, error) {
	target, socket, err := target(cmp.Or(opts.Socket, DefaultSocket))
	if err != nil {
		return nil, err
	}
	if opts.MaxPodBytes < 0 || opts.MaxMessageBytes < 0 || opts.Timeout < 0 {
		return nil, fmt.Errorf("kubelet Pods API source: negative limit or timeout (pod %d, message %d bytes; timeout %v)",
			opts.MaxPodBytes, opts.MaxMessageBytes, opts.Timeout)
	}
	bo := opts.Backoff
	if bo.Duration <= 0 {
		bo = DefaultBackoff
	}
	// The delay grows until it reaches Cap (where Step sets Steps to 0
	// and keeps it), however many attempts that takes.
	bo.Cap = cmp.Or(bo.Cap, DefaultBackoff.Cap)
	bo.Steps = math.MaxInt32
	s := &Source{
		socket: socket,
		dec: decoder{
			maxPod:      cmp.Or(opts.MaxPodBytes, DefaultMaxPodBytes),
			annotations: annotationbound.Allocators(opts.MaxAnnotationBytes),
		},
		maxMsg:  cmp.Or(opts.MaxMessageBytes, DefaultMaxMessageBytes),
		timeout: cmp.Or(opts.Timeout, DefaultTimeout),
		backoff: bo,
		handler: opts.Handler,
		metrics: opts.Metrics,
		log:     opts.Log,
		view:    newView(),
		changed: make(chan struct{}),
	}
	if s.metrics == nil {
		s.metrics = noMetrics{}
	}
	if s.log == nil {
		s.log = logrus.StandardLogger()
	}
	s.log = s.log.WithField("podsAPI", socket)
	// gRPC's own reconnection backoff (1 s growing to 120 s by default)
	// would keep a restarted kubelet unseen long after Run's next attempt;
	// it follows Run's pace instead.
	s.conn, err = grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: bo.Duration, Multiplier: 1.6, Jitter: 0.2, MaxDelay: bo.Cap},
			MinConnectTimeout: cmp.Or(opts.Timeout, DefaultTimeout),
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(s.maxMsg)),
	)
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API client for %s: %w", socket, err)
	}
	s.client = podsv1alpha1.NewPodsClient(s.conn)
	return s, nil
}

// target turns a socket path or unix:// URL into a gRPC target, and the
// path to name in messages.
func target(socket string) (grpcTarget, path string, err error) {
	path = socket
	if rest, ok := strings.CutPrefix(socket, "unix://"); ok {
		path = rest
	} else if strings.Contains(socket, "://") {
		return "", "", fmt.Errorf("kubelet Pods API socket %q: not a path or unix:// URL", socket)
	}
	if path == "" {
		return "", "", fmt.Errorf("kubelet Pods API socket %q: no path", socket)
	}
	if !filepath.IsAbs(path) {
		// unix:// URLs take absolute paths; gRPC's unix:relative form
		// takes the rest.
		return "unix:" + path, path, nil
	}
	return "unix://" + path, path, nil
}

// Close releases the connection to the kubelet. Call it after Run has
// returned; List fails after it.
func (s *Source) Close() error {
	if err := s.conn.Close(); err != nil {
		return fmt.Errorf("close kubelet Pods API connection to %s: %w", s.socket, err)
	}
	return nil
}

// Lookup returns the pod PodResources means by namespace and name: of the
// pods of that name the kubelet has, a live one rather than a finished
// one, and the newer among equals. It answers nothing while any pod of the
// name is refused (it may be the newer). The answer is only as fresh as
// the watch: see Synced. The pod is shared and must not be modified.
func (s *Source) Lookup(namespace, name string) (model.KubeletPod, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.view.lookup(model.PodKey{Namespace: namespace, Name: name})
	if !ok {
		return model.KubeletPod{}, false
	}
	return e.d.pod, true
}

// Await returns the pod with pod's UID, namespace and name as soon as the
// watch has shown it, waiting up to ctx's end. It is for a query about a
// pod whose sandbox the runtime already reported (NRI, CRI): the kubelet
// sends a pod's ADDED before it creates the sandbox, but the event may
// still be on its way, and a Lookup in that moment would miss the pod, or
// find the predecessor of its name. It fails at once if the pod was
// refused, and with ctx's cause if the watch has not shown it by then
// (the caller can then read List or /pods).
func (s *Source) Await(ctx context.Context, pod model.PodRef) (model.KubeletPod, error) {
	k := model.PodKey{Namespace: pod.Namespace, Name: pod.Name}
	for {
		s.mu.RLock()
		e := s.view.byUID[pod.UID]
		changed := s.changed
		s.mu.RUnlock()
		if e != nil && key(&e.d.pod) == k {
			if e.refused != nil {
				return model.KubeletPod{}, e.refused
			}
			return e.d.pod, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return model.KubeletPod{}, fmt.Errorf("kubelet Pods API watch has not shown pod %s: %w", pod, context.Cause(ctx))
		}
	}
}

// Synced reports whether the watch is connected and its last relist
// complete: then the view holds every pod the kubelet has, up to the
// events still in flight. While it is false (before the first sync, while
// reconnecting) Lookup may miss new pods and still answer deleted ones,
// and a caller that needs freshness should read List (or /pods) instead.
func (s *Source) Synced() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.synced
}

// Pods reads the kubelet's pods once with ListPods, as List does, and
// returns ListResult.Pods: a kubeletpods.Fetch, to share reads through a
// kubeletpods.Reader. A refused pod's name is left out (so it is unknown
// to the caller, never answered with another pod of that name), and the
// refusals are logged.
func (s *Source) Pods(ctx context.Context) ([]model.KubeletPod, error) {
	res, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range res.Refused {
		s.log.WithError(r.Err).WithField("pod", r.Pod).Warn("Kubelet Pods API: pod left out of a ListPods read")
	}
	return res.Pods, nil
}

// ListResult is one ListPods read.
type ListResult struct {
	// Pods are the kubelet's pods, oldest first (by creation; the
	// kubelet's order, by UID, among pods created in the same second), as
	// kubeletpods.NewPodList wants them. A pod whose name is shared with a
	// refused pod is left out, so that a lookup by that name finds
	// nothing rather than the refused pod's predecessor.
	Pods []model.KubeletPod
	// Refused are the pods that could not be read, each with why, and
	// the pods left out for sharing their name.
	Refused []Refusal
}

// Refusal is a pod a read left out, and why.
type Refusal struct {
	Pod model.PodRef
	Err error
}

// List reads the kubelet's pods once with ListPods, for a query about a
// pod the watch has not shown yet. It is bounded by ctx and
// Options.Timeout. The kubelet rate-limits ListPods (100 per second, burst
// 10, shared by every client) and answers ResourceExhausted beyond that,
// so callers should share reads (kubeletpods.Reader does).
func (s *Source) List(ctx context.Context) (ListResult, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout,
		fmt.Errorf("no answer within %v: %w", s.timeout, context.DeadlineExceeded))
	defer cancel()
	resp, err := s.client.ListPods(ctx, &podsv1alpha1.ListPodsRequest{})
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
		}
		return ListResult{}, fmt.Errorf("list pods from the kubelet Pods API at %s: %w", s.socket, err)
	}
	var res ListResult
	all := make([]decoded, 0, len(resp.GetPods()))
	refusedNames := make(map[model.PodKey]bool)
	for _, data := range resp.GetPods() {
		d, err := s.dec.decode(data)
		if err != nil {
			res.Refused = append(res.Refused, Refusal{Pod: podRef(&d.pod), Err: err})
			refusedNames[key(&d.pod)] = true
			continue
		}
		all = append(all, d)
	}
	slices.SortStableFunc(all, func(a, b decoded) int { return a.created.Compare(b.created) })
	res.Pods = make([]model.KubeletPod, 0, len(all))
	for i := range all {
		p := &all[i].pod
		if refusedNames[key(p)] {
			res.Refused = append(res.Refused, Refusal{Pod: podRef(p), Err: errors.New("another pod of its name was refused")})
			continue
		}
		res.Pods = append(res.Pods, *p)
	}
	return res, nil
}
