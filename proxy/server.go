// Package proxy serves the kubelet's PodResources API (v1 List, Get,
// GetAllocatableResources and v1alpha1 List) on its own unix sockets, one
// per view (views.go, docs/views.md: the views differ only in how a GPU
// that pods share is spelled). Each answer is the kubelet's own answer,
// edited in place to add the devices a centralized scheduler recorded in
// the pods' annotations; clients cannot tell it from the kubelet except
// that they now see those devices.
//
// The server is composed like the kubelet's own: its Providers are gathered
// in one struct. The upstream kubelet (package upstream) answers which pods
// and containers exist; what each pod adds is its plan (package plans),
// computed in the background whenever the store or the inventory changes;
// a query looks plans up, reading /pods first for a pod the plans do not
// know yet (package resolve), and adds them to the kubelet's answer
// (package merge). List
// answers are reused pod by pod (package reuse tells how, in one place); a
// call a moment after another shares its kubelet call (upstream.Shared).
// Every input is bounded (package limits; the socket's permissions,
// internal/unixsock/listen.go). Its metrics are package metrics'.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/internal/coalesce"
	"github.com/podres-proxy/podres-proxy/internal/unixsock"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/proxy/resolve"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
	"github.com/podres-proxy/podres-proxy/proxy/upstream"
)

// Config configures a Server.
type Config struct {
	// Socket is where the proxy serves its default view (merge.Topology);
	// never the kubelet's socket.
	Socket string
	// Views are more sockets, each serving a view of the same answers
	// (docs/views.md); none of them the kubelet's socket or another's.
	Views []ViewSocket
	// KubeletSocket is the kubelet's PodResources socket (path or unix:// URL).
	KubeletSocket string
	// MaxMessageSize bounds kubelet answers; 0 means
	// upstream.DefaultMaxMessageSize.
	MaxMessageSize int
	// RateLimitQPS and RateLimitBurst are the endpoint's token bucket;
	// QPS <= 0 disables it.
	RateLimitQPS   float64
	RateLimitBurst int
	// MaxConnections caps open client connections; 0 means
	// limits.DefaultMaxConnections.
	MaxConnections int
	// MaxConnectionsPerClient caps the connections of one client process;
	// 0 means limits.DefaultMaxConnectionsPerClient.
	MaxConnectionsPerClient int
	// RequestTimeout bounds every call without a sooner deadline of its
	// own, and every kubelet call; 0 means limits.DefaultRequestTimeout.
	RequestTimeout time.Duration
	// IdleTimeout closes connections without calls for this long; 0 means
	// limits.DefaultIdleTimeout.
	IdleTimeout time.Duration
	// PodsTimeout bounds a shared /pods read; 0 means
	// kubeletpods.DefaultReadTimeout.
	PodsTimeout time.Duration
	Log         logrus.FieldLogger
}

// ViewSocket is a socket and the view it serves.
type ViewSocket struct {
	View   merge.View
	Socket string
}

// Server is the PodResources proxy.
type Server struct {
	cfg      Config
	p        Providers
	log      logrus.FieldLogger
	up       *upstream.Client
	plans    *plans.Builder
	resolver *resolve.Resolver
	// pods is the shared /pods reader: the resolver's, and the background
	// spec reader's (resolve/specs.go). Nil without a /pods source.
	pods  *kubeletpods.Reader
	ready atomic.Bool
	// unread bounds the answer bytes clients hold unread, every socket's
	// connections together.
	unread *limits.Unread

	// sockets are the sockets served, the default view's first, each
	// with its gRPC server; views the views they serve, each once.
	sockets []*socket
	views   []*view

	// The List methods (answers.go).
	listV1, listV1alpha1 lister
	allocatable          *upstream.Shared[*v1.AllocatableResourcesResponse]
	// getV1 answers Gets from the kubelet's List (see v1Server.Get).
	getV1 *upstream.Shared[kubeletPods]
}

