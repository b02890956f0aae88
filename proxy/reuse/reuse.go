package reuse

import (
	"bytes"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
)

// MaxCacheBytes bounds what one List method's cache holds (the
// kubelet's segments and the proxy's outputs together). Pods past it, on
// nodes with thousands of containers or long cpu_ids lists, are rebuilt on
// every call. Two methods fit well within the daemon's 128 MiB.
const MaxCacheBytes = 8 << 20

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

// Cache holds the output of each pod segment of one List method.
type Cache struct {
	mu    sync.Mutex
	gen   uint64              // bumped by every answer, to tell which entries it listed
	m     map[string]*segment // by the kubelet's segment bytes, in canonical order
	bytes int                 // keys and outputs held
	// scratch holds the canonical form of the segment being looked up.
	scratch []byte
	// lastLen is the length of the last answer Steady built: the next one
	// is about as long.
	lastLen int
}

// segment is a pod's output and what it was built from.
type segment struct {
	key     model.PodKey
	plan    *plans.Plan  // the plan the output was built with; nil: none
	checked *plans.Table // a table in which plan was still the pod's
	out     []byte       // the proxy's segment; nil: the kubelet's, unchanged
	seen    uint64       // the last answer that listed it
	inLen   int          // the length of the kubelet's segment, its key
}

// size is what an entry counts against MaxCacheBytes.
func (e *segment) size() int {
	return segmentOverhead + e.inLen + len(e.out) + len(e.key.Namespace) + len(e.key.Name)
}

// Part is one field of a kubelet List answer: a pod, or something to
// copy through.
type Part struct {
	Field []byte      // the whole field, tag included
	Pod   []byte      // a pod's segment, nil for other fields
	Canon []byte      // the segment in canonical order (canonicalKey), when it is not
	Out   []byte      // the pod's output
	Need  bool        // the pod must be rebuilt
	Same  bool        // Out is the kubelet's segment: nothing was added
	Plan  *plans.Plan // the plan Out was built with
	Key   model.PodKey
}

// Resolve returns the plan a pod is answered with from a table alone, and
// false when the table cannot say (resolve.Query.TablePlan).
type Resolve func(model.PodKey) (*plans.Plan, bool)

// Store caches the rebuilt pods. Each is checked against the table at its
// first reuse: a pod whose plan needed a kubelet read is reused only once
// the plans alone give it the same plan.
func (c *Cache) Store(parts []Part, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range parts {
		p := &parts[i]
		if !p.Need {
			continue
		}
		e := &segment{key: p.Key, plan: p.Plan, seen: gen, inLen: len(p.Pod)}
		if !p.Same {
			e.out = p.Out
		}
		key := p.Pod
		if p.Canon != nil {
			key = p.Canon
		}
		if old := c.m[string(key)]; old != nil {
			c.bytes -= old.size()
		} else if c.bytes+e.size() > MaxCacheBytes {
			continue
		}
		c.m[string(key)] = e
		c.bytes += e.size()
	}
}

// Drop forgets the pods that answer gen, of this many pods, did not list:
// they are gone, or changed and cached under their new bytes.
func (c *Cache) Drop(gen uint64, pods int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked(gen, pods)
}

// dropLocked is Drop with c.mu held.
func (c *Cache) dropLocked(gen uint64, pods int) {
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

// PartsPool recycles the parts of answers: a List of 500 pods would
// otherwise allocate about 60 KB of them per call.
var PartsPool = sync.Pool{New: func() any { return new([]Part) }}

// Split appends the fields of an Encoded List answer to parts.
func Split(parts []Part, b []byte) ([]Part, error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return parts, Malformed(protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return parts, Malformed(protowire.ParseError(m))
		}
		p := Part{Field: b[:n+m]}
		if num == podsField && typ == protowire.BytesType {
			p.Pod, _ = protowire.ConsumeBytes(b[n : n+m])
			if p.Pod == nil {
				p.Pod = []byte{} // an empty pod is still a pod
			}
		}
		parts = append(parts, p)
		b = b[n+m:]
	}
	return parts, nil
}

