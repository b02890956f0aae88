package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

// The kubelet's Pods API (KEP-4188, the PodsAPI gate) is the preferred pod
// source: its watch tells the store every pod, with its annotations and
// UID, before its sandbox exists, so a pod being created needs no read at
// all, and a name is known to be a new pod's the moment it is. /pods stays
// the fallback (podsapi.Source.Or) on kubelets without it.

// podSourceMetrics count what each pod source did.
type podSourceMetrics struct {
	events     *prometheus.CounterVec
	relists    prometheus.Counter
	reconnects prometheus.Counter
	reads      *prometheus.CounterVec
}

func newPodSourceMetrics(reg prometheus.Registerer) *podSourceMetrics {
	m := &podSourceMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podres_proxy", Subsystem: "pods_api", Name: "events_total",
			Help: "Events of the kubelet's Pods API watch, by type (ADDED, MODIFIED, DELETED, INITIAL_SYNC_COMPLETE).",
		}, []string{"type"}),
		relists: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podres_proxy", Subsystem: "pods_api", Name: "relists_total",
			Help: "Complete relists of the kubelet's Pods API watch (each connection starts with one).",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podres_proxy", Subsystem: "pods_api", Name: "reconnects_total",
			Help: "Watches of the kubelet's Pods API that ended or could not start, retried with backoff.",
		}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podres_proxy", Name: "pod_source_reads_total",
			Help: "Reads of every pod made for queries, by the source that answered (pods-api: ListPods; pods: the kubelet's /pods).",
		}, []string{"source"}),
	}
	reg.MustRegister(m.events, m.relists, m.reconnects, m.reads)
	return m
}

// newPodsAPI returns the Pods API source of socket, feeding store.
func newPodsAPI(socket string, store *state.Store, allocators *allocator.Set, m *podSourceMetrics, log logrus.FieldLogger) (*podsapi.Source, error) {
	return podsapi.New(podsapi.Options{
		Socket:             socket,
		MaxAnnotationBytes: allocators.MaxAnnotationBytes,
		Handler:            func(ev podsapi.Event) { watchedPod(store, ev) },
		OnEvent:            func(typ string) { m.events.WithLabelValues(typ).Inc() },
		OnRelist:           func(int, int, time.Duration) { m.relists.Inc() },
		OnReconnect:        func(error) { m.reconnects.Inc() },
		Log:                log,
	})
}

// watchedPod applies one event of the watch to the store.
func watchedPod(store *state.Store, ev podsapi.Event) {
	switch ev.Type {
	case podsapi.PodAdded, podsapi.PodModified:
		store.ObserveWatchedPod(ev.Pod)
	case podsapi.PodDeleted:
		store.WatchedPodDeleted(model.PodRef{UID: ev.Pod.UID, Namespace: ev.Pod.Namespace, Name: ev.Pod.Name})
	}
}
