// Package limits bounds what a client of the PodResources server can hold:
// connections, calls in flight, request size, call time, idle time, and its
// share of the kubelet's rate limit. The kubelet trusts its clients; the
// proxy cannot, because it runs under a 128 MiB memory limit and Multus
// waits on it during every CNI ADD, so one buggy or hostile client must not
// be able to starve the others or grow the daemon until it is killed.
package limits

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
)

// The server's limits. The daemon runs under a 128 MiB memory limit and
// Multus waits on it during every CNI ADD, so no client may hold more of it
// than a bounded share: each limit below bounds one way a client (buggy or
// hostile) could pile up memory or goroutines.
const (
	// DefaultMaxConnections bounds open client connections. A node has a
	// handful of long-lived PodResources clients (Multus, DCGM exporter,
	// NFD, RTE, nri-plugins), and during a burst of pod starts one short
	// connection per starting pod (a Kata shim's Get); an idle connection
	// costs about 18 KiB, so 128 cost about 2.3 MiB.
	DefaultMaxConnections = 128
	// MaxStreamsPerConnection bounds the calls one connection has in
	// flight. An answer a client does not read (HTTP/2 window 0) stays in
	// memory until the connection ends; without this bound a client that
	// stops reading while calling List could grow the daemon until it is
	// killed.
	MaxStreamsPerConnection = 8
	// MaxRequestBytes bounds a request. Requests are tiny (a Get names a
	// pod: a namespace of at most 63 bytes and a name of at most 253), so a
	// large one is refused before it reaches a handler or the kubelet.
	MaxRequestBytes = 16 << 10
	// DefaultRequestTimeout bounds every call a client makes without a
	// shorter deadline of its own, /pods read and kubelet call included.
	DefaultRequestTimeout = 15 * time.Second
	// DefaultIdleTimeout closes connections with no call for this long;
	// clients reconnect transparently on their next call.
	DefaultIdleTimeout = 5 * time.Minute
	// maxConnectionAge and its grace period make long-lived connections
	// start over now and then, which ends any connection that slipped past
	// the other limits (a reader stalled forever) within a bounded time.
	maxConnectionAge      = 30 * time.Minute
	maxConnectionAgeGrace = DefaultRequestTimeout + 5*time.Second
	// Keepalive pings from a client no more often than this are fine
	// (grpc-go clients ping at most every 10 s); pinging more often closes
	// the connection, which stops ping floods.
	minClientPingInterval = 5 * time.Second
)

// ServerOptions returns the gRPC server options that put the limits above
// in place: idle closes connections without calls for that long, request
// bounds every call without a sooner deadline of its own, and limit is the
// rate limit (RateLimit), which runs first, so a rejected call costs no
// deadline timer.
func ServerOptions(idle, request time.Duration, limit grpc.UnaryServerInterceptor) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(peerCredentials{}),
		grpc.MaxConcurrentStreams(MaxStreamsPerConnection),
		grpc.MaxRecvMsgSize(MaxRequestBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     idle,
			MaxConnectionAge:      maxConnectionAge,
			MaxConnectionAgeGrace: maxConnectionAgeGrace,
			// Ping a connection silent for a minute, and close it when the
			// ping is not answered: a vanished client frees its connection.
			Time:    time.Minute,
			Timeout: 20 * time.Second,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             minClientPingInterval,
			PermitWithoutStream: true,
		}),
		grpc.ChainUnaryInterceptor(limit, deadline(request)),
	}
}

// deadline returns an interceptor that gives every call a deadline: the
// client's own when it is sooner, else timeout. Handlers then never wait on
// the kubelet or /pods longer than a client could care.
func deadline(timeout time.Duration) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return h(ctx, req)
	}
}

// limitListener caps the connections open at once. A connection over the
// cap is closed as soon as it is accepted, so its client fails at once (and
// retries) instead of waiting unseen in the listen backlog.
type limitListener struct {
	net.Listener
	max      int64
	open     atomic.Int64
	rejected func() // counts a refused connection; may be nil
}

// NewListener caps the connections l has open at once at max; rejected,
// when set, is told of each connection closed over the cap.
func NewListener(l net.Listener, max int, rejected func()) net.Listener {
	return &limitListener{Listener: l, max: int64(max), rejected: rejected}
}

// Accept returns the next connection that fits under the cap.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			if l.rejected != nil {
				l.rejected()
			}
			continue
		}
		return &limitedConn{Conn: c, release: func() { l.open.Add(-1) }}, nil
	}
}

// limitedConn gives its place under the cap back when it is closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Unwrap lets the handshake reach the unix connection beneath.
func (c *limitedConn) Unwrap() net.Conn { return c.Conn }

// peerCred is what the kernel says about the process at the other end of a
// unix socket (SO_PEERCRED): who it is, which no client can forge.
type peerCred struct {
	credentials.CommonAuthInfo
	uid, pid int32
	ok       bool // false when the connection is not a unix socket
}

func (peerCred) AuthType() string { return "peercred" }

// key names the client for the rate limit: its process. Processes of one
// user are told apart, so one misbehaving agent does not take the share of
// another agent running as root too.
func (p peerCred) key() string {
	if !p.ok {
		return ""
	}
	return fmt.Sprintf("uid=%d,pid=%d", p.uid, p.pid)
}

// peerCredentials are transport credentials for unix sockets that add no
// security of their own (the socket's permissions do that) but read the
// peer's credentials at the handshake, for per-client limits.
type peerCredentials struct{}

func (peerCredentials) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	raw := c
	for {
		u, ok := raw.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		raw = u.Unwrap()
	}
	uc, ok := raw.(*net.UnixConn)
	if !ok {
		return c, info, nil
	}
	sc, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *syscall.Ucred
	var credErr error
	if err := sc.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return nil, nil, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return nil, nil, fmt.Errorf("peer credentials (SO_PEERCRED): %w", credErr)
	}
	info.uid, info.pid, info.ok = int32(cred.Uid), cred.Pid, true
	return c, info, nil
}

func (peerCredentials) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p peerCredentials) Clone() credentials.TransportCredentials { return p }

// OverrideServerName is part of TransportCredentials; nothing to override.
func (peerCredentials) OverrideServerName(string) error { return nil }

// clientKey names the caller of ctx for the rate limit; calls whose peer is
// unknown share one key.
func clientKey(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		if c, ok := p.AuthInfo.(peerCred); ok {
			return c.key()
		}
	}
	return ""
}
