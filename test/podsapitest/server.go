// Package podsapitest is a fake kubelet Pods API server (v1alpha1.Pods)
// on a real unix socket, for tests of its clients. It behaves as the
// kubelet's pkg/kubelet/apis/pods server does in the ways a client can
// see: a watcher is registered with a queue of 100 events, then gets ADDED
// for every pod sorted by UID, then INITIAL_SYNC_COMPLETE, then the
// events broadcast since it registered; a watcher whose queue is full is
// dropped (its stream ends); DELETED carries only name, namespace and UID;
// ListPods lists every pod sorted by UID; GetPod answers NotFound for an
// unknown UID. It does not rate-limit.
//
// A dropped watcher's stream ends with ResourceExhausted "watch client
// channel closed" once the events already queued for it are sent, as the
// kubelet's does (v1.36 and v1.37).
//
// SetInitializing(true) is kubelet v1.37's behaviour after every start
// until its pod sources are ready (config.SourcesReady): ListPods,
// WatchPods and GetPod answer FailedPrecondition "Kubelet is
// initializing" (InitializingMessage), and a watcher is not registered.
// SetInitializing(false) is the kubelet ready. A v1.36 kubelet never says
// it (the zero Server). v1.37 also serves a pod its status manager has no
// status for yet with the API server's status, its Ready condition forced
// to False; the fake serves every pod as it was given.
package podsapitest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"
)

// QueueLength is the kubelet's per-watcher event queue.
const QueueLength = 100

// InitializingMessage is the kubelet's FailedPrecondition message until its
// pod sources are ready (v1.37, pkg/kubelet/apis/pods validateReady).
const InitializingMessage = "Kubelet is initializing"

// Server is a fake Pods API. Its methods are safe for concurrent use.
type Server struct {
	podsv1alpha1.UnimplementedPodsServer

	socket string

	mu       sync.Mutex
	pods     map[string][]byte // uid -> v1.Pod protobuf
	watchers map[chan *podsv1alpha1.WatchPodsEvent]struct{}
	srv      *grpc.Server
	served   chan struct{} // closed when srv.Serve returns
	drops    int
	lists    int
	// initializing makes every call answer FailedPrecondition.
	initializing bool
	watchCalls   int
	refusals     int
	// called is closed, and replaced, at every WatchPods call:
	// AwaitWatchCalls waits on it.
	called chan struct{}

	// stall, held by Stall, keeps watch streams from sending, as a
	// client that does not read would.
	stall sync.RWMutex
}

// New returns a server for socket, not yet serving.
func New(socket string) *Server {
	return &Server{
		socket:   socket,
		pods:     make(map[string][]byte),
		watchers: make(map[chan *podsv1alpha1.WatchPodsEvent]struct{}),
		called:   make(chan struct{}),
	}
}

// Socket returns the server's socket path.
func (s *Server) Socket() string { return s.socket }

// Start serves on the socket (removing a stale socket file first) until
// Stop. The pods survive a Stop and Start, as a kubelet's do a restart.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("podsapitest: already serving")
	}
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("podsapitest: remove stale socket: %w", err)
	}
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		return fmt.Errorf("podsapitest: listen: %w", err)
	}
	srv := grpc.NewServer()
	podsv1alpha1.RegisterPodsServer(srv, s)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(l) // returns when stopped
	}()
	s.srv, s.served = srv, served
	return nil
}

// Stop stops serving at once, ending every stream and connection, as a
// kubelet that exits does. It waits for the server's goroutines.
func (s *Server) Stop() {
	s.mu.Lock()
	srv, served := s.srv, s.served
	s.srv, s.served = nil, nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-served
}

// Stall keeps every watch stream from sending until Resume, so that the
// events broadcast meanwhile fill the watchers' queues.
func (s *Server) Stall() { s.stall.Lock() }

// Resume undoes Stall.
func (s *Server) Resume() { s.stall.Unlock() }

// Drops returns how many watchers were dropped for a full queue.
func (s *Server) Drops() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drops
}

// SetInitializing makes the server answer as a v1.37 kubelet does while
// it is initializing (true), or as a ready one (false).
func (s *Server) SetInitializing(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initializing = on
}

// WatchCalls returns how many WatchPods calls came, refused or not.
func (s *Server) WatchCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watchCalls
}

// Refusals returns how many calls were answered "Kubelet is initializing".
func (s *Server) Refusals() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusals
}

// AwaitWatchCalls waits until n WatchPods calls have come in all, or ctx
// ends.
func (s *Server) AwaitWatchCalls(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		got, called := s.watchCalls, s.called
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-called:
		case <-ctx.Done():
			return fmt.Errorf("podsapitest: %d WatchPods calls of %d: %w", got, n, context.Cause(ctx))
		}
	}
}

