package upstream

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
)

// The upstream codec copies each kubelet answer into the storage of the
// method's previous one when it fits, rather than allocating an answer's
// size on every call; a buffer far too large for the answer is not kept.
func TestTheUpstreamCodecReusesTheLastAnswersStorage(t *testing.T) {
	answer := bytes.Repeat([]byte("pod"), 10000)
	data := mem.BufferSlice{mem.SliceBuffer(answer[:16384]), mem.SliceBuffer(answer[16384:])}

	var e Encoded
	if err := (Codec{}).Unmarshal(data, &e); err != nil || !bytes.Equal(e, answer) {
		t.Fatalf("first answer: %v, %d bytes", err, len(e))
	}
	prev := &e[0]
	if err := (Codec{}).Unmarshal(data[:1], &e); err != nil || !bytes.Equal(e, answer[:16384]) {
		t.Fatalf("second answer: %v, %d bytes", err, len(e))
	}
	if &e[0] != prev {
		t.Error("an answer that fits the last one's storage was given new storage")
	}
	small := mem.BufferSlice{mem.SliceBuffer(answer[:100])}
	if err := (Codec{}).Unmarshal(small, &e); err != nil || !bytes.Equal(e, answer[:100]) {
		t.Fatalf("small answer: %v, %d bytes", err, len(e))
	}
	if cap(e) > 2*100+4096 {
		t.Errorf("a 100-byte answer keeps %d bytes of storage", cap(e))
	}
}