// New checks the configuration and prepares the server; nothing is dialled
// or listened on until Serve. The kubelet's socket need not exist yet.
func New(cfg Config, p Providers) (*Server, error) {
	if cfg.Socket == "" {
		return nil, errors.New("proxy: no socket path")
	}
	sockets, views, err := viewsOf(cfg)
	if err != nil {
		return nil, err
	}
	for _, v := range views {
		if v.name == merge.Legacy && p.Fold == nil {
			return nil, errors.New("proxy: the legacy view needs the DRA folding (Providers.Fold)")
		}
	}
	if p.Store == nil || p.Allocators == nil || p.Trust == nil {
		return nil, errors.New("proxy: a store, an allocator set and a trust gate are required")
	}
	log := cfg.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, limits.DefaultMaxConnections)
	cfg.MaxConnectionsPerClient = cmp.Or(cfg.MaxConnectionsPerClient, limits.DefaultMaxConnectionsPerClient)
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, limits.DefaultRequestTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, limits.DefaultIdleTimeout)
	if cfg.MaxConnections < 0 || cfg.MaxConnectionsPerClient < 0 || cfg.RequestTimeout < 0 || cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("proxy: negative limit (connections %d, per client %d, request timeout %v, idle timeout %v)",
			cfg.MaxConnections, cfg.MaxConnectionsPerClient, cfg.RequestTimeout, cfg.IdleTimeout)
	}
	up, err := upstream.New(cfg.KubeletSocket, cfg.MaxMessageSize, cfg.RequestTimeout, p.Metrics)
	if err != nil {
		return nil, err
	}
	if p.ResourceNames == nil {
		p.ResourceNames = inventory.DefaultResourceNames()
	}
	pods := resolve.NewPodsReader(p.Store, p.Pods, p.PodLogs, cfg.PodsTimeout, p.Metrics, log)
	builder := plans.New(plans.Options{
		Store:            p.Store,
		Inventory:        p.Inventory,
		InventoryChanged: p.InventoryChanged,
		Allocators:       p.Allocators,
		Gate:             p.Trust,
		MIGResource:      p.MIGResource,
		DeviceInfo:       p.DeviceInfo,
		Report:           p.Report,
		Log:              log,
	})
	s := &Server{
		cfg:    cfg,
		p:      p,
		log:    log,
		up:     up,
		pods:   pods,
		plans:  builder,
		unread: limits.NewUnread(0, p.Metrics),
		resolver: resolve.NewResolver(resolve.Options{
			Store:    p.Store,
			Plans:    builder,
			Pods:     pods,
			PodLogs:  p.PodLogs,
			Watching: p.Watching,
			Report:   p.Report,
			Log:      log,
		}),
		listV1:       lister{api: upstream.V1},
		listV1alpha1: lister{api: upstream.V1alpha1, index: 1, alpha: true},
		sockets:      sockets,
		views:        views,
	}
	// Unlike the kubelet, which trusts its clients, every resource a client
	// can hold is bounded (package limits).
	// Every method answers from kubelet calls that concurrent callers
	// share, so a burst beyond the limit can join them (limits.RateLimit).
	limit := limits.RateLimit(cfg.RateLimitQPS, cfg.RateLimitBurst, nil)
	// One limit for every socket: they share the kubelet calls it guards.
	opts := append(limits.ServerOptions(cfg.IdleTimeout, cfg.RequestTimeout, s.unread, limit),
		grpc.ForceServerCodecV2(reuse.ServerCodec{})) // List answers are sent as they were spliced
	for _, sock := range s.sockets {
		sock.grpc = grpc.NewServer(opts...)
		v1.RegisterPodResourcesListerServer(sock.grpc, &v1Server{s: s, v: sock.view})
		v1alpha1.RegisterPodResourcesListerServer(sock.grpc, &v1alpha1Server{s: s, v: sock.view})
	}
	s.shareCalls()
	return s, nil
}

