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
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"

	"github.com/podres-proxy/podres-proxy/metrics"
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
	// DefaultMaxConnectionsPerClient bounds the connections one client
	// process (see peerCred) holds, under DefaultMaxConnections, so that
	// one process leaking connections (a poller that never closes them)
	// cannot take every place and lock Multus out. Most clients hold one;
	// thick Multus, which runs every pod's CNI ADD in one process, holds
	// one per ADD in flight while pods start in a burst, so the cap leaves
	// it room: a quarter of the total, which leaves three quarters to the
	// others whatever one process does.
	DefaultMaxConnectionsPerClient = 32
	// MaxStreamsPerConnection bounds the calls one connection has in
	// flight: gRPC clients' own default. Many goroutines of one client
	// (DCGM exporter's collectors, a thick Multus's CNI ADDs) share a
	// connection, and calls in flight together share one kubelet call, so
	// a lower bound would cost the kubelet a call per few of them. What
	// those calls hold in memory until read is bounded by Unread.
	MaxStreamsPerConnection = 100
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
// bounds every call without a sooner deadline of its own, unread refuses
// calls of connections that do not read their answers (it runs first, so
// such a call takes no token), and limit is the rate limit (RateLimit),
// which runs next, so a rejected call costs no deadline timer.
func ServerOptions(idle, request time.Duration, unread *Unread, limit grpc.UnaryServerInterceptor) []grpc.ServerOption {
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
		grpc.ChainUnaryInterceptor(unread.Interceptor(), limit, deadline(request)),
		grpc.InTapHandle(stampArrival),
	}
}

// arrivedKey is the context key of a call's arrival (stampArrival).
type arrivedKey struct{}

// stampArrival records when a call reached the server. gRPC runs it on the
// connection's reader as the call's headers are read, before the call has
// a goroutine of its own: on a loaded node a burst of calls can wait a
// hundred milliseconds for their handlers to run, and a call that must be
// answered from a kubelet read started after it arrived (a pod being
// created) would wait for a read started after its handler ran, costing
// the kubelet another read for what one read could answer.
func stampArrival(ctx context.Context, _ *tap.Info) (context.Context, error) {
	return context.WithValue(ctx, arrivedKey{}, time.Now()), nil
}

// Arrived returns when the call of ctx reached the server (stampArrival),
// or now for a context the server did not stamp.
func Arrived(ctx context.Context) time.Time {
	if t, ok := ctx.Value(arrivedKey{}).(time.Time); ok {
		return t
	}
	return time.Now()
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

// limitListener caps the connections open at once, in all and per client
// process. A connection over either cap is closed as soon as it is
// accepted, so its client fails at once (and retries) instead of waiting
// unseen in the listen backlog. Both caps count the connections open now,
// whoever closes them (the client, the idle timeout, the connection age):
// a process whose connections the server closed gets back its own places
// when it reconnects, never anyone else's.
type limitListener struct {
	net.Listener
	max, perClient int
	unread         *Unread
	metrics        *metrics.Metrics

	mu       sync.Mutex
	open     int
	byClient map[string]int // open connections per identified process
}

// NewListener caps the connections l has open at once at max, and those of
// one client process at perClient, counts in m each connection closed over
// a cap, and counts each connection's bytes in unread. A connection whose
// process the kernel does not name (see peerCred.identified) counts against
// max only.
func NewListener(l net.Listener, max, perClient int, unread *Unread, m *metrics.Metrics) net.Listener {
	return &limitListener{Listener: l, max: max, perClient: perClient, unread: unread, metrics: m, byClient: map[string]int{}}
}

// Accept returns the next connection that fits under the caps.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		// An error here (not a unix socket, or the kernel would not say)
		// leaves the connection to the total cap; the handshake reads the
		// credentials again and fails the connection if it still cannot.
		cred, err := readPeerCred(c)
		key := ""
		if err == nil && cred.identified() {
			key = cred.key()
		}
		if !l.take(key) {
			// Counted before the close, so whoever sees the connection
			// closed also sees it counted.
			l.metrics.ConnectionRejected()
			c.Close()
			continue
		}
		bytes := l.unread.track(key)
		lc := &limitedConn{Conn: c, bytes: bytes, release: func() { l.give(key); l.unread.forget(bytes) }}
		if err == nil {
			cred.bytes = bytes
			lc.cred = &cred
		}
		return lc, nil
	}
}

