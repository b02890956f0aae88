// Package proxy serves the kubelet's PodResources API (v1 List, Get,
// GetAllocatableResources and v1alpha1 List) on its own unix socket. Each
// answer is the kubelet's own answer, edited in place to add the devices a
// centralized scheduler recorded in the pods' annotations; clients cannot
// tell it from the kubelet except that they now see those devices.
//
// The server is composed like the kubelet's own: the upstream kubelet
// answers which pods and containers exist, the resolver (store + /pods
// reads + allocator decoders) says which devices each pod gets, and the
// inventory says where devices sit (NUMA) and what the node has.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/proxy/allocator"
	"github.com/podres-proxy/podres-proxy/proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/state"
)

// Config configures a Server.
type Config struct {
	// Socket is where the proxy serves; never the kubelet's socket.
	Socket string
	// KubeletSocket is the kubelet's PodResources socket (path or unix:// URL).
	KubeletSocket string
	// MaxMessageSize bounds kubelet answers; 0 means DefaultMaxMessageSize.
	MaxMessageSize int
	// RateLimitQPS and RateLimitBurst are the endpoint's token bucket;
	// QPS <= 0 disables it.
	RateLimitQPS   float64
	RateLimitBurst int
	// MaxConnections caps open client connections; 0 means
	// DefaultMaxConnections.
	MaxConnections int
	// RequestTimeout bounds every call without a sooner deadline of its
	// own, and every kubelet call; 0 means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// IdleTimeout closes connections without calls for this long; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	Log         logrus.FieldLogger
}

// Deps are the providers the server composes answers from.
type Deps struct {
	Store      *state.Store
	Pods       *kubeletpods.Reader // fresh /pods reads; nil answers pods unknown to the store with Unavailable
	Allocators *allocator.Set
	// Topology gives added devices their NUMA nodes; nil adds none. It
	// must answer from the snapshot Inventory returns (or never change when
	// Inventory is nil): a List answer is reused while that snapshot is.
	Topology TopologyFunc
	// Allocatable lists the inventory's devices for GetAllocatableResources
	// in the kubelet's shape; nil adds none.
	Allocatable func() []*v1.ContainerDevices
	// Inventory returns the current inventory, to translate devices the
	// allocator named by minor or index into ids; nil translates nothing.
	Inventory func() allocator.Inventory
	Metrics   *Metrics
}

// Server is the PodResources proxy.
type Server struct {
	cfg      Config
	deps     Deps
	log      logrus.FieldLogger
	up       *upstream
	resolver *resolver
	grpc     *grpc.Server
	ready    atomic.Bool

	// listV1 and listV1alpha1 keep each List method's last answer.
	listV1, listV1alpha1 answerCache
}

// New checks the configuration and prepares the server; nothing is dialled
// or listened on until Serve. The kubelet's socket need not exist yet.
func New(cfg Config, deps Deps) (*Server, error) {
	if cfg.Socket == "" {
		return nil, errors.New("proxy: no socket path")
	}
	if deps.Store == nil || deps.Allocators == nil {
		return nil, errors.New("proxy: a store and an allocator set are required")
	}
	log := cfg.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	cfg.MaxConnections = cmp.Or(cfg.MaxConnections, DefaultMaxConnections)
	cfg.RequestTimeout = cmp.Or(cfg.RequestTimeout, DefaultRequestTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout)
	if cfg.MaxConnections < 0 || cfg.RequestTimeout < 0 || cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("proxy: negative limit (connections %d, request timeout %v, idle timeout %v)",
			cfg.MaxConnections, cfg.RequestTimeout, cfg.IdleTimeout)
	}
	up, err := newUpstream(cfg.KubeletSocket, cfg.MaxMessageSize, cfg.RequestTimeout, deps.Metrics)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:  cfg,
		deps: deps,
		log:  log,
		up:   up,
		resolver: &resolver{
			store:      deps.Store,
			pods:       deps.Pods,
			allocators: deps.Allocators,
			inventory:  deps.Inventory,
			metrics:    deps.Metrics,
			log:        log,
		},
	}
	// Unlike the kubelet, which trusts its clients, every resource a client
	// can hold is bounded (see limits.go).
	s.grpc = grpc.NewServer(serverOptions(cfg, rateLimit(cfg.RateLimitQPS, cfg.RateLimitBurst, deps.Metrics, nil))...)
	v1.RegisterPodResourcesListerServer(s.grpc, &v1Server{s: s})
	v1alpha1.RegisterPodResourcesListerServer(s.grpc, &v1alpha1Server{s: s})
	return s, nil
}