// Serve listens on every socket and serves until ctx is done, then stops
// gracefully (in-flight calls finish, bounded by a few seconds) and removes
// the sockets. A socket that cannot be listened on fails Serve before any
// is served; one whose server fails stops them all.
func (s *Server) Serve(ctx context.Context) error {
	defer s.up.Close()
	for i, sock := range s.sockets {
		l, err := unixsock.Listen(sock.path, s.cfg.KubeletSocket)
		if err != nil {
			for _, done := range s.sockets[:i] {
				done.l.Close()
			}
			return err
		}
		sock.l = l
	}
	errc := make(chan error, len(s.sockets))
	for _, sock := range s.sockets {
		s.log.WithFields(logrus.Fields{"socket": sock.path, "view": sock.view.name}).Info("serving the PodResources API")
		go func() {
			err := sock.grpc.Serve(limits.NewListener(sock.l, s.cfg.MaxConnections, s.cfg.MaxConnectionsPerClient, s.unread, s.p.Metrics))
			if err != nil {
				err = fmt.Errorf("serve PodResources on %s: %w", sock.path, err)
			}
			errc <- err
		}()
	}
	keepCtx, stopKeeping := context.WithCancel(ctx)
	var keeping, reserved sync.WaitGroup // reserved: paths served again
	for _, sock := range s.sockets {
		keeping.Go(func() { s.keepAnswered(keepCtx, sock, &reserved) })
	}
	// Plans are computed, and specs read, in the background for as long
	// as the sockets are served: until the servers have stopped, not when
	// ctx ends, so that calls in flight at a shutdown (a rolling update)
	// are answered rather than failed.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Go(func() { s.plans.Run(bgCtx) })
	bg.Go(func() { s.resolver.ReadSpecs(bgCtx) })
	defer func() { stopBackground(); bg.Wait() }()
	s.ready.Store(true)
	defer s.ready.Store(false)
	var failed error
	select {
	case failed = <-errc:
	case <-ctx.Done():
	}
	stopKeeping()
	keeping.Wait()
	stopped := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, sock := range s.sockets {
			wg.Go(sock.grpc.GracefulStop)
		}
		wg.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		for _, sock := range s.sockets {
			sock.grpc.Stop()
		}
		<-stopped
	}
	reserved.Wait()
	// Every server has returned: collect the others' results.
	n := len(s.sockets)
	if failed != nil {
		n--
	}
	for range n {
		<-errc
	}
	var closeErr error
	for _, sock := range s.sockets {
		closeErr = cmp.Or(closeErr, sock.l.Close())
	}
	return cmp.Or(failed, closeErr)
}

// keepInterval is how often a server whose socket path another instance
// took over checks that the path still answers.
const keepInterval = time.Second

// keepAnswered serves sock's path again, until ctx is done, whenever
// another instance took the path over (the new pod of a rolling update
// renames its socket over it) and then stopped answering there (it crashed
// or was stopped before this instance): this instance keeps serving until
// it is stopped, so the node keeps an answering socket. A path that
// answers is never taken from the process that serves it.
func (s *Server) keepAnswered(ctx context.Context, sock *socket, served *sync.WaitGroup) {
	t := time.NewTicker(keepInterval)
	defer t.Stop()
	current := sock.l
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if current.Owned() || unixsock.Answers(sock.path, keepInterval/2) {
			continue
		}
		l, err := unixsock.Listen(sock.path, s.cfg.KubeletSocket)
		if err != nil {
			s.log.WithError(err).WithField("socket", sock.path).Warn("the instance that took the socket over no longer answers there, and serving it again failed")
			continue
		}
		s.log.WithField("socket", sock.path).Warn("the instance that took the socket over no longer answers there: serving it again")
		current = l
		// The server closes l when it stops; l removes the path only
		// while it is still this instance's.
		served.Go(func() {
			if err := sock.grpc.Serve(limits.NewListener(l, s.cfg.MaxConnections, s.cfg.MaxConnectionsPerClient, s.unread, s.p.Metrics)); err != nil && ctx.Err() == nil {
				s.log.WithError(err).WithField("socket", sock.path).Error("serving the socket again")
			}
		})
	}
}

// Ready reports whether the socket is being served.
func (s *Server) Ready() bool { return s.ready.Load() }

// v1Server serves v1.PodResourcesLister.
type v1Server struct {
	v1.UnimplementedPodResourcesListerServer
	s *Server
	v *view
}

// List returns the kubelet's List answer with the devices each pod's plan
// adds, spelled for v's view. Its errors are the kubelet's, codes and
// messages passed through; Unavailable when a pod's devices are unknown
// and /pods cannot be read (resolve.Query.Plans), rather than an answer
// silently missing them; and the kubelet's rate-limit error for a call
// beyond the limit that no shared call answers. Concurrent Lists share one
// kubelet call (upstream.Shared); the answer is reused pod by pod and sent
// as the bytes it was spliced into (package reuse).
func (v *v1Server) List(ctx context.Context, _ *v1.ListPodResourcesRequest) (resp *v1.ListPodResourcesResponse, err error) {
	defer func() { v.s.counted(ctx, "v1", "List", v.v, err) }()
	answers, err := shared(ctx, v.s.listV1.shared)
	if err != nil {
		return nil, err
	}
	out, err := answers.of(v.v)
	if err != nil {
		return nil, err
	}
	return reuse.PreEncoded(&v1.ListPodResourcesResponse{}, out), nil
}