// take reserves a place for a connection of client key ("" for one whose
// process is unknown), if both caps allow it.
func (l *limitListener) take(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open >= l.max || key != "" && l.byClient[key] >= l.perClient {
		return false
	}
	l.open++
	if key != "" {
		l.byClient[key]++
	}
	return true
}

// give frees the place take reserved.
func (l *limitListener) give(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if key != "" {
		if l.byClient[key]--; l.byClient[key] <= 0 {
			delete(l.byClient, key)
		}
	}
}

// limitedConn gives its place under the caps back when it is closed, and
// counts what is written to it (Unread).
type limitedConn struct {
	net.Conn
	cred    *peerCred // read at accept; nil when that failed
	bytes   *connBytes
	once    sync.Once
	release func()
}

func (c *limitedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.bytes.wrote(b[:n])
	return n, err
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
//
// The pid is the peer's in the daemon's PID namespace, and 0 when the peer
// is not in it or a namespace below it: the DaemonSet runs without hostPID,
// so that is every client in another pod or on the host. Such a process is
// then named by its pidfd's inode (SO_PEERPIDFD, on kernels whose pidfds
// live in pidfs, 6.9 and later), which is unique to it for the boot.
type peerCred struct {
	credentials.CommonAuthInfo
	uid, pid int32
	pidfsIno uint64     // the peer's pidfd's inode when pid is 0; 0 when unknown
	ok       bool       // false when the connection is not a unix socket
	bytes    *connBytes // the connection's counts (Unread); nil when not counted
}

func (peerCred) AuthType() string { return "peercred" }

// identified reports whether the kernel named the peer's process, by pid
// or by pidfd, so that its connections can be told from other processes'.
func (p peerCred) identified() bool { return p.ok && (p.pid > 0 || p.pidfsIno != 0) }

// key names the client for the rate limit and the per-client connection
// cap: its process. Processes of one user are told apart, so one
// misbehaving agent does not take the share of another agent running as
// root too. A process the kernel does not name shares its user's key.
func (p peerCred) key() string {
	switch {
	case !p.ok:
		return ""
	case p.pid > 0:
		return fmt.Sprintf("uid=%d,pid=%d", p.uid, p.pid)
	case p.pidfsIno != 0:
		return fmt.Sprintf("uid=%d,pidfs=%d", p.uid, p.pidfsIno)
	}
	return fmt.Sprintf("uid=%d", p.uid)
}

// peerCredentials are transport credentials for unix sockets that add no
// security of their own (the socket's permissions do that) but read the
// peer's credentials at the handshake, for per-client limits.
type peerCredentials struct{}

func (peerCredentials) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCredentials) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if lc, ok := c.(*limitedConn); ok && lc.cred != nil {
		return c, *lc.cred, nil
	}
	info, err := readPeerCred(c)
	if err != nil {
		return nil, nil, err
	}
	return c, info, nil
}

// readPeerCred reads the credentials of the process at the other end of c;
// a connection that is not a unix socket has none (ok false).
func readPeerCred(c net.Conn) (peerCred, error) {
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
		return info, nil
	}
	sc, err := uc.SyscallConn()
	if err != nil {
		return info, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := sc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if credErr == nil && cred.Pid == 0 {
			info.pidfsIno = pidfsInode(int(fd))
		}
	}); err != nil {
		return info, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return info, fmt.Errorf("peer credentials (SO_PEERCRED): %w", credErr)
	}
	info.uid, info.pid, info.ok = int32(cred.Uid), cred.Pid, true
	return info, nil
}

// pidfsInode returns the inode of a pidfd of the peer of socket fd, which
// names its process uniquely where pidfds live in pidfs; 0 where they do
// not (older kernels, where every pidfd shares one anonymous inode) or
// the kernel gives none.
func pidfsInode(fd int) uint64 {
	pidfd, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return 0
	}
	defer unix.Close(pidfd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(pidfd, &fs); err != nil || fs.Type != unix.PID_FS_MAGIC {
		return 0
	}
	var st unix.Stat_t
	if err := unix.Fstat(pidfd, &st); err != nil {
		return 0
	}
	return st.Ino
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