// refuseLocked answers FailedPrecondition while the server is
// initializing. s.mu is held.
func (s *Server) refuseLocked() error {
	if !s.initializing {
		return nil
	}
	s.refusals++
	return status.Error(codes.FailedPrecondition, InitializingMessage)
}

// Add adds pod and broadcasts ADDED.
func (s *Server) Add(pod *v1.Pod) { s.set(pod, podsv1alpha1.EventType_ADDED) }

// Update replaces pod and broadcasts MODIFIED.
func (s *Server) Update(pod *v1.Pod) { s.set(pod, podsv1alpha1.EventType_MODIFIED) }

// Delete removes the pod with pod's UID and broadcasts DELETED with only
// its name, namespace and UID.
func (s *Server) Delete(pod *v1.Pod) {
	id := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID}}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pods, string(pod.UID))
	s.broadcastLocked(&podsv1alpha1.WatchPodsEvent{Type: podsv1alpha1.EventType_DELETED, Pod: mustMarshal(id)})
}

// SetRaw stores data as the encoding of the pod with uid and broadcasts
// typ with it: for pods a v1.Pod cannot make (undecodable bytes).
func (s *Server) SetRaw(uid string, data []byte, typ podsv1alpha1.EventType) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[uid] = data
	s.broadcastLocked(&podsv1alpha1.WatchPodsEvent{Type: typ, Pod: data})
}

func (s *Server) set(pod *v1.Pod, typ podsv1alpha1.EventType) {
	data := mustMarshal(pod)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods[string(pod.UID)] = data
	s.broadcastLocked(&podsv1alpha1.WatchPodsEvent{Type: typ, Pod: data})
}

func mustMarshal(pod *v1.Pod) []byte {
	data, err := pod.Marshal()
	if err != nil {
		// A v1.Pod built by a test always marshals.
		panic(fmt.Sprintf("podsapitest: marshal pod: %v", err))
	}
	return data
}

// broadcastLocked queues ev for every watcher, dropping (closing the queue
// of) those whose queue is full. s.mu is held.
func (s *Server) broadcastLocked(ev *podsv1alpha1.WatchPodsEvent) {
	for q := range s.watchers {
		select {
		case q <- ev:
		default:
			delete(s.watchers, q)
			close(q)
			s.drops++
		}
	}
}

// sortedLocked returns the pods sorted by UID. s.mu is held.
func (s *Server) sortedLocked() [][]byte {
	uids := make([]string, 0, len(s.pods))
	for uid := range s.pods {
		uids = append(uids, uid)
	}
	slices.SortFunc(uids, strings.Compare)
	out := make([][]byte, len(uids))
	for i, uid := range uids {
		out[i] = s.pods[uid]
	}
	return out
}

// WatchPods implements v1alpha1.PodsServer.
func (s *Server) WatchPods(_ *podsv1alpha1.WatchPodsRequest, stream podsv1alpha1.Pods_WatchPodsServer) error {
	q := make(chan *podsv1alpha1.WatchPodsEvent, QueueLength)
	s.mu.Lock()
	s.watchCalls++
	close(s.called)
	s.called = make(chan struct{})
	if err := s.refuseLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	s.watchers[q] = struct{}{}
	initial := s.sortedLocked()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers, q) // gone already if it was dropped
		s.mu.Unlock()
	}()

	send := func(ev *podsv1alpha1.WatchPodsEvent) error {
		s.stall.RLock()
		defer s.stall.RUnlock()
		return stream.Send(ev)
	}
	for _, data := range initial {
		if err := send(&podsv1alpha1.WatchPodsEvent{Type: podsv1alpha1.EventType_ADDED, Pod: data}); err != nil {
			return err
		}
	}
	if err := send(&podsv1alpha1.WatchPodsEvent{Type: podsv1alpha1.EventType_INITIAL_SYNC_COMPLETE}); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case ev, ok := <-q:
			if !ok {
				return status.Error(codes.ResourceExhausted, "watch client channel closed") // dropped
			}
			if err := send(ev); err != nil {
				return err
			}
		}
	}
}

// ListPods implements v1alpha1.PodsServer.
func (s *Server) ListPods(context.Context, *podsv1alpha1.ListPodsRequest) (*podsv1alpha1.ListPodsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refuseLocked(); err != nil {
		return nil, err
	}
	s.lists++
	return &podsv1alpha1.ListPodsResponse{Pods: s.sortedLocked()}, nil
}

// ListCalls returns how many ListPods calls the server answered with pods
// (not those it refused while initializing).
func (s *Server) ListCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// GetPod implements v1alpha1.PodsServer.
func (s *Server) GetPod(_ context.Context, req *podsv1alpha1.GetPodRequest) (*podsv1alpha1.GetPodResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.refuseLocked(); err != nil {
		return nil, err
	}
	data, ok := s.pods[req.GetPodUID()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "pod with UID %s not found", req.GetPodUID())
	}
	return &podsv1alpha1.GetPodResponse{Pod: data}, nil
}
