// Package upstream is the PodResources server's client of the kubelet's
// PodResources API: one connection, made lazily and remade when the kubelet
// restarts, every call bounded in time and its latency recorded, the
// kubelet's codes and messages passed through untouched (they are part of
// the API). Concurrent callers of a method share its kubelet calls (Shared),
// because the kubelet's limit of 100 calls a second is shared with every
// other agent on the node.
package upstream

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/internal/unixsock"
	"github.com/podres-proxy/podres-proxy/metrics"
)

// DefaultMaxMessageSize bounds the kubelet answers the proxy accepts. Busy
// nodes already exceed gRPC's 4 MiB default; clients conventionally accept
// 16 MiB, and the proxy must never be the first to fail.
const DefaultMaxMessageSize = 64 << 20

// Client is the connection to the kubelet's PodResources socket. The
// connection is made lazily and remade by gRPC when the kubelet restarts
// (its socket is replaced by a new inode); a missing socket makes calls fail
// fast with Unavailable instead of stopping the daemon.
type Client struct {
	conn    *grpc.ClientConn
	v1      v1.PodResourcesListerClient
	metrics *metrics.Metrics
	timeout time.Duration // bounds calls whose context has no sooner deadline
}

// New prepares the client of the kubelet's socket (a path or unix:// URL);
// nothing is dialled until the first call. maxMsg bounds answers (<= 0:
// DefaultMaxMessageSize), and timeout every call whose context has no
// sooner deadline.
func New(socket string, maxMsg int, timeout time.Duration, m *metrics.Metrics) (*Client, error) {
	target, err := unixsock.Target(socket)
	if err != nil {
		return nil, fmt.Errorf("kubelet socket: %w", err)
	}
	if maxMsg <= 0 {
		maxMsg = DefaultMaxMessageSize
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg)),
		// gRPC's default reconnect backoff grows to two minutes; the kubelet
		// usually restarts in seconds and clients retry on their own, so the
		// proxy should notice within a second or two.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: 2 * time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("kubelet socket %s: %w", socket, err)
	}
	return &Client{
		conn:    conn,
		v1:      v1.NewPodResourcesListerClient(conn),
		metrics: m,
		timeout: timeout,
	}, nil
}

// Close closes the connection.
func (u *Client) Close() error { return u.conn.Close() }

// bound gives a kubelet call a deadline when ctx has none sooner: a kubelet
// that accepts a call and never answers must not hold a handler forever.
func (u *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if u.timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, u.timeout)
}

// observe records an upstream call's latency and passes its error through
// untouched: the kubelet's own codes and messages are part of the API.
func (u *Client) observe(method string, start time.Time, err error) error {
	u.metrics.Upstream(method, status.Code(err), time.Since(start))
	return err
}

// API is one version of the List method: v1 or v1alpha1. Their requests
// are the same empty message, and their answers are split alike (package
// reuse), so one call serves both.
type API struct {
	method string // the gRPC method
	Name   string // how metrics and logs name it
}

// The List methods.
var (
	V1       = API{method: v1.PodResourcesLister_List_FullMethodName, Name: "List"}
	V1alpha1 = API{method: v1alpha1.PodResourcesLister_List_FullMethodName, Name: "v1alpha1.List"}
)

// List returns the kubelet's List answer of api still Encoded (see
// Codec), in buf's storage when it fits: buf must not be in use.
func (u *Client) List(ctx context.Context, api API, buf Encoded) (Encoded, error) {
	ctx, cancel := u.bound(ctx)
	defer cancel()
	start := time.Now()
	resp := buf
	err := u.conn.Invoke(ctx, api.method, &v1.ListPodResourcesRequest{}, &resp, grpc.ForceCodecV2(Codec{}))
	return resp, u.observe(api.Name, start, err)
}

// GetAllocatableResources returns the kubelet's answer.
func (u *Client) GetAllocatableResources(ctx context.Context, req *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	ctx, cancel := u.bound(ctx)
	defer cancel()
	start := time.Now()
	resp, err := u.v1.GetAllocatableResources(ctx, req)
	return resp, u.observe("GetAllocatableResources", start, err)
}
