// Package metrics is the daemon's one way to emit metrics: one Metrics,
// made with New on the registry /metrics serves, passed explicitly to every
// part that counts something, with one method per thing counted. The
// PodResources server and its sub-packages call it directly; packages that
// must not depend on Prometheus (the NRI plugin, the CRI reconciler, the
// allocators, the trust gate, the pod sources) declare a small interface
// with the methods they call, which Metrics implements, and the daemon
// passes the same Metrics there. The state store's counters live in the
// store and are read when /metrics is scraped (WatchStore). There are no
// package-level collectors and no callbacks.
//
// The endpoint counters mirror the kubelet's
// kubelet_pod_resources_endpoint_* family (same split by method and
// server_api_version label), so existing dashboards translate one to one.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Metrics are the daemon's Prometheus metrics.
type Metrics struct {
	reg prometheus.Registerer

	// The PodResources server.
	requestsTotal  *prometheus.CounterVec
	answerDuration *prometheus.HistogramVec
	// byMethod are the requests_<method> and errors_<method> counters.
	byMethod            map[string][2]*prometheus.CounterVec
	rateLimited         prometheus.Counter
	unreadRefused       prometheus.Counter
	upstreamDuration    *prometheus.HistogramVec
	podsReads           *prometheus.CounterVec
	podsReadDuration    prometheus.Histogram
	annotationErrors    *prometheus.CounterVec
	allocationsRefused  *prometheus.CounterVec
	listPodsTotal       *prometheus.CounterVec
	upstreamShared      *prometheus.CounterVec
	connectionsRejected prometheus.Counter

	// The NRI plugin and the CRI reconciler.
	nriEvents         *prometheus.HistogramVec
	nriConnected      prometheus.Gauge
	nriReconnects     prometheus.Counter
	criReconciles     *prometheus.CounterVec
	criReconcileTaken prometheus.Histogram

	// The pod sources.
	podsAPIEvents     *prometheus.CounterVec
	podsAPIRelists    prometheus.Counter
	podsAPIReconnects prometheus.Counter
	podsAPIInit       prometheus.Counter
	draUnfolded       *prometheus.CounterVec
	draPodsReads      prometheus.Counter
	podSourceReads    *prometheus.CounterVec

	// The Events (package report).
	events eventMetrics
}

const namespace = "podres_proxy"