// podKey reads a pod segment's namespace and name.
func PodKey(seg []byte) (model.PodKey, error) {
	var k model.PodKey
	for len(seg) > 0 {
		num, typ, n := protowire.ConsumeTag(seg)
		if n < 0 {
			return k, Malformed(protowire.ParseError(n))
		}
		m := protowire.ConsumeFieldValue(num, typ, seg[n:])
		if m < 0 {
			return k, Malformed(protowire.ParseError(m))
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

// Splice encodes the answer: every field as the kubelet sent it, but
// each pod's output in place of its segment.
func Splice(parts []Part) []byte {
	size := 0
	for i := range parts {
		if p := &parts[i]; p.Pod == nil {
			size += len(p.Field)
		} else {
			size += protowire.SizeTag(podsField) + protowire.SizeBytes(len(p.Out))
		}
	}
	out := make([]byte, 0, size)
	for i := range parts {
		p := &parts[i]
		if p.Pod == nil {
			out = append(out, p.Field...)
			continue
		}
		out = protowire.AppendTag(out, podsField, protowire.BytesType)
		out = protowire.AppendBytes(out, p.Out)
	}
	return out
}

// malformed is the error of a kubelet answer that is not valid protobuf,
// as gRPC would have reported had it decoded the answer itself.
func Malformed(err error) error {
	return status.Errorf(codes.Internal, "grpc: failed to unmarshal the received message: %v", err)
}

// PreEncoded turns an empty response message into one that gRPC sends as
// the given wire bytes: protobuf writes a message's unknown fields out
// verbatim, and a message with no known fields set is nothing else. This is
// how a handler generated for a typed response returns bytes it already
// Encoded, without registering its own copy of the service.
func PreEncoded[M interface{ ProtoReflect() protoreflect.Message }](m M, wire []byte) M {
	m.ProtoReflect().SetUnknown(wire)
	return m
}

// ServerCodec is the codec of the proxy's server: gRPC's protobuf codec,
// except that a message with no known field set, such as one PreEncoded
// made, is sent as its unknown fields, neither sized nor copied. Protobuf
// writes such a message as exactly those bytes, so what clients receive is
// the same; but gRPC's codec copies every answer into a buffer of its pool,
// whose sizes jump from 32 KiB to 1 MiB: a List answer of a busy node
// would take a 1 MiB buffer per call in flight.
type ServerCodec struct{}

var protoCodec = encoding.GetCodecV2(proto.Name)

func (ServerCodec) Name() string { return proto.Name }

func (ServerCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(interface{ ProtoReflect() protoreflect.Message }); ok {
		r := m.ProtoReflect()
		if u := r.GetUnknown(); len(u) > 0 && !anySet(r) {
			return mem.BufferSlice{mem.SliceBuffer(u)}, nil
		}
	}
	return protoCodec.Marshal(v)
}

func (ServerCodec) Unmarshal(data mem.BufferSlice, v any) error { return protoCodec.Unmarshal(data, v) }

// anySet reports whether a known field of m is set.
func anySet(m protoreflect.Message) bool {
	set := false
	m.Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool {
		set = true
		return false
	})
	return set
}

// ErrNotAPod is for rebuildFuncs: a segment that does not decode.
func ErrNotAPod(err error) error {
	return Malformed(fmt.Errorf("a pod of the kubelet's List answer: %w", err))
}

// Reuse fills in the output of every pod of parts whose segment is that of
// a cached output built with the plan table t gives the pod, marks the
// others Need, and returns the answer's generation (for Store and Drop),
// how many pods parts holds and how many were reused. resolve looks a
// pod's plan up in t.
func (c *Cache) Reuse(parts []Part, t *plans.Table, resolve Resolve) (gen uint64, pods, reused int) {
	c.mu.Lock()
	c.gen++
	gen = c.gen
	if c.m == nil {
		c.m = map[string]*segment{}
	}
	for i := range parts {
		p := &parts[i]
		if p.Pod == nil {
			continue
		}
		pods++
		e, canon := c.lookup(p.Pod)
		if e != nil {
			e.seen = gen
			p.Key = e.key
			if e.current(t, resolve) {
				p.Out = e.out
				if p.Out == nil {
					p.Out = p.Pod
				}
				reused++
				continue
			}
		}
		if canon != nil {
			p.Canon = bytes.Clone(canon) // the key Store keeps it under
		}
		p.Need = true
	}
	c.mu.Unlock()
	return gen, pods, reused
}

// lookup returns the entry cached for a pod's segment, if any, and the
// segment's canonical form when it is not canonical itself (in c.scratch:
// valid until the next lookup). Entries are kept under the canonical form
// of their segment, because the kubelet lists a container's devices in map
// order; a segment is looked up as it is first, since most are canonical
// already (no devices, or one). c.mu is held.
func (c *Cache) lookup(seg []byte) (e *segment, canon []byte) {
	if e = c.m[string(seg)]; e != nil {
		return e, nil
	}
	var changed bool
	if c.scratch, changed = appendCanonical(c.scratch[:0], seg); !changed {
		return nil, nil
	}
	return c.m[string(c.scratch)], c.scratch
}

// current reports whether e's output can be spliced in as it is: built
// with the plan resolve gives the pod, without a kubelet read (checked
// again only when the table t changed since; a nil t: every time, as when
// resolve answers from more than the table, see resolve.Query). Plans are
// replaced, never modified, so the same plan means the same output.
func (e *segment) current(t *plans.Table, resolve Resolve) bool {
	if t != nil && e.checked == t {
		return true
	}
	if p, ok := resolve(e.key); ok && p == e.plan {
		if t != nil {
			e.checked = t
		}
		return true
	}
	return false
}

// Steady builds the answer in one pass over the kubelet's when every pod
// in it has a current output, as on a node where nothing changed since the
// last List: each field is copied to the answer as it is read, a pod's as
// its cached output. It reports false, having built nothing, at the first
// pod that must be rebuilt (or a field that does not parse); Split, Reuse
// and Splice then make the answer, which comes out the same. pods is how
// many pods the answer lists.
func (c *Cache) Steady(kubelet []byte, t *plans.Table, resolve Resolve) (out []byte, pods int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) == 0 {
		return nil, 0, false
	}
	c.gen++
	out = make([]byte, 0, c.lastLen)
	for b := kubelet; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, 0, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, 0, false
		}
		field := b[:n+m]
		b = b[n+m:]
		if num != podsField || typ != protowire.BytesType {
			out = append(out, field...)
			continue
		}
		seg, _ := protowire.ConsumeBytes(field[n:])
		e, _ := c.lookup(seg)
		if e == nil || !e.current(t, resolve) {
			return nil, 0, false
		}
		e.seen = c.gen
		pods++
		o := e.out
		if o == nil {
			o = seg
		}
		out = protowire.AppendTag(out, podsField, protowire.BytesType)
		out = protowire.AppendBytes(out, o)
	}
	c.dropLocked(c.gen, pods)
	c.lastLen = len(out)
	return out, pods, true
}