// GetAllocatableResources returns the kubelet's answer with the
// inventory's devices added, in place of the kubelet's own entries for a
// resource an allocator replaces (merge.Allocatable); in the legacy view,
// with the node's DRA devices too. Its errors are the kubelet's, and the
// rate-limit error as List's. Concurrent calls share one kubelet call.
func (v *v1Server) GetAllocatableResources(ctx context.Context, _ *v1.AllocatableResourcesRequest) (resp *v1.AllocatableResourcesResponse, err error) {
	defer func() { v.s.counted(ctx, "v1", "GetAllocatableResources", v.v, err) }()
	// The answer is shared by every caller of the call: gRPC only reads it.
	resp, err = shared(ctx, v.s.allocatable)
	if err != nil || v.v.name != merge.Legacy {
		return resp, err
	}
	// The legacy view lists the node's DRA devices too: on a copy.
	resp = proto.Clone(resp).(*v1.AllocatableResourcesResponse)
	v.s.p.Fold.Allocatable(resp)
	return resp, nil
}

// counted counts a call that reached its handler: the kubelet's counters
// and the proxy's latency, by the socket's view.
func (s *Server) counted(ctx context.Context, version, method string, v *view, err error) {
	s.p.Metrics.Request(version, method, err != nil)
	s.p.Metrics.Answered(version, method, string(v.name), err, time.Since(limits.Arrived(ctx)))
}

// allocatableAnswer makes one shared GetAllocatableResources call.
func (s *Server) allocatableAnswer(ctx context.Context, _ time.Time) (*v1.AllocatableResourcesResponse, error) {
	resp, err := s.up.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, err
	}
	var inv *inventory.Snapshot
	if s.p.Inventory != nil {
		inv = s.p.Inventory()
	}
	merge.Allocatable(resp, inv.Allocatable(s.p.ResourceNames), s.p.Allocators.ReplacedResources())
	return resp, nil
}

// v1alpha1Server serves v1alpha1.PodResourcesLister, which old clients
// (DCGM exporter up to 4.2.3-4.1.1, Antrea, Multus up to 3.7.1) still call.
type v1alpha1Server struct {
	v1alpha1.UnimplementedPodResourcesListerServer
	s *Server
	v *view
}

// List returns the kubelet's v1alpha1 List answer with the devices each
// pod's plan adds, without topology; its errors and sharing are v1's List's.
func (v *v1alpha1Server) List(ctx context.Context, _ *v1alpha1.ListPodResourcesRequest) (resp *v1alpha1.ListPodResourcesResponse, err error) {
	defer func() { v.s.counted(ctx, "v1alpha1", "List", v.v, err) }()
	answers, err := shared(ctx, v.s.listV1alpha1.shared)
	if err != nil {
		return nil, err
	}
	out, err := answers.of(v.v)
	if err != nil {
		return nil, err
	}
	return reuse.PreEncoded(&v1alpha1.ListPodResourcesResponse{}, out), nil
}

// shareCalls sets up the methods whose kubelet calls concurrent callers
// share (upstream.Shared). The requests of these methods have no fields, so one
// caller's request stands for all.
func (s *Server) shareCalls() {
	for _, l := range []*lister{&s.listV1, &s.listV1alpha1} {
		l.shared = upstream.NewShared(l.api.Name, s.answer(l), s.p.Metrics)
	}
	s.getV1 = upstream.NewShared("Get", s.getV1Answer, s.p.Metrics)
	s.allocatable = upstream.NewShared("GetAllocatableResources", s.allocatableAnswer, s.p.Metrics)
}

// shared returns the result of sh's shared call for the call of ctx, one
// that started after the call arrived (limits.Arrived), or the kubelet's
// rate-limit error (limits.ErrRateLimited): this is where a call beyond the
// rate limit (its context has a limits.Overdraft) is refused, when no
// kubelet call made for others answers it (upstream.Shared.Do). A call
// within the limit is never refused here.
func shared[T any](ctx context.Context, sh *upstream.Shared[T]) (T, error) {
	var ticket coalesce.Ticket
	if over := limits.OverdraftOf(ctx); over != nil {
		ticket = over
	}
	v, err := sh.Do(ctx, limits.Arrived(ctx), ticket)
	if errors.Is(err, coalesce.ErrNotMade) {
		return v, limits.ErrRateLimited()
	}
	return v, err
}