// New creates the metrics and registers them with reg.
func New(reg prometheus.Registerer) *Metrics {
	auto := promauto.With(reg)
	opts := func(subsystem, name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	counter := func(subsystem, name, help string) prometheus.Counter {
		return auto.NewCounter(prometheus.CounterOpts(opts(subsystem, name, help)))
	}
	counterVec := func(subsystem, name, help string, labels ...string) *prometheus.CounterVec {
		return auto.NewCounterVec(prometheus.CounterOpts(opts(subsystem, name, help)), labels)
	}
	histogram := func(subsystem, name, help string, buckets []float64) prometheus.HistogramOpts {
		return prometheus.HistogramOpts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help, Buckets: buckets}
	}
	endpoint := func(name, help string) *prometheus.CounterVec {
		return counterVec("pod_resources_endpoint", name, help, "server_api_version")
	}
	byMethod := map[string][2]*prometheus.CounterVec{}
	for method, suffix := range map[string]string{"List": "list", "Get": "get", "GetAllocatableResources": "get_allocatable"} {
		byMethod[method] = [2]*prometheus.CounterVec{
			endpoint("requests_"+suffix, "Calls to "+method+"."),
			endpoint("errors_"+suffix, method+" calls answered with an error."),
		}
	}
	return &Metrics{
		reg:           reg,
		requestsTotal: endpoint("requests_total", "Calls to the PodResources endpoint, all methods."),
		answerDuration: auto.NewHistogramVec(histogram("", "request_duration_seconds",
			"Latency of the proxy's answers, from a call's arrival to its answer, by API version, method, view and gRPC code; upstream_request_duration_seconds is the kubelet's part.",
			[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10}), []string{"server_api_version", "method", "view", "code"}),
		byMethod:    byMethod,
		rateLimited: counter("", "rate_limited_total", "Calls rejected by the rate limit (ResourceExhausted, 'rejected by rate limit')."),
		unreadRefused: counter("", "unread_refused_total",
			"Calls refused (ResourceExhausted) because their connection, or all connections together, held too many bytes of answers their clients had not read."),
		upstreamDuration: auto.NewHistogramVec(histogram("", "upstream_request_duration_seconds",
			"Latency of the kubelet's PodResources API as seen by the proxy, by method and gRPC code.",
			[]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10}), []string{"method", "code"}),
		podsReads: counterVec("", "kubelet_pods_reads_total", "Reads of the kubelet's /pods endpoint, by result (ok, error).", "result"),
		podsReadDuration: auto.NewHistogram(histogram("", "kubelet_pods_read_duration_seconds",
			"Latency of reads of the kubelet's /pods endpoint, decoding included.",
			[]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5})),
		annotationErrors: counterVec("", "annotation_errors_total",
			"Allocator annotations that could not be decoded; the pod is answered without those devices.", "allocator"),
		allocationsRefused: counterVec("", "allocations_refused_total",
			"Decoded devices not reported because the trust rules refused them, by allocator and reason (wrong-scheduler, no-request, not-on-node, contested: forged; unsafe-id: malformed; spec-unknown: not vetted yet). Counted when a pod's refusals change, not per query.",
			"allocator", "reason"),
		connectionsRejected: counter("", "connections_rejected_total", "Client connections closed at once because the connection cap was reached."),
		listPodsTotal: counterVec("", "list_pods_total",
			"Pods of List answers, by how their part of the answer was made: reused (the kubelet, the store and the inventory said the same as before) or rebuilt.",
			"answer"),
		upstreamShared: counterVec("", "upstream_shared_calls_total",
			"Calls answered from a kubelet call shared with other clients' calls, by method (Get shares the kubelet's List); each such kubelet call counts once per caller after the first, including calls beyond the rate limit, which joined it at no cost to the kubelet.",
			"method"),

		nriEvents: auto.NewHistogramVec(histogram("nri", "event_duration_seconds",
			"NRI requests handled, by event, and how long the handler took (the runtime waits for it).",
			[]float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .005, .025, .1}), []string{"event"}),
		nriConnected:  auto.NewGauge(prometheus.GaugeOpts(opts("nri", "connected", "1 while the NRI plugin is registered with the runtime."))),
		nriReconnects: counter("nri", "reconnects_total", "Connection attempts to the runtime's NRI socket after the first."),
		criReconciles: counterVec("cri", "reconciles_total", "Reconciles of the state store against CRI, by result (ok, error).", "result"),
		criReconcileTaken: auto.NewHistogram(histogram("cri", "reconcile_duration_seconds", "How long a CRI reconcile took.",
			prometheus.DefBuckets)),

		podsAPIEvents: counterVec("pods_api", "events_total",
			"Events of the kubelet's Pods API watch, by type (ADDED, MODIFIED, DELETED, INITIAL_SYNC_COMPLETE).", "type"),
		podsAPIRelists: counter("pods_api", "relists_total", "Complete relists of the kubelet's Pods API watch (each connection starts with one)."),
		podsAPIReconnects: counter("pods_api", "reconnects_total",
			"Watches of the kubelet's Pods API that ended or could not start, retried (at once after a watch that had synced, with backoff otherwise)."),
		podsAPIInit: counter("pods_api", "initializing_total",
			"Watches of the kubelet's Pods API the kubelet refused as initializing (FailedPrecondition, from 1.37 after every kubelet start), retried within seconds; counted in reconnects_total too."),
		podSourceReads: counterVec("", "pod_source_reads_total",
			"Reads of every pod made for queries, by the source that answered (pods-api: ListPods; pods: the kubelet's /pods).", "source"),
		draUnfolded: counterVec("dra", "unfolded_total",
			"DRA devices of extended resources the legacy view left under dynamic_resources, once per pod and device, by reason (no-resourceslice, no-id-attribute, claim-allocation-unknown).",
			"reason"),
		draPodsReads: counter("dra", "pods_reads_total",
			"Successful /pods reads of the legacy view, in the background, for pods' extended resource claims (status.extendedResourceClaimStatus), which the kubelet's Pods API does not carry."),
		events: newEventMetrics(counter, counterVec),
	}
}

