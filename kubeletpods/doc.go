// Package kubeletpods reads the pods the kubelet serves on its HTTP /pods
// endpoint: their annotations (where centralized schedulers record the
// devices they allocated) and the extended resources each container
// requests (which say which container gets them).
//
// Client does one read: TLS verified by default, the bearer token and CA
// re-read when they change (internal/bearer), a bounded answer, and a decoder (package podsjson) that
// skips all but the few fields podres-proxy needs. Reader shares reads
// between concurrent queries while guaranteeing each query a read that
// started after it arrived: the
// freshness a query about a pod that is being created needs (Multus asks
// during CNI ADD, before the runtime has told anyone about the pod).
package kubeletpods
