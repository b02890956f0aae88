package podsapi

import (
	"cmp"
	"fmt"
	"math"
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

	"github.com/podres-proxy/podres-proxy/internal/unixsock"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
)

// DefaultSocket is where a kubelet with the default root directory serves
// the Pods API (<root>/pods-api/pods-api.sock).
const DefaultSocket = "/var/lib/kubelet/pods-api/pods-api.sock"

// maxMessageBytes bounds one gRPC message from the kubelet: a ListPods
// answer (every pod of the node) or one watch event. It is far above
// DefaultMaxPodBytes so that an oversize pod still arrives and is refused
// alone; were the message refused by gRPC, the stream would fail at that
// pod at every reconnection and the source would never sync.
const maxMessageBytes = 64 << 20

// DefaultTimeout bounds a ListPods call.
const DefaultTimeout = 5 * time.Second

// DefaultBackoff is the wait between watch attempts that fail to sync
// (see Run): from half a second (a kubelet restart takes seconds) doubling
// to 30 s, with jitter so that the daemons of many nodes do not retry in
// step.
var DefaultBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Cap: 30 * time.Second}

// EventType says what happened to a pod, or to the view.
type EventType string

const (
	// PodAdded: a pod the view did not have (or had refused) is now known.
	PodAdded EventType = "added"
	// PodModified: what is kept of a known pod changed.
	PodModified EventType = "modified"
	// PodDeleted: the kubelet no longer has the pod: it said so, or a
	// relist did not include it. Event.Pod is the last version known.
	PodDeleted EventType = "deleted"
	// PodRefused: the pod's event could not be read (too large, not
	// decodable, no identity). Event.Pod holds what identity could be
	// read and Event.Err says why. Until the pod is read again or deleted,
	// Lookup answers nothing for its name.
	PodRefused EventType = "refused"
	// Synced: a relist is complete. The view holds every pod the kubelet
	// has; pods missing from the relist have been reported PodDeleted.
	Synced EventType = "synced"
	// Unsynced: the watch stream ended after a sync; the view is kept but
	// misses whatever happens until the next Synced.
	Unsynced EventType = "unsynced"
)

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
	// MaxAnnotationBytes says which pod annotations to keep and how
	// large each may be, exactly as kubeletpods.Config.MaxAnnotationBytes
	// does for /pods; nil keeps every annotation whole.
	MaxAnnotationBytes func(key string) int
	// MaxPodBytes bounds the protobuf encoding of one pod; 0 means
	// DefaultMaxPodBytes. A larger pod is refused without being decoded.
	MaxPodBytes int
	// Timeout bounds a ListPods call; 0 means DefaultTimeout.
	Timeout time.Duration
	// Backoff paces watch attempts that fail to sync (see Run): Duration,
	// growing by Factor up to Cap (0: DefaultBackoff.Cap), with Jitter;
	// Steps is ignored. A zero Duration means DefaultBackoff.
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
// does the watching; Lookup, Synced, Pods and Or's reads may be called from
// any goroutine, before, during or after Run.
type Source struct {
	socket  string // for errors and logs
	dec     decoder
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
}

// New checks opts and returns a Source. It does no I/O: the socket is
// dialled by Run and Pods, and may appear later.
func New(opts Options) (*Source, error) {
	target, err := unixsock.Target(cmp.Or(opts.Socket, DefaultSocket))
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API: %w", err)
	}
	socket := strings.TrimPrefix(target, "unix://")
	if opts.MaxPodBytes < 0 || opts.Timeout < 0 {
		return nil, fmt.Errorf("kubelet Pods API source: negative pod limit (%d bytes) or timeout (%v)", opts.MaxPodBytes, opts.Timeout)
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
		timeout: cmp.Or(opts.Timeout, DefaultTimeout),
		backoff: bo,
		handler: opts.Handler,
		metrics: opts.Metrics,
		log:     opts.Log,
		view:    newView(),
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
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes)),
	)
	if err != nil {
		return nil, fmt.Errorf("kubelet Pods API client for %s: %w", socket, err)
	}
	s.client = podsv1alpha1.NewPodsClient(s.conn)
	return s, nil
}

// Close releases the connection to the kubelet. Call it after Run has
// returned; Pods fails after it.
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
	return s.view.lookup(model.PodKey{Namespace: namespace, Name: name})
}

// Synced reports whether the watch is connected and its last relist
// complete: then the view holds every pod the kubelet has, up to the
// events still in flight. While it is false (before the first sync, while
// reconnecting) Lookup may miss new pods and still answer deleted ones,
// and a caller that needs freshness should read Pods (or /pods) instead.
func (s *Source) Synced() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.synced
}