// StoreStats are the state store's counters (state.Stats), as WatchStore
// reads them.
type StoreStats struct {
	Writing                           bool // false while waiting for another instance to let go
	Records, Pending                  int
	Writes, WriteErrors, CorruptFiles uint64
	LastDurable, MaxDurable           time.Duration
}

// WatchStore exposes the state store's counters, read from stats at every
// scrape: they live in the store, which counts them under its own lock.
// Call it once.
func (m *Metrics) WatchStore(stats func() StoreStats) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: "state", Name: name, Help: help}
	}
	gauge := func(name, help string, f func(StoreStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts(name, help)), func() float64 { return f(stats()) })
	}
	counter := func(name, help string, f func(StoreStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts(opts(name, help)), func() float64 { return f(stats()) })
	}
	m.reg.MustRegister(
		gauge("writer", "1 when this instance writes the state directory, 0 while it waits for another instance (the old one of a rolling update) to let go.", func(s StoreStats) float64 {
			if s.Writing {
				return 1
			}
			return 0
		}),
		gauge("records", "Pod records in the state store.", func(s StoreStats) float64 { return float64(s.Records) }),
		gauge("pending_writes", "Records changed in memory and not yet on disk.", func(s StoreStats) float64 { return float64(s.Pending) }),
		gauge("last_durable_seconds", "Time from a record's change to its file being durable, for the last write.", func(s StoreStats) float64 { return s.LastDurable.Seconds() }),
		gauge("max_durable_seconds", "The longest time from a change to its file being durable since start.", func(s StoreStats) float64 { return s.MaxDurable.Seconds() }),
		counter("writes_total", "Record files written.", func(s StoreStats) float64 { return float64(s.Writes) }),
		counter("write_errors_total", "Record writes that failed and will be retried; the log says why.", func(s StoreStats) float64 { return float64(s.WriteErrors) }),
		counter("corrupt_files_total", "Record files set aside into corrupt/ at start.", func(s StoreStats) float64 { return float64(s.CorruptFiles) }),
	)
}

// WatchReady exposes ready, read at every scrape, as podres_proxy_ready:
// 1 while /readyz answers 200 (the PodResources socket is served). Call it
// once.
func (m *Metrics) WatchReady(ready func() bool) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: "ready",
		Help: "1 while this instance is ready (its /readyz answers 200: the PodResources socket is served), 0 otherwise."},
		func() float64 {
			if ready() {
				return 1
			}
			return 0
		}))
}

// result is the result label of an outcome.
func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// NRIEvent counts one NRI request handled, by its NRI name, and how long
// the handler took (plugin.Metrics).
func (m *Metrics) NRIEvent(name string, took time.Duration) {
	m.nriEvents.WithLabelValues(name).Observe(took.Seconds())
}

// NRIConnected sets whether the NRI plugin is registered with the runtime
// (plugin.Metrics).
func (m *Metrics) NRIConnected(up bool) {
	if up {
		m.nriConnected.Set(1)
	} else {
		m.nriConnected.Set(0)
	}
}

// NRIReconnect counts a connection attempt to the runtime after the first
// (plugin.Metrics).
func (m *Metrics) NRIReconnect() {
	m.nriReconnects.Inc()
}

// CRIReconciled counts one CRI reconcile and how long it took (plugin.Metrics).
func (m *Metrics) CRIReconciled(took time.Duration, err error) {
	m.criReconciles.WithLabelValues(result(err)).Inc()
	m.criReconcileTaken.Observe(took.Seconds())
}

// DRAUnfolded counts a DRA device the legacy view could not fold, by
// reason (dra.View).
func (m *Metrics) DRAUnfolded(reason string) {
	m.draUnfolded.WithLabelValues(reason).Inc()
}

// PodsAPIEvent counts one event of the Pods API watch, by its type
// (podsapi.Metrics).
func (m *Metrics) PodsAPIEvent(kubeletType string) {
	m.podsAPIEvents.WithLabelValues(kubeletType).Inc()
}

