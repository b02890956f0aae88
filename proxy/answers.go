package proxy

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/podres-proxy/podres-proxy/proxy/allocator"
	"github.com/podres-proxy/podres-proxy/state"
)

// Answers are reused per pod, not per answer.
//
// Clients such as DCGM exporter and resource-topology-exporter poll List
// every few seconds, and between two polls little changes. Yet the kubelet's
// answer is almost never the same bytes twice: it builds List from its pod
// manager's map of pods and each container's devices from the device
// manager's maps, so the pods (and the ids within a container) come in a new
// order on almost every call. So the proxy reuses work pod by pod:
//
//   - The kubelet's answer stays encoded (rawCodec). A List answer is a
//     sequence of fields; each pod is one length-delimited field 1
//     (pod_resources), in v1 and v1alpha1 alike. listAnswer walks the fields
//     with protowire, decoding nothing: each pod's bytes are a segment.
//   - A segment's output is cached under the segment's bytes, together with
//     the pod's store record and the inventory snapshot it was built from.
//     Records and snapshots are immutable and replaced on every change, so
//     the same pointer means the same content; and while the store's
//     version has not moved, every record is still the one it was, so a
//     steady List does not even look records up. When all three match, the
//     cached output is spliced in as is. This holds because a pod's devices
//     depend on nothing but its own record, its part of the kubelet's answer
//     and the inventory, with one exception: the trust gate weighs a pod's
//     devices against other pods' claims (Gate.Contest), so with the gate
//     on, a pod with devices is reused only while the store's version has
//     not moved at all (segment.withOthers).
//   - Otherwise that pod alone is decoded, given its devices (the same merge
//     Get uses, so List and Get agree) and encoded. Its output is cached only
//     when its devices came from the store: one that needed a /pods read
//     depended on that read too.
//   - Fields that are not pods (a newer kubelet's) are copied through, and
//     a pod's own unknown fields survive its decode and encode.
//
// The answer is then the kubelet's fields, in the kubelet's order, each pod
// replaced by its output: a steady List costs a walk over the bytes, one map
// lookup and one copy per pod, and a pod that changed is rebuilt alone.
// Entries of pods the latest answer no longer lists are dropped, and the
// cache holds at most maxSegmentCacheBytes per List method.

// maxSegmentCacheBytes bounds what one List method's cache holds (the
// kubelet's segments and the proxy's outputs together). Pods past it, on
// nodes with thousands of containers or long cpu_ids lists, are rebuilt on
// every call. Two methods fit well within the daemon's 128 MiB.
const maxSegmentCacheBytes = 8 << 20

// segmentOverhead is about what an entry costs beside its bytes (the map
// slot, the segment and its key's strings), counted against the bound.
const segmentOverhead = 160

// podsField is pod_resources' field number in both List responses, and
// nameField and namespaceField the pod's name and namespace in both
// PodResources messages.
const (
	podsField      protowire.Number = 1
	nameField      protowire.Number = 1
	namespaceField protowire.Number = 2
)

// segmentCache holds the output of each pod segment of one List method.
type segmentCache struct {
	mu    sync.Mutex
	gen   uint64              // bumped by every answer, to tell which entries it listed
	m     map[string]*segment // by the kubelet's segment bytes
	bytes int                 // keys and outputs held
}

// segment is a pod's output and what it was built from.
type segment struct {
	key     state.PodKey
	rec     *state.Record       // the live record the output was built from
	checked uint64              // a store version at which rec was still the pod's live record
	inv     allocator.Inventory // the inventory snapshot it was built with
	out     []byte              // the proxy's segment; nil: the kubelet's, unchanged
	seen    uint64              // the last answer that listed it
	inLen   int                 // the length of the kubelet's segment, its key
	// withOthers: the trust gate weighed its devices against other pods'
	// claims (Gate.Contest), or its shared GPUs' ids depend on their other
	// sharers, so it depends on every record, not only its own, and is
	// valid only at the store version it was built at.
	withOthers bool
}

