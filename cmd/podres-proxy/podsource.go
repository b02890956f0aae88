package main

import (
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

// The kubelet's Pods API (KEP-4188, the PodsAPI gate) is the preferred pod
// source: its watch tells the store every pod, with its annotations and
// UID, before its sandbox exists, so a pod being created needs no read at
// all, and a name is known to be a new pod's the moment it is. /pods stays
// the fallback (podsapi.Source.Or) on kubelets without it.

// watchedPod applies one event of the watch to the store.
func watchedPod(store *state.Store, ev podsapi.Event) {
	switch ev.Type {
	case podsapi.PodAdded, podsapi.PodModified:
		store.ObserveWatchedPod(ev.Pod)
	case podsapi.PodDeleted:
		store.WatchedPodDeleted(model.PodRef{UID: ev.Pod.UID, Namespace: ev.Pod.Namespace, Name: ev.Pod.Name})
	case podsapi.Synced, podsapi.Unsynced:
		store.WatchChanged()
	}
}
