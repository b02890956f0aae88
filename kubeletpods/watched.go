package kubeletpods

import (
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/model"
)

// WatchedStore is what the Pods API watch tells of the pods (state.Store).
type WatchedStore interface {
	ObserveWatchedPod(model.KubeletPod)
	WatchedPodDeleted(model.PodRef)
	WatchChanged()
}

// Watched returns the podsapi.Options.Handler that applies each event of
// the kubelet's Pods API watch to store. The Pods API (KEP-4188, the
// PodsAPI gate) is the preferred pod source: its watch tells the store
// every pod, with its annotations and UID, before its sandbox exists, so a
// pod being created needs no read at all, and a name is known to be a new
// pod's the moment it is. /pods stays the fallback (podsapi.Source.Or) on
// kubelets without it. A refused pod is not told: the store keeps what
// the other sources say of it.
func Watched(store WatchedStore) func(podsapi.Event) {
	return func(ev podsapi.Event) {
		switch ev.Type {
		case podsapi.PodAdded, podsapi.PodModified:
			store.ObserveWatchedPod(ev.Pod)
		case podsapi.PodDeleted:
			store.WatchedPodDeleted(model.PodRef{UID: ev.Pod.UID, Namespace: ev.Pod.Namespace, Name: ev.Pod.Name})
		case podsapi.Synced, podsapi.Unsynced:
			store.WatchChanged()
		}
	}
}
