package proxy

import (
	"bytes"
	"reflect"
	"sync/atomic"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/podres-proxy/podres-proxy/proxy/allocator"
)

// Clients such as DCGM exporter and resource-topology-exporter poll List
// every few seconds, and between two polls nothing usually changes: the
// kubelet answers the same bytes and the store and the inventory are the
// same. The proxy then answers with the bytes it encoded last time instead
// of decoding the kubelet's answer, attributing devices, merging and
// encoding again, which would otherwise cost about as much as the gRPC calls
// themselves (README, Performance).

// maxCachedAnswer bounds the memory one cached answer may hold (the
// kubelet's answer and the proxy's together). Larger answers, from nodes
// with thousands of containers or long cpu_ids lists, are rebuilt on every
// call, as every answer was before the cache.
const maxCachedAnswer = 8 << 20

// answerCache holds the last answer of one List method.
type answerCache struct {
	last atomic.Pointer[cachedAnswer]
}

// cachedAnswer is immutable once stored.
type cachedAnswer struct {
	kubelet []byte              // the kubelet's encoded answer
	store   uint64              // the store's Version when the answer was built
	inv     allocator.Inventory // the inventory snapshot it was built with
	out     []byte              // the proxy's encoded answer
}

// lookup returns the encoded answer built from the same kubelet answer,
// store version and inventory snapshot, if it is the last one built.
func (c *answerCache) lookup(kubelet []byte, store uint64, inv allocator.Inventory) ([]byte, bool) {
	a := c.last.Load()
	if a == nil || a.store != store || !sameInventory(a.inv, inv) || !bytes.Equal(a.kubelet, kubelet) {
		return nil, false
	}
	return a.out, true
}

func (c *answerCache) put(kubelet []byte, store uint64, inv allocator.Inventory, out []byte) {
	if len(kubelet)+len(out) > maxCachedAnswer || (inv != nil && !reflect.TypeOf(inv).Comparable()) {
		c.last.Store(nil)
		return
	}
	c.last.Store(&cachedAnswer{kubelet: kubelet, store: store, inv: inv, out: out})
}

// sameInventory compares snapshots by identity: snapshots are immutable and
// replaced on every change.
func sameInventory(a, b allocator.Inventory) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// encoded is a message still in its wire form: the kubelet's answer as
// received, before it is decoded (see rawCodec).
type encoded []byte

// rawCodec is the codec of the upstream List calls. Requests are marshalled
// by gRPC's own protobuf codec; responses are kept encoded, so that the
// proxy can tell an answer identical to the last one by comparing bytes.
// Its name is "proto": the calls go out as application/grpc+proto, which
// gRPC servers (the kubelet's among them) read with their protobuf codec.
type rawCodec struct{}

var protoCodec = encoding.GetCodecV2(proto.Name)

func (rawCodec) Name() string { return proto.Name }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) { return protoCodec.Marshal(v) }

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	e, ok := v.(*encoded)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	*e = data.Materialize()
	return nil
}

// preEncoded turns an empty response message into one that gRPC sends as
// the given wire bytes: protobuf writes a message's unknown fields out
// verbatim, and a message with no known fields set is nothing else. This is
// how a handler generated for a typed response returns bytes it already
// encoded, without registering its own copy of the service.
func preEncoded[M interface{ ProtoReflect() protoreflect.Message }](m M, wire []byte) M {
	m.ProtoReflect().SetUnknown(wire)
	return m
}
