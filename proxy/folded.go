package proxy

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/proxy/limits"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
)

// Folder edits the answers of a view served on a socket of its own: the
// legacy view (package dra) folds DRA devices of extended resources into
// `devices` for consumers that read nothing else. Its methods edit the
// decoded answer in place and never fail it: what cannot be folded stays
// as the default socket answers it.
type Folder interface {
	// FoldList edits the pods of one List answer.
	FoldList(ctx context.Context, pods []*v1.PodResources)
	// FoldPod edits the pod of one Get answer.
	FoldPod(ctx context.Context, pod *v1.PodResources)
	// Allocatable edits one GetAllocatableResources answer.
	Allocatable(resp *v1.AllocatableResourcesResponse)
}

// ServeFolded serves, on socket, the answers Serve gives, each edited by f,
// until ctx is done. It shares Serve's kubelet calls and answers (a
// folded List decodes the default List's answer and edits it), and has
// the same limits. v1alpha1 List is answered as on the default socket: it
// has no dynamic_resources to fold from. Call it alongside Serve.
func (s *Server) ServeFolded(ctx context.Context, socket string, f Folder) error {
	if socket == s.cfg.Socket {
		return fmt.Errorf("the folded view's socket %s is the default socket: a consumer reading both devices and dynamic_resources there would see DRA devices twice", socket)
	}
	limit := limits.RateLimit(s.cfg.RateLimitQPS, s.cfg.RateLimitBurst, s.p.Metrics, nil, func(string) bool { return true })
	opts := append(limits.ServerOptions(s.cfg.IdleTimeout, s.cfg.RequestTimeout, limit), grpc.ForceServerCodecV2(reuse.ServerCodec{}))
	srv := grpc.NewServer(opts...)
	v1.RegisterPodResourcesListerServer(srv, &foldedV1Server{v: &v1Server{s: s, v: s.views[0]}, f: f})
	v1alpha1.RegisterPodResourcesListerServer(srv, &v1alpha1Server{s: s, v: s.views[0]})

	l, err := listenSocket(socket, s.cfg.KubeletSocket)
	if err != nil {
		return err
	}
	s.log.WithField("socket", socket).Info("serving the PodResources API's folded view")
	errc := make(chan error, 1)
	go func() {
		errc <- srv.Serve(limits.NewListener(l, s.cfg.MaxConnections, s.cfg.MaxConnectionsPerClient, s.p.Metrics))
	}()
	select {
	case err := <-errc:
		l.Close()
		return fmt.Errorf("serve the folded view on %s: %w", socket, err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		srv.Stop()
		<-stopped
	}
	<-errc
	return l.Close()
}

// foldedV1Server serves v1 on the folded view's socket: the default
// socket's answers, edited by the Folder.
type foldedV1Server struct {
	v1.UnimplementedPodResourcesListerServer
	v *v1Server
	f Folder
}

func (fv *foldedV1Server) List(ctx context.Context, _ *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	answers, err := fv.v.s.listV1.shared.Do(ctx)
	if err != nil {
		return nil, err
	}
	out, err := answers.of(fv.v.s.views[0])
	if err != nil {
		return nil, err
	}
	resp := &v1.ListPodResourcesResponse{}
	if err := proto.Unmarshal(out, resp); err != nil {
		return nil, fmt.Errorf("decoding the List answer to fold it: %w", err)
	}
	fv.f.FoldList(ctx, resp.GetPodResources())
	return resp, nil
}

func (fv *foldedV1Server) Get(ctx context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	resp, err := fv.v.Get(ctx, req)
	if err != nil {
		return nil, err
	}
	fv.f.FoldPod(ctx, resp.GetPodResources())
	return resp, nil
}

func (fv *foldedV1Server) GetAllocatableResources(ctx context.Context, req *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	resp, err := fv.v.GetAllocatableResources(ctx, req)
	if err != nil {
		return nil, err
	}
	// The answer is shared with the default socket's callers: edit a copy.
	resp = proto.Clone(resp).(*v1.AllocatableResourcesResponse)
	fv.f.Allocatable(resp)
	return resp, nil
}
