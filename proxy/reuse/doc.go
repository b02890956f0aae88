// Package reuse is the List path's one optional layer: answers are
// reused per pod, not per answer. Its whole trick is told here.
//
// Clients such as DCGM exporter and resource-topology-exporter poll List
// every few seconds, and between two polls little changes. Yet the kubelet's
// answer is almost never the same bytes twice: it builds List from its pod
// manager's map of pods and each container's devices from the device
// manager's maps, so the pods (and the ids within a container) come in a new
// order on almost every call. So the proxy reuses work pod by pod:
//
//   - The kubelet's answer stays Encoded (Codec). A List answer is a
//     sequence of fields; each pod is one length-delimited field 1
//     (pod_resources), in v1 and v1alpha1 alike. Split walks the fields
//     with protowire, decoding nothing: each pod's bytes are a segment.
//   - A segment's output is cached under the segment's bytes, each
//     container's devices put in byte order first (appendCanonical: the
//     kubelet lists a container's device ids from maps too), together with
//     the plan it was built with (package proxy/plans). Plans are computed
//     when pods change, kept in immutable tables, and replaced, never
//     modified, so the same plan pointer means the same output: a cached
//     output is spliced in as is while the current table still gives the
//     pod that plan, and while the table itself is the one last checked, a
//     steady List does not even look the pod up.
//   - Otherwise that pod alone is decoded, given its devices (the same merge
//     Get uses, so List and Get agree) and Encoded.
//   - Fields that are not pods (a newer kubelet's) are copied through, and
//     a pod's own unknown fields survive its decode and encode.
//
// The answer is then the kubelet's fields, in the kubelet's order, each pod
// replaced by its output, and a pod that changed is rebuilt alone. When
// every pod's output is current, as on a node where nothing changed since
// the last List, Steady builds it in one pass: a walk over the bytes, one
// map lookup and one copy per pod. Otherwise Split, Reuse, the rebuilds and
// Splice make the same answer. Entries of pods the latest answer no longer
// lists are dropped, and the cache holds at most MaxCacheBytes per List
// method.
//
// The proxy's answer goes back to gRPC still encoded too: PreEncoded sets
// the spliced bytes as the unknown fields of an empty response message,
// which protobuf writes out verbatim, so the generated handlers return it;
// the server's codec (ServerCodec) hands those bytes to gRPC as they are,
// rather than copying them into a pooled buffer. Without this package
// (every pod rebuilt), answers are the same; they only cost more.
package reuse