// size is what an entry counts against maxSegmentCacheBytes.
func (e *segment) size() int {
	return segmentOverhead + e.inLen + len(e.out) + len(e.key.Namespace) + len(e.key.Name)
}

// rebuildFunc decodes one pod segment, adds the plan's devices and encodes it.
type rebuildFunc func(seg []byte, p plan) ([]byte, error)

// listPart is one field of a kubelet List answer: a pod, or something to
// copy through.
type listPart struct {
	field []byte // the whole field, tag included
	pod   []byte // a pod's segment, nil for other fields
	out   []byte // the pod's output
	need  bool   // the pod must be rebuilt
	same  bool   // out is the kubelet's segment: nothing was added
	rec   *state.Record
	key   state.PodKey
}

// listAnswer builds the proxy's List answer from the kubelet's encoded one
// (see the comment at the top of this file). arrived is when the query
// arrived: pods unknown to the store wait for a /pods read started after it.
func (s *Server) listAnswer(ctx context.Context, cache *segmentCache, kubelet encoded, arrived time.Time, rebuild rebuildFunc) ([]byte, error) {
	buf := partsPool.Get().(*[]listPart)
	defer func() {
		clear(*buf) // keep no answer alive through the pool
		partsPool.Put(buf)
	}()
	parts, err := splitList((*buf)[:0], kubelet)
	*buf = parts
	if err != nil {
		return nil, err
	}
	// Read before looking up records, so that a change made meanwhile
	// leaves entries that are checked again next time.
	version := s.deps.Store.Version()
	inv := s.resolver.snapshot()
	cacheable := inv == nil || reflect.TypeOf(inv).Comparable()

	// Reuse what can be reused, under one lock.
	cache.mu.Lock()
	cache.gen++
	gen := cache.gen
	if cache.m == nil {
		cache.m = map[string]*segment{}
	}
	pods, reused := 0, 0
	for i := range parts {
		p := &parts[i]
		if p.pod == nil {
			continue
		}
		pods++
		if e := cache.m[string(p.pod)]; e != nil && sameInventory(e.inv, inv) {
			e.seen = gen
			p.key = e.key
			if e.checked != version && !e.withOthers {
				// The store changed since: is this still the pod's record?
				if rec, ok := s.deps.Store.Live(e.key); ok && rec == e.rec {
					e.checked = version
				}
			}
			if e.checked == version {
				p.out = e.out
				if p.out == nil {
					p.out = p.pod
				}
				reused++
				continue
			}
		}
		p.need = true
	}
	cache.mu.Unlock()

	// Rebuild the others, each pod alone.
	var read []int // pods whose devices need a /pods read
	for i := range parts {
		p := &parts[i]
		if !p.need {
			continue
		}
		if p.key.Name == "" {
			if p.key, err = podKey(p.pod); err != nil {
				return nil, err
			}
		}
		rec, ok := s.deps.Store.Live(p.key)
		if !ok || (len(rec.Devices) > 0 && !s.resolver.vettable(rec)) {
			read = append(read, i)
			continue
		}
		p.rec = rec
		if err := p.rebuild(rebuild, s.resolver.planFor(rec, inv)); err != nil {
			return nil, err
		}
	}
	if len(read) > 0 {
		keys := make([]state.PodKey, len(read))
		for j, i := range read {
			keys[j] = parts[i].key
		}
		plans, _, err := s.resolver.plans(ctx, keys, arrived, inv)
		if err != nil {
			return nil, err
		}
		for j, i := range read {
			if err := parts[i].rebuild(rebuild, plans[j]); err != nil {
				return nil, err
			}
		}
	}
	if rebuilt := pods - reused; rebuilt > 0 || reused > 0 {
		s.deps.Metrics.listPods(reused, rebuilt)
	}

	out := spliceList(parts)
	if cacheable && pods > reused {
		cache.store(parts, inv, version, gen, s.resolver.dependsOnOthers)
	}
	cache.drop(gen, pods)
	return out, nil
}

