package limits

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/podres-proxy/podres-proxy/metrics"
)

// DefaultMaxUnreadBytes bounds the bytes of answers that clients have not
// read yet, all together; one client process may hold half of it (Unread
// says when a call is refused). An answer stays in the daemon's memory
// until its client reads it (HTTP/2 flow control), so a client that stops
// reading would otherwise grow the daemon until it is killed; bounding the
// bytes rather than the calls in flight lets one connection carry as many
// concurrent calls as its clients make (docs/limits.md).
const DefaultMaxUnreadBytes = 32 << 20

// grpcPrefix is the length of the header gRPC writes before each message:
// a compression flag and a 4-byte length.
const grpcPrefix = 5

// Unread counts, per connection, the answer bytes handed to gRPC and the
// DATA bytes written to the socket; their difference is what the client
// has not read. A call is refused (ResourceExhausted) before it costs
// anything when its client process's connections hold more than half the
// bound, or when all connections together hold more than the bound and its
// own holds some: a connection that has read every answer is never refused
// for what others did not read, so Multus keeps its answers while another
// agent is stuck, and what that costs is bounded by the connection caps
// (each such connection is let one more answer, or one set of concurrent
// calls, which share one answer's bytes).
//
// Counting per call overstates memory when concurrent calls share one
// answer's bytes (package upstream), so the bound is conservative: a
// client that reads its answers holds next to nothing for longer than it
// takes to read them.
type Unread struct {
	max, perClient int64
	metrics        *metrics.Metrics

	mu    sync.Mutex
	conns map[*connBytes]struct{}
}

// NewUnread bounds the unread answer bytes of all connections at max
// (DefaultMaxUnreadBytes when max <= 0), those of one client process at
// half of it, and counts refusals in m.
func NewUnread(max int64, m *metrics.Metrics) *Unread {
	if max <= 0 {
		max = DefaultMaxUnreadBytes
	}
	return &Unread{max: max, perClient: max / 2, metrics: m, conns: map[*connBytes]struct{}{}}
}

// track starts counting the bytes of a new connection of client (a
// peerCred.key, "" when the process is unknown).
func (u *Unread) track(client string) *connBytes {
	c := &connBytes{client: client}
	u.mu.Lock()
	u.conns[c] = struct{}{}
	u.mu.Unlock()
	return c
}

// forget stops counting a closed connection: what it did not read is freed
// with it.
func (u *Unread) forget(c *connBytes) {
	u.mu.Lock()
	delete(u.conns, c)
	u.mu.Unlock()
}

// held returns the unread bytes of client's connections and of all.
func (u *Unread) held(client string) (ofClient, all int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for c := range u.conns {
		n := c.unread()
		all += n
		if c.client == client {
			ofClient += n
		}
	}
	return ofClient, all
}

// Interceptor refuses a call as Unread says, and counts the answer of every
// call it lets through against its connection.
func (u *Unread) Interceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		c := connOf(ctx)
		if c == nil {
			return h(ctx, req)
		}
		if err := u.admit(c); err != nil {
			u.metrics.UnreadRefused()
			return nil, err
		}
		resp, err := h(ctx, req)
		if m, ok := resp.(proto.Message); ok && err == nil {
			c.handed.Add(int64(proto.Size(m)) + grpcPrefix)
		}
		return resp, err
	}
}

func (u *Unread) admit(c *connBytes) error {
	own := c.unread()
	if own == 0 && c.client == "" {
		return nil
	}
	ofClient, all := u.held(c.client)
	switch {
	case c.client != "" && ofClient > u.perClient:
		return status.Errorf(codes.ResourceExhausted,
			"this client's connections hold %d KiB of answers it has not read (at most %d KiB): read them before calling again",
			ofClient>>10, u.perClient>>10)
	case own > 0 && all > u.max:
		return status.Errorf(codes.ResourceExhausted,
			"clients hold %d KiB of answers they have not read (at most %d KiB), %d KiB of them on this connection: read them before calling again",
			all>>10, u.max>>10, own>>10)
	}
	return nil
}

// connOf returns the byte counts of the connection a call came on, or nil
// for a connection the listener did not make (see limitedConn).
func connOf(ctx context.Context) *connBytes {
	if p, ok := peer.FromContext(ctx); ok {
		if c, ok := p.AuthInfo.(peerCred); ok {
			return c.bytes
		}
	}
	return nil
}

// connBytes are one connection's counts.
type connBytes struct {
	client string // its process (peerCred.key); "" when unknown

	// handed is the gRPC message bytes, prefixes included, of the answers
	// given to gRPC to send.
	handed atomic.Int64
	// sent is the DATA frame payload bytes written to the socket, which
	// carry those messages and nothing else.
	sent atomic.Int64

	mu     sync.Mutex // one writer at a time; gRPC has one, but Write may not assume it
	frames frameReader
}

func (c *connBytes) unread() int64 { return max(0, c.handed.Load()-c.sent.Load()) }

// wrote counts what a Write put on the socket.
func (c *connBytes) wrote(b []byte) {
	c.mu.Lock()
	n := c.frames.data(b)
	c.mu.Unlock()
	c.sent.Add(n)
}

// frameReader follows the HTTP/2 frames a server writes (RFC 9113 section
// 4.1: a 9-byte header, the first 3 bytes the payload's length, the 4th its
// type) across Writes of any size, and counts the payload bytes of DATA
// frames. A server's side of a connection is frames from its first byte.
type frameReader struct {
	header  [9]byte
	have    int   // header bytes seen of the frame being read
	payload int64 // payload bytes of the current frame not seen yet
	isData  bool
}

const frameData = 0x0

// data reads b and returns how many of its bytes were DATA payload.
func (f *frameReader) data(b []byte) int64 {
	var n int64
	for len(b) > 0 {
		if f.payload > 0 {
			k := min(f.payload, int64(len(b)))
			if f.isData {
				n += k
			}
			f.payload -= k
			b = b[k:]
			continue
		}
		k := copy(f.header[f.have:], b)
		f.have += k
		b = b[k:]
		if f.have < len(f.header) {
			break
		}
		f.have = 0
		f.payload = int64(binary.BigEndian.Uint32(f.header[:4]) >> 8)
		f.isData = f.header[3] == frameData
	}
	return n
}
