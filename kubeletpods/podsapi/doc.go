// Package podsapi watches the kubelet's Pods API (KEP-4188, the
// v1alpha1.Pods gRPC service on pods-api/pods-api.sock under the kubelet's
// root directory), the pod source podres-proxy prefers to /pods: the kubelet
// pushes every pod as it learns it, with its annotations and before its
// sandbox exists, so a query during CNI ADD finds the pod already known
// instead of paying for a /pods read.
//
// A Source keeps one WatchPods stream open (see Run for when it watches
// again) and turns it into a view of the node's pods (Lookup) and a series
// of events for a handler. Each (re)connection starts with the kubelet's
// full list of pods; Source treats it as a relist and reports the pods
// missing from it as deleted, so nothing missed while disconnected (or
// dropped by the kubelet as a slow watcher) survives the next sync. A fresh
// read, for a query the view cannot answer yet, is a ListPods (Pods), and a
// /pods read only when ListPods fails (Or).
//
// Each pod arrives as the protobuf encoding of a v1.Pod. It is decoded only
// if it is within a size bound, and only what allocators and trust need is
// kept (the same model.KubeletPod package podsjson produces from /pods, its
// allocator annotations bounded by the same rule, model/annotationbound),
// so that no tenant's pod can take the daemon's memory or fail the source
// for everyone: an oversize pod is refused alone, an allocator annotation
// over its bound is kept as model.OversizedAnnotation on its pod alone.
package podsapi
