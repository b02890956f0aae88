package proxy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/internal/poll"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
)

// hangGuard bounds how long a test waits for an event that a broken limit
// would never produce; it fails the test rather than hang it. It measures
// nothing.
const hangGuard = 30 * time.Second

func TestOversizedRequestIsRefusedBeforeTheKubelet(t *testing.T) {
	h := newHarness(t)
	name := strings.Repeat("x", 1<<20)
	_, err := h.v1().Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "default", PodName: name})
	if status.Code(err) != codes.ResourceExhausted {
		msg := status.Convert(err).Message()
		if len(msg) > 120 {
			msg = fmt.Sprintf("%s... (%d bytes)", msg[:120], len(msg))
		}
		t.Fatalf("Get with a 1 MiB pod name: got %v %q, want ResourceExhausted", status.Code(err), msg)
	}
	if n := h.k.GRPCCalls(); n != 0 {
		t.Errorf("the oversized request reached the kubelet (%d calls)", n)
	}
	// An ordinary request still works on the same server.
	if _, err := h.v1().List(ctx(t), &v1.ListPodResourcesRequest{}); err != nil {
		t.Fatalf("List after the oversized Get: %v", err)
	}
}

func TestCallWithoutDeadlineIsBoundedWhenTheKubeletHangs(t *testing.T) {
	h := newHarness(t, withRequestTimeout(200*time.Millisecond))
	release := h.k.HoldGRPC()
	defer release()
	errc := make(chan error, 1)
	go func() {
		// No deadline of its own: the proxy's is all that ends it.
		_, err := h.v1().List(context.Background(), &v1.ListPodResourcesRequest{})
		errc <- err
	}()
	select {
	case err := <-errc:
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("List against a hung kubelet: got %v, want DeadlineExceeded", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("List against a hung kubelet never returned: no deadline on the handler")
	}
}

func TestConnectionsOverTheCapAreClosedAndServingGoesOn(t *testing.T) {
	const max = 4
	h := newHarness(t, withMaxConnections(max))
	// Idle connections that never even say hello, up to the cap...
	var idle []net.Conn
	for range max {
		c, err := net.Dial("unix", h.socket)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	// ...and one over it, which the server must close rather than keep.
	over, err := net.Dial("unix", h.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := over.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("connection over the cap of %d: read got %v, want EOF (closed by the server)", max, err)
	}
	if h.counter("podres_proxy_connections_rejected_total") < 1 {
		t.Error("connections_rejected_total not counted")
	}
	// Closing the idle ones frees their places for a real client.
	for _, c := range idle {
		c.Close()
	}
	poll.Until(t, "a call to succeed after the idle connections closed", func() bool {
		_, err := h.v1().List(ctx(t), &v1.ListPodResourcesRequest{})
		return err == nil
	})
}

// TestClientThatStopsReadingHoldsOnlyAFewCalls opens one HTTP/2 connection
// that announces a receive window of 0 (it never reads an answer) and
// starts many List calls on it. Each answer it does not read stays in the
// daemon's memory until the connection ends, so only a few calls may be
// taken on; the rest must be refused (RST_STREAM REFUSED_STREAM).
func TestClientThatStopsReadingHoldsOnlyAFewCalls(t *testing.T) {
	h := newHarness(t)
	conn, err := net.Dial("unix", h.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(hangGuard))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	const calls = 64
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for i := range calls {
		hb.Reset()
		for _, f := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":authority", "localhost"},
			{":path", "/" + v1.PodResourcesLister_List_FullMethodName[1:]},
			{"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		id := uint32(2*i + 1)
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		// An empty ListPodResourcesRequest: not compressed, length 0.
		if err := fr.WriteData(id, true, []byte{0, 0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
	}
	answered, refused := map[uint32]bool{}, map[uint32]bool{}
	for len(answered)+len(refused) < calls {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d answered and %d refused calls: %v", len(answered), len(refused), err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			answered[f.StreamID] = true
		case *http2.RSTStreamFrame:
			if f.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("stream %d reset with %v, want REFUSED_STREAM", f.StreamID, f.ErrCode)
			}
			refused[f.StreamID] = true
		case *http2.GoAwayFrame:
			t.Fatalf("server sent GOAWAY %v after %d answered calls", f.ErrCode, len(answered))
		}
	}
	if len(answered) > limits.MaxStreamsPerConnection {
		t.Fatalf("a client that reads nothing had %d calls taken on at once, want at most %d (%d refused)",
			len(answered), limits.MaxStreamsPerConnection, len(refused))
	}
}

func TestIdleConnectionsAreClosedByTheServer(t *testing.T) {
	h := newHarness(t, withIdleTimeout(100*time.Millisecond))
	c := h.conn()
	if _, err := v1.NewPodResourcesListerClient(c).List(ctx(t), &v1.ListPodResourcesRequest{}); err != nil {
		t.Fatal(err)
	}
	// The server's GOAWAY makes the client's connection leave READY; the
	// client itself never goes idle sooner than its own 30 min default.
	wait, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for s := c.GetState(); s == connectivity.Ready; s = c.GetState() {
		if !c.WaitForStateChange(wait, s) {
			t.Fatal("an idle connection was never closed by the server")
		}
	}
	// The next call reconnects transparently.
	if _, err := v1.NewPodResourcesListerClient(c).List(ctx(t), &v1.ListPodResourcesRequest{}); err != nil {
		t.Fatalf("List after the idle close: %v", err)
	}
}
