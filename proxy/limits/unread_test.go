package limits

import (
	"bytes"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podres-proxy/podres-proxy/metrics"
)

// The DATA bytes of what a server writes are counted however its writes
// cut the frames.
func TestFrameReaderCountsDataPayloadAcrossAnyWrites(t *testing.T) {
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("headers"), EndHeaders: true})
	fr.WriteData(1, false, bytes.Repeat([]byte{1}, 1000))
	fr.WritePing(false, [8]byte{})
	fr.WriteData(3, false, bytes.Repeat([]byte{2}, 70000>>2))
	fr.WriteData(1, true, nil)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("trailers"), EndHeaders: true, EndStream: true})
	wire := out.Bytes()
	const want = 1000 + 70000>>2
	for _, step := range []int{1, 2, 7, 9, 10, 100, 4096, len(wire)} {
		var f frameReader
		var got int64
		for b := wire; len(b) > 0; {
			k := min(step, len(b))
			got += f.data(b[:k])
			b = b[k:]
		}
		if got != want {
			t.Errorf("writes of %d bytes: %d DATA bytes counted, want %d", step, got, want)
		}
	}
}

func TestUnreadRefusesTheClientsThatHoldTooMuch(t *testing.T) {
	u := NewUnread(1000, metrics.New(prometheus.NewRegistry())) // 500 per client
	stuck1, stuck2 := u.track("uid=0,pid=10"), u.track("uid=0,pid=10")
	other := u.track("uid=0,pid=20")
	multus := u.track("uid=0,pid=30")

	stuck1.handed.Add(400)
	if err := u.admit(stuck2); err != nil {
		t.Fatalf("a client within its share: %v", err)
	}
	stuck2.handed.Add(200) // 600 of 500 between its two connections
	if err := u.admit(stuck2); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a client over its share on its other connection: %v, want ResourceExhausted", err)
	}
	other.handed.Add(450) // 1050 of 1000 in all
	if err := u.admit(other); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a client holding unread answers while all hold too much: %v, want ResourceExhausted", err)
	}
	if err := u.admit(multus); err != nil {
		t.Fatalf("a client that read everything was refused for what others hold: %v", err)
	}
	// What a client reads, and what a closed connection held, no longer
	// counts.
	other.sent.Add(450)
	u.forget(stuck1)
	if err := u.admit(stuck2); err != nil {
		t.Fatalf("after its stuck connection closed: %v", err)
	}
}
