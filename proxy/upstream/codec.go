package upstream

import (
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// Encoded is a message still in its wire form: the kubelet's answer as
// received, before it is decoded (see Codec).
type Encoded []byte

// Codec is the codec of the upstream List calls. Requests are marshalled
// by gRPC's own protobuf codec; responses are kept Encoded, so that the
// proxy can split them into pods without decoding them.
// Its name is "proto": the calls go out as application/grpc+proto, which
// gRPC servers (the kubelet's among them) read with their protobuf codec.
type Codec struct{}

var protoCodec = encoding.GetCodecV2(proto.Name)

func (Codec) Name() string { return proto.Name }

func (Codec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

// Unmarshal copies the answer into the Encoded it is given, reusing its
// storage when it fits (and is not more than twice too large): the proxy
// makes one kubelet List call at a time per method (Shared) and
// keeps nothing of an answer once its own is built, so each method reuses
// one buffer rather than allocating an answer's size on every call.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	e, ok := v.(*Encoded)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	n := data.Len()
	if cap(*e) < n || cap(*e) > 2*n+4096 {
		*e = make(Encoded, n)
	}
	*e = (*e)[:n]
	data.CopyTo(*e)
	return nil
}
