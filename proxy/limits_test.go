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
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/proxy/limits"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/poll"
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

// TestClientThatStopsReadingIsRefusedOnceItHoldsItsShare opens one HTTP/2
// connection that announces a receive window of 0 (it reads no answer) and
// calls List on it, one call after another, with answers of about 6 MiB.
// Each answer it does not read stays in the daemon's memory, so once its
// unread answers pass its share (limits.Unread) its calls are refused with
// ResourceExhausted, before they cost a kubelet call; once it reads them,
// it is answered again.
func TestClientThatStopsReadingIsRefusedOnceItHoldsItsShare(t *testing.T) {
	h := newHarness(t)
	h.k.SetPods(largeAnswerPods()...)
	size := proto.Size(h.list())
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
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	id := uint32(1)
	// call starts a List on a new stream and returns its gRPC status: OK
	// when the server answered with headers and a body (which stays
	// unread), else the status of its trailers-only refusal.
	call := func() *status.Status {
		t.Helper()
		id += 2
		hb.Reset()
		for _, f := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":authority", "localhost"},
			{":path", "/" + v1.PodResourcesLister_List_FullMethodName[1:]},
			{"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		// An empty ListPodResourcesRequest: not compressed, length 0.
		if err := fr.WriteData(id, true, []byte{0, 0, 0, 0, 0}); err != nil {
			t.Fatal(err)
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("call on stream %d: %v", id, err)
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					fr.WriteSettingsAck()
				}
			case *http2.MetaHeadersFrame:
				if f.StreamID != id {
					continue
				}
				code := f.PseudoValue("status")
				if v := headerField(f, "grpc-status"); v != "" {
					var c int
					fmt.Sscan(v, &c)
					return status.New(codes.Code(c), headerField(f, "grpc-message"))
				} else if code != "200" {
					t.Fatalf("stream %d: HTTP status %s", id, code)
				}
				return status.New(codes.OK, "")
			case *http2.RSTStreamFrame:
				t.Fatalf("stream %d reset with %v", f.StreamID, f.ErrCode)
			case *http2.GoAwayFrame:
				t.Fatalf("server sent GOAWAY %v", f.ErrCode)
			}
		}
	}
	calls := h.k.GRPCCalls()
	answered := 0
	var refusal *status.Status
	for range 64 {
		if st := call(); st.Code() != codes.OK {
			refusal = st
			break
		}
		answered++
	}
	share := limits.DefaultMaxUnreadBytes / 2
	switch {
	case refusal == nil:
		t.Fatalf("a client that reads nothing was answered 64 times %d bytes, %d MiB unread", size, 64*size>>20)
	case refusal.Code() != codes.ResourceExhausted || !strings.Contains(refusal.Message(), "not read"):
		t.Fatalf("refusal after %d answers: %v, want ResourceExhausted naming the unread answers", answered, refusal.Err())
	case answered == 0 || (answered-1)*size > share:
		t.Fatalf("a client that reads nothing was answered %d times %d bytes before a refusal, want the answers up to its share of %d MiB and one more", answered, size, share>>20)
	}
	if got := h.k.GRPCCalls() - calls; got != int64(answered) {
		t.Errorf("%d answered calls cost %d kubelet calls; a refused call must cost none", answered, got)
	}
	t.Logf("answered %d calls of %d KiB unread, then: %v", answered, size>>10, refusal.Err())

	// Reading its answers makes it a client like any other.
	if err := fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteWindowUpdate(0, 1<<30); err != nil {
		t.Fatal(err)
	}
	for ended := 0; ended < answered; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answers: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				ended++
			}
		}
	}
	if st := call(); st.Code() != codes.OK {
		t.Fatalf("after reading its answers: %v", st.Err())
	}
}

// headerField returns the value of the header field name in f, "" when
// there is none.
func headerField(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// largeAnswerPods are pods whose List answer is about 6 MiB: more than
// gRPC's default message size, and a third of a client's unread share.
func largeAnswerPods() []fk.Pod {
	var pods []fk.Pod
	long := strings.Repeat("x", 200)
	for i := range 300 {
		var ids []string
		for j := range 100 {
			ids = append(ids, fmt.Sprintf("%s-%d-%d", long, i, j))
		}
		pods = append(pods, fk.NewPod("default", fmt.Sprintf("big-%d", i), fmt.Sprintf("uid-%d", i),
			fk.WithKubeletDevices("app", "example.com/dev", -1, ids...)))
	}
	return pods
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