// Serve listens on the socket and serves until ctx is done, then stops
// gracefully (in-flight calls finish, bounded by a few seconds) and removes
// the socket.
func (s *Server) Serve(ctx context.Context) error {
	defer s.up.Close()
	l, err := listenSocket(s.cfg.Socket, s.cfg.KubeletSocket)
	if err != nil {
		return err
	}
	s.log.WithField("socket", s.cfg.Socket).Info("serving the PodResources API")
	errc := make(chan error, 1)
	go func() {
		errc <- s.grpc.Serve(newLimitListener(l, s.cfg.MaxConnections, s.deps.Metrics.connectionRejected))
	}()
	s.ready.Store(true)
	defer s.ready.Store(false)
	select {
	case err := <-errc:
		l.Close()
		return fmt.Errorf("serve PodResources on %s: %w", s.cfg.Socket, err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		s.grpc.Stop()
		<-stopped
	}
	<-errc
	return l.Close()
}

// Ready reports whether the socket is being served.
func (s *Server) Ready() bool { return s.ready.Load() }

func keysV1(pods []*v1.PodResources) []state.PodKey {
	keys := make([]state.PodKey, len(pods))
	for i, p := range pods {
		keys[i] = state.PodKey{Namespace: p.GetNamespace(), Name: p.GetName()}
	}
	return keys
}

// v1Server serves v1.PodResourcesLister.
type v1Server struct {
	v1.UnimplementedPodResourcesListerServer
	s *Server
}

func (v *v1Server) List(ctx context.Context, req *v1.ListPodResourcesRequest) (resp *v1.ListPodResourcesResponse, err error) {
	arrived := time.Now()
	defer func() { v.s.deps.Metrics.request("v1", "List", err != nil) }()
	out, err := v.s.answerList(ctx, "List", &v.s.listV1, func(ctx context.Context) (encoded, error) { return v.s.up.List(ctx, req) },
		func(kubelet encoded, inv allocator.Inventory) ([]byte, bool, error) {
			var resp v1.ListPodResourcesResponse
			if err := decodeKubelet(kubelet, &resp); err != nil {
				return nil, false, err
			}
			plans, fromStore, err := v.s.resolver.plans(ctx, keysV1(resp.GetPodResources()), arrived, inv)
			if err != nil {
				return nil, false, err
			}
			for i, pod := range resp.GetPodResources() {
				mergeV1(pod, plans[i], v.s.deps.Topology)
			}
			out, err := proto.Marshal(&resp)
			return out, fromStore, err
		})
	if err != nil {
		return nil, err
	}
	return preEncoded(&v1.ListPodResourcesResponse{}, out), nil
}

func (v *v1Server) Get(ctx context.Context, req *v1.GetPodResourcesRequest) (resp *v1.GetPodResourcesResponse, err error) {
	arrived := time.Now()
	defer func() { v.s.deps.Metrics.request("v1", "Get", err != nil) }()
	resp, err = v.s.up.Get(ctx, req)
	if err != nil {
		return nil, err // "pod X in namespace Y not found" (Unknown) passes through as is
	}
	pod := resp.GetPodResources()
	if pod == nil {
		return resp, nil
	}
	plans, _, err := v.s.resolver.plans(ctx, keysV1([]*v1.PodResources{pod}), arrived, v.s.resolver.snapshot())
	if err != nil {
		v.s.log.WithError(err).Warn("Get answered with an error")
		return nil, err
	}
	mergeV1(pod, plans[0], v.s.deps.Topology)
	return resp, nil
}

func (v *v1Server) GetAllocatableResources(ctx context.Context, req *v1.AllocatableResourcesRequest) (resp *v1.AllocatableResourcesResponse, err error) {
	defer func() { v.s.deps.Metrics.request("v1", "GetAllocatableResources", err != nil) }()
	resp, err = v.s.up.GetAllocatableResources(ctx, req)
	if err != nil {
		return nil, err
	}
	if v.s.deps.Allocatable != nil {
		mergeAllocatable(resp, v.s.deps.Allocatable(), v.s.deps.Allocators.ReplacedResources())
	}
	return resp, nil
}

// v1alpha1Server serves v1alpha1.PodResourcesLister, which old clients
// (DCGM exporter up to 4.2.3-4.1.1, Antrea, Multus up to 3.7.1) still call.
type v1alpha1Server struct {
	v1alpha1.UnimplementedPodResourcesListerServer
	s *Server
}

func (v *v1alpha1Server) List(ctx context.Context, req *v1alpha1.ListPodResourcesRequest) (resp *v1alpha1.ListPodResourcesResponse, err error) {
	arrived := time.Now()
	defer func() { v.s.deps.Metrics.request("v1alpha1", "List", err != nil) }()
	out, err := v.s.answerList(ctx, "v1alpha1 List", &v.s.listV1alpha1, func(ctx context.Context) (encoded, error) { return v.s.up.ListV1alpha1(ctx, req) },
		func(kubelet encoded, inv allocator.Inventory) ([]byte, bool, error) {
			var resp v1alpha1.ListPodResourcesResponse
			if err := decodeKubelet(kubelet, &resp); err != nil {
				return nil, false, err
			}
			pods := resp.GetPodResources()
			keys := make([]state.PodKey, len(pods))
			for i, p := range pods {
				keys[i] = state.PodKey{Namespace: p.GetNamespace(), Name: p.GetName()}
			}
			plans, fromStore, err := v.s.resolver.plans(ctx, keys, arrived, inv)
			if err != nil {
				return nil, false, err
			}
			for i, pod := range pods {
				mergeV1alpha1(pod, plans[i])
			}
			out, err := proto.Marshal(&resp)
			return out, fromStore, err
		})
	if err != nil {
		return nil, err
	}
	return preEncoded(&v1alpha1.ListPodResourcesResponse{}, out), nil
}

// answerList answers a List: it asks the kubelet, then reuses the last
// answer when the kubelet's bytes, the store's version and the inventory
// snapshot are all the same as when it was built, and builds a new one
// otherwise. Only answers built from the store alone are kept: one that
// needed a /pods read depended on that read too.
func (s *Server) answerList(ctx context.Context, name string, cache *answerCache,
	call func(context.Context) (encoded, error),
	build func(kubelet encoded, inv allocator.Inventory) (out []byte, cacheable bool, err error),
) ([]byte, error) {
	kubelet, err := call(ctx)
	if err != nil {
		return nil, err // the kubelet's codes and messages pass through
	}
	// Read before building, so that a change made while building leaves a
	// cached answer that no longer matches.
	version := s.deps.Store.Version()
	inv := s.resolver.snapshot()
	if out, ok := cache.lookup(kubelet, version, inv); ok {
		return out, nil
	}
	out, cacheable, err := build(kubelet, inv)
	if err != nil {
		s.log.WithError(err).Warnf("%s answered with an error", name)
		return nil, err
	}
	if cacheable {
		cache.put(kubelet, version, inv, out)
	}
	return out, nil
}

// decodeKubelet decodes a kubelet answer received encoded, failing as gRPC
// would have had it decoded the answer itself.
func decodeKubelet(kubelet encoded, m proto.Message) error {
	if err := proto.Unmarshal(kubelet, m); err != nil {
		return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return nil
}