// rebuild sets a pod's output: the kubelet's segment itself when there is
// nothing to add, so a pod without devices is never decoded.
func (p *listPart) rebuild(rebuild rebuildFunc, pl plan) (err error) {
	if pl.empty() {
		p.out, p.same = p.pod, true
		return nil
	}
	p.out, err = rebuild(p.pod, pl)
	return err
}

// store caches the rebuilt pods that came from the store alone.
func (c *segmentCache) store(parts []listPart, inv allocator.Inventory, version, gen uint64, withOthers func(*state.Record) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range parts {
		p := &parts[i]
		if !p.need || p.rec == nil {
			continue
		}
		e := &segment{key: p.key, rec: p.rec, checked: version, inv: inv, seen: gen, inLen: len(p.pod),
			withOthers: withOthers(p.rec)}
		if !p.same {
			e.out = p.out
		}
		if old := c.m[string(p.pod)]; old != nil {
			c.bytes -= old.size()
		} else if c.bytes+e.size() > maxSegmentCacheBytes {
			continue
		}
		c.m[string(p.pod)] = e
		c.bytes += e.size()
	}
}

// drop forgets the pods that answer gen, of this many pods, did not list:
// they are gone, or changed and cached under their new bytes.
func (c *segmentCache) drop(gen uint64, pods int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) <= pods {
		return
	}
	for k, e := range c.m {
		if e.seen != gen {
			delete(c.m, k)
			c.bytes -= e.size()
		}
	}
}

// partsPool recycles the parts of answers: a List of 500 pods would
// otherwise allocate about 60 KB of them per call.
var partsPool = sync.Pool{New: func() any { return new([]listPart) }}

// splitList appends the fields of an encoded List answer to parts.
func splitList(parts []listPart, b []byte) ([]listPart, error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return parts, malformed(protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return parts, malformed(protowire.ParseError(m))
		}
		p := listPart{field: b[:n+m]}
		if num == podsField && typ == protowire.BytesType {
			p.pod, _ = protowire.ConsumeBytes(b[n : n+m])
			if p.pod == nil {
				p.pod = []byte{} // an empty pod is still a pod
			}
		}
		parts = append(parts, p)
		b = b[n+m:]
	}
	return parts, nil
}

// podKey reads a pod segment's namespace and name.
func podKey(seg []byte) (state.PodKey, error) {
	var k state.PodKey
	for len(seg) > 0 {
		num, typ, n := protowire.ConsumeTag(seg)
		if n < 0 {
			return k, malformed(protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, seg[n:])
		if m < 0 {
			return k, malformed(protowire.ParseError(m))
		}
		if typ == protowire.BytesType && (num == nameField || num == namespaceField) {
			v, _ := protowire.ConsumeBytes(seg[n : n+m])
			if num == nameField {
				k.Name = string(v)
			} else {
				k.Namespace = string(v)
			}
		}
		seg = seg[n+m:]
	}
	return k, nil
}

// spliceList encodes the answer: every field as the kubelet sent it, but
// each pod's output in place of its segment.
func spliceList(parts []listPart) []byte {
	size := 0
	for i := range parts {
		if p := &parts[i]; p.pod == nil {
			size += len(p.field)
		} else {
			size += protowire.SizeTag(podsField) + protowire.SizeBytes(len(p.out))
		}
	}
	out := make([]byte, 0, size)
	for i := range parts {
		p := &parts[i]
		if p.pod == nil {
			out = append(out, p.field...)
			continue
		}
		out = protowire.AppendTag(out, podsField, protowire.BytesType)
		out = protowire.AppendBytes(out, p.out)
	}
	return out
}

// malformed is the error of a kubelet answer that is not valid protobuf,
// as gRPC would have reported had it decoded the answer itself.
func malformed(err error) error {
	return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
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
// proxy can split them into pods without decoding them.
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

// errNotAPod is for rebuildFuncs: a segment that does not decode.
func errNotAPod(err error) error {
	return malformed(fmt.Errorf("a pod of the kubelet's List answer: %w", err))
}
