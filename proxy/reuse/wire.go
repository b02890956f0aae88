package reuse

import (
	"context"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
)

// How List answers cross gRPC without being decoded or copied: the
// kubelet's comes in Encoded, the proxy's goes out as an Answer in pieces.
// Both ways through one Codec; every other message goes through gRPC's own
// protobuf codec.

// Encoded is a message still in its wire form: the kubelet's answer as
// received, before it is decoded (see Codec).
type Encoded []byte

// Answer is an encoded List answer in the pieces it was built from, sent in
// order: runs of the kubelet's own fields (what is not a pod, and pods
// nothing was added to) and the proxy's outputs of the other pods, cached
// or just rebuilt. Nothing writes to the pieces once an Answer is made: they
// are shared with the cache and with every caller of a shared call.
type Answer struct {
	data mem.BufferSlice
}

// Bytes joins the pieces: the answer as one encoded message.
func (a *Answer) Bytes() []byte { return a.data.Materialize() }

// Len is the answer's encoded size.
func (a *Answer) Len() int { return a.data.Len() }

// Splice lays out the answer of parts, split from the kubelet's answer:
// every field as the kubelet sent it, but each pod's output in place of its
// field. Fields that lie next to each other in the kubelet's answer go out
// as one piece. Nothing is copied.
func Splice(kubelet []byte, parts []Part) *Answer {
	bufs := make([]mem.SliceBuffer, 0, len(parts))
	end := -1 // where the last piece ends in the kubelet's answer; -1: it is not the kubelet's
	for i := range parts {
		p := &parts[i]
		if p.Pod != nil && !p.Same {
			bufs = append(bufs, p.Out)
			end = -1
			continue
		}
		if end == p.Off {
			start := end - len(bufs[len(bufs)-1])
			end = p.Off + len(p.Field)
			bufs[len(bufs)-1] = kubelet[start:end:end]
			continue
		}
		bufs = append(bufs, p.Field)
		end = p.Off + len(p.Field)
	}
	// A pointer in an interface costs no allocation; a slice would cost one
	// per piece.
	data := make(mem.BufferSlice, len(bufs))
	for i := range bufs {
		data[i] = &bufs[i]
	}
	return &Answer{data: data}
}

// Codec is the codec of both ends of List, client and server. A kubelet
// answer unmarshalled into an *Encoded is kept as received, so that it can
// be split into pods without decoding it; an *Answer is marshalled as its
// pieces, a mem.BufferSlice, which gRPC's transport writes out frame by
// frame: neither the splice nor gRPC's protobuf codec copies the answer
// into a buffer of its own (together, most of what a steady List cost
// beyond delivering its answer). gRPC only reads the pieces: its transport
// reslices the BufferSlice it is handed, and a mem.SliceBuffer's Ref and
// Free do nothing, so one Answer goes to any number of callers.
// Its name is "proto": calls go out as application/grpc+proto, which gRPC
// servers (the kubelet's among them) read with their protobuf codec, and
// it answers clients that send the same.
type Codec struct{}

var protoCodec = encoding.GetCodecV2(proto.Name)

func (Codec) Name() string { return proto.Name }

func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if a, ok := v.(*Answer); ok {
		return a.data, nil
	}
	return protoCodec.Marshal(v)
}

func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	e, ok := v.(*Encoded)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	*e = data.Materialize()
	return nil
}

// ServeList returns a copy of desc, the description of a PodResourcesLister
// service (v1 or v1alpha1), whose List method answers with list's Answer.
// gRPC's generated handlers return typed messages, which its protobuf codec
// would encode anew; this handler returns the Answer itself, for Codec to
// send as it is. Requests are still decoded (and so checked) as Req, the
// method's request message, and the server's interceptors still run; the
// other methods keep their generated handlers. The server must use Codec
// (grpc.ForceServerCodecV2).
func ServeList[Req any](desc grpc.ServiceDesc, list func(context.Context) (*Answer, error)) *grpc.ServiceDesc {
	fullMethod := "/" + desc.ServiceName + "/List"
	handler := func(ctx context.Context, _ any) (any, error) {
		a, err := list(ctx)
		if err != nil {
			return nil, err // no typed nil: gRPC sends the error as is
		}
		return a, nil
	}
	desc.Methods = slices.Clone(desc.Methods)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName != "List" {
			continue
		}
		desc.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			req := new(Req)
			if err := dec(req); err != nil {
				return nil, err
			}
			if interceptor == nil {
				return handler(ctx, req)
			}
			return interceptor(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: fullMethod}, handler)
		}
	}
	return &desc
}
