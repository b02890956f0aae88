package reuse

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// The server's codec must send every message as protobuf would, and a
// PreEncoded answer as the very bytes it was given: no copy into gRPC's
// buffer pool (whose sizes jump from 32 KiB to 1 MiB).

func TestTheServerCodecSendsAPreEncodedAnswerAsItsBytes(t *testing.T) {
	pod, err := proto.Marshal(&v1.PodResources{Name: "a", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	wire := bytes.Repeat(append([]byte{0x0a, byte(len(pod))}, pod...), 2000) // ~20 KB
	msg := PreEncoded(&v1.ListPodResourcesResponse{}, wire)
	got, err := ServerCodec{}.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	want, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Materialize(), want) {
		t.Fatal("the codec's bytes differ from protobuf's")
	}
	if len(got) != 1 || &got[0].ReadOnlyData()[0] != &wire[0] {
		t.Error("the answer was copied on its way to gRPC")
	}
}

func TestTheServerCodecMarshalsOtherMessagesAsProtobufDoes(t *testing.T) {
	for _, m := range []proto.Message{
		&v1.ListPodResourcesResponse{},
		&v1.GetPodResourcesResponse{PodResources: &v1.PodResources{Name: "a"}},
		// Known fields and unknown ones: not only its unknown fields.
		PreEncoded(&v1.ListPodResourcesResponse{PodResources: []*v1.PodResources{{Name: "b"}}}, []byte{0x3a, 0x01, 0x78}),
	} {
		got, err := ServerCodec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Materialize(), want) {
			t.Errorf("%T %v: the codec's bytes differ from protobuf's", m, m)
		}
	}
	if _, err := (ServerCodec{}).Marshal("not a message"); err == nil {
		t.Error("a value that is not a message was marshalled")
	}
}
