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
	// Trust decides which decoded devices are reported (see
	// proxy/allocator/trust.go); serve always sets it. Nil reports every
	// decoded device, for tests of attribution alone.
	Trust   *allocator.Gate
	Metrics *Metrics
	// PlainSharedGPUIDs reports every sharer of a GPU under the GPU's plain
	// UUID, as before shared-GPU ids (proxy/allocator/sharedgpu.go); false
	// gives each sharer after the first "<uuid>::<slot>".
	PlainSharedGPUIDs bool
	// MIGResource, when set, is the resource MIG instances are reported
	// as (e.g. nvidia.com/mig-1g.10gb); empty keeps their GPU's.
	MIGResource string
	// DeviceInfo writes the NPWG device-info files of the VFs and RDMA
	// devices pods are answered with; nil writes none.
	DeviceInfo DeviceInfoWriter
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

	// Each List method's pods, reused per pod (answers.go), and each
	// method's shared kubelet calls (shared.go).
	segV1, segV1alpha1 segmentCache
	listV1             *sharedCall[[]byte]
	listV1alpha1       *sharedCall[[]byte]
	allocatable        *sharedCall[*v1.AllocatableResourcesResponse]
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
			trust:      deps.Trust,
			metrics:    deps.Metrics,
			log:        log,

			plainSharedGPUIDs: deps.PlainSharedGPUIDs,
			migResource:       deps.MIGResource,
			deviceInfo:        deps.DeviceInfo,
		},
	}
	// Unlike the kubelet, which trusts its clients, every resource a client
	// can hold is bounded (see limits.go).
	s.grpc = grpc.NewServer(serverOptions(cfg, rateLimit(cfg.RateLimitQPS, cfg.RateLimitBurst, deps.Metrics, nil))...)
	v1.RegisterPodResourcesListerServer(s.grpc, &v1Server{s: s})
	v1alpha1.RegisterPodResourcesListerServer(s.grpc, &v1alpha1Server{s: s})
	s.shareCalls()
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

func (v *v1Server) List(ctx context.Context, _ *v1.ListPodResourcesRequest) (resp *v1.ListPodResourcesResponse, err error) {
	defer func() { v.s.deps.Metrics.request("v1", "List", err != nil) }()
	out, err := v.s.listV1.do(ctx)
	if err != nil {
		return nil, err
	}
	return preEncoded(&v1.ListPodResourcesResponse{}, out), nil
}

// listV1 makes one shared v1 List: the kubelet's answer, then the proxy's
// built from it, reusing what it can per pod.
func (s *Server) listV1Answer(ctx context.Context, started time.Time) ([]byte, error) {
	kubelet, err := s.up.List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		return nil, err // the kubelet's codes and messages pass through
	}
	out, err := s.listAnswer(ctx, &s.segV1, kubelet, started, func(seg []byte, p plan) ([]byte, error) {
		var pod v1.PodResources
		if err := proto.Unmarshal(seg, &pod); err != nil {
			return nil, errNotAPod(err)
		}
		mergeV1(&pod, p, s.deps.Topology)
		return proto.Marshal(&pod)
	})
	if err != nil {
		s.log.WithError(err).Warn("List answered with an error")
	}
	return out, err
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

func (v *v1Server) GetAllocatableResources(ctx context.Context, _ *v1.AllocatableResourcesRequest) (resp *v1.AllocatableResourcesResponse, err error) {
	defer func() { v.s.deps.Metrics.request("v1", "GetAllocatableResources", err != nil) }()
	// The answer is shared by every caller of the call: gRPC only reads it.
	return v.s.allocatable.do(ctx)
}

// allocatableAnswer makes one shared GetAllocatableResources call.
func (s *Server) allocatableAnswer(ctx context.Context, _ time.Time) (*v1.AllocatableResourcesResponse, error) {
	resp, err := s.up.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
	if err != nil {
		return nil, err
	}
	if s.deps.Allocatable != nil {
		mergeAllocatable(resp, s.deps.Allocatable(), s.deps.Allocators.ReplacedResources())
	}
	return resp, nil
}

// v1alpha1Server serves v1alpha1.PodResourcesLister, which old clients
// (DCGM exporter up to 4.2.3-4.1.1, Antrea, Multus up to 3.7.1) still call.
type v1alpha1Server struct {
	v1alpha1.UnimplementedPodResourcesListerServer
	s *Server
}

func (v *v1alpha1Server) List(ctx context.Context, _ *v1alpha1.ListPodResourcesRequest) (resp *v1alpha1.ListPodResourcesResponse, err error) {
	defer func() { v.s.deps.Metrics.request("v1alpha1", "List", err != nil) }()
	out, err := v.s.listV1alpha1.do(ctx)
	if err != nil {
		return nil, err
	}
	return preEncoded(&v1alpha1.ListPodResourcesResponse{}, out), nil
}

// listV1alpha1Answer makes one shared v1alpha1 List.
func (s *Server) listV1alpha1Answer(ctx context.Context, started time.Time) ([]byte, error) {
	kubelet, err := s.up.ListV1alpha1(ctx, &v1alpha1.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	out, err := s.listAnswer(ctx, &s.segV1alpha1, kubelet, started, func(seg []byte, p plan) ([]byte, error) {
		var pod v1alpha1.PodResources
		if err := proto.Unmarshal(seg, &pod); err != nil {
			return nil, errNotAPod(err)
		}
		mergeV1alpha1(&pod, p)
		return proto.Marshal(&pod)
	})
	if err != nil {
		s.log.WithError(err).Warn("v1alpha1 List answered with an error")
	}
	return out, err
}

// shareCalls sets up the methods whose kubelet calls concurrent callers
// share (shared.go). The requests of these methods have no fields, so one
// caller's request stands for all.
func (s *Server) shareCalls() {
	s.listV1 = &sharedCall[[]byte]{method: "List", fn: s.listV1Answer, metrics: s.deps.Metrics}
	s.listV1alpha1 = &sharedCall[[]byte]{method: "v1alpha1.List", fn: s.listV1alpha1Answer, metrics: s.deps.Metrics}
	s.allocatable = &sharedCall[*v1.AllocatableResourcesResponse]{method: "GetAllocatableResources", fn: s.allocatableAnswer, metrics: s.deps.Metrics}
}