// PodsAPIRelisted counts one complete relist of the Pods API watch
// (podsapi.Metrics).
func (m *Metrics) PodsAPIRelisted(_, _ int, _ time.Duration) {
	m.podsAPIRelists.Inc()
}

// PodsAPIReconnect counts a watch of the Pods API that ended or could not
// start (podsapi.Metrics).
func (m *Metrics) PodsAPIReconnect(error) {
	m.podsAPIReconnects.Inc()
}

// PodsAPIInitializing counts a watch of the Pods API the kubelet refused
// as initializing (podsapi.Metrics).
func (m *Metrics) PodsAPIInitializing() {
	m.podsAPIInit.Inc()
}

// DRAPodsRead counts a successful /pods read of the legacy view. It is not
// a read for the answers' pods (PodSourceRead): those come from the Pods
// API where the kubelet serves it, which has no extended resource claims.
func (m *Metrics) DRAPodsRead() {
	m.draPodsReads.Inc()
}

// PodSourceRead counts one read of every pod made for a query, by the
// source that answered it (podsapi.Metrics).
func (m *Metrics) PodSourceRead(source string) {
	m.podSourceReads.WithLabelValues(source).Inc()
}

// PodsRead records one /pods read, its duration and outcome
// (kubeletpods.Metrics).
func (m *Metrics) PodsRead(d time.Duration, err error) {
	m.podsReads.WithLabelValues(result(err)).Inc()
	m.podsReadDuration.Observe(d.Seconds())
}

// AnnotationError counts one undecodable annotation (allocator.Metrics).
func (m *Metrics) AnnotationError(allocator string) {
	m.annotationErrors.WithLabelValues(allocator).Inc()
}

// ListPods counts the pods of one List answer by how they were made.
func (m *Metrics) ListPods(reused, rebuilt int) {
	m.listPodsTotal.WithLabelValues("reused").Add(float64(reused))
	m.listPodsTotal.WithLabelValues("rebuilt").Add(float64(rebuilt))
}

// Shared counts the callers of one shared kubelet call beyond the first.
func (m *Metrics) Shared(method string, others int) {
	if others <= 0 {
		return
	}
	m.upstreamShared.WithLabelValues(method).Add(float64(others))
}

// AllocationRefused counts one refused device (trust.Metrics).
func (m *Metrics) AllocationRefused(allocator, reason string) {
	m.allocationsRefused.WithLabelValues(allocator, reason).Inc()
}

// ConnectionRejected counts a connection refused by the connection cap.
func (m *Metrics) ConnectionRejected() {
	m.connectionsRejected.Inc()
}

// Upstream records the latency of one kubelet call, by method and code.
func (m *Metrics) Upstream(method string, code codes.Code, d time.Duration) {
	m.upstreamDuration.WithLabelValues(method, code.String()).Observe(d.Seconds())
}

// Request counts a call the way the kubelet does: requests_total plus the
// per-method counter, and the per-method error counter when it failed.
// The kubelet counts v1alpha1 calls in requests_total only.
func (m *Metrics) Request(version, method string, failed bool) {
	m.requestsTotal.WithLabelValues(version).Inc()
	counters, ok := m.byMethod[method]
	if !ok || version == "v1alpha1" {
		return
	}
	counters[0].WithLabelValues(version).Inc()
	if failed {
		counters[1].WithLabelValues(version).Inc()
	}
}

// Answered records how long the proxy took to answer one call that reached
// its handler, by API version, method, the socket's view and the answer's
// gRPC code (OK, or the error's).
func (m *Metrics) Answered(version, method, view string, err error, took time.Duration) {
	m.answerDuration.WithLabelValues(version, method, view, status.Code(err).String()).Observe(took.Seconds())
}

// RateLimited counts a call rejected by the rate limit.
func (m *Metrics) RateLimited() {
	m.rateLimited.Inc()
}

// UnreadRefused counts a call refused because answers were not read
// (limits.Unread).
func (m *Metrics) UnreadRefused() {
	m.unreadRefused.Inc()
}
