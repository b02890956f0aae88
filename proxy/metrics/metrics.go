// Package metrics is the PodResources server's Prometheus metrics, in one
// place so that every part of the server counts into the same families.
// The endpoint counters mirror the kubelet's
// kubelet_pod_resources_endpoint_* family (same split by method and
// server_api_version label), so existing dashboards translate one to one.
// Every method is safe on a nil *Metrics, which counts nothing (tests).
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metrics are the proxy's Prometheus metrics.
type Metrics struct {
	requestsTotal          *prometheus.CounterVec
	requestsList           *prometheus.CounterVec
	requestsGet            *prometheus.CounterVec
	requestsGetAllocatable *prometheus.CounterVec
	errorsList             *prometheus.CounterVec
	errorsGet              *prometheus.CounterVec
	errorsGetAllocatable   *prometheus.CounterVec
	rateLimited            prometheus.Counter
	upstreamDuration       *prometheus.HistogramVec
	podsReads              *prometheus.CounterVec
	podsReadDuration       prometheus.Histogram
	annotationErrors       *prometheus.CounterVec
	allocationsRefused     *prometheus.CounterVec
	listPodsTotal          *prometheus.CounterVec
	upstreamShared         *prometheus.CounterVec
	connectionsRejected    prometheus.Counter
}

const namespace = "podres_proxy"

// New creates the metrics and registers them with reg.
func New(reg prometheus.Registerer) *Metrics {
	endpoint := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Subsystem: "pod_resources_endpoint",
			Name:      name,
			Help:      help,
		}, []string{"server_api_version"})
	}
	m := &Metrics{
		requestsTotal:          endpoint("requests_total", "Calls to the PodResources endpoint, all methods."),
		requestsList:           endpoint("requests_list", "Calls to List."),
		requestsGet:            endpoint("requests_get", "Calls to Get."),
		requestsGetAllocatable: endpoint("requests_get_allocatable", "Calls to GetAllocatableResources."),
		errorsList:             endpoint("errors_list", "List calls answered with an error."),
		errorsGet:              endpoint("errors_get", "Get calls answered with an error."),
		errorsGetAllocatable:   endpoint("errors_get_allocatable", "GetAllocatableResources calls answered with an error."),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "rate_limited_total",
			Help:      "Calls rejected by the rate limit (ResourceExhausted, 'rejected by rate limit').",
		}),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "upstream_request_duration_seconds",
			Help:      "Latency of the kubelet's PodResources API as seen by the proxy, by method and gRPC code.",
			Buckets:   []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"method", "code"}),
		podsReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "kubelet_pods_reads_total",
			Help:      "Reads of the kubelet's /pods endpoint, by result (ok, error).",
		}, []string{"result"}),
		podsReadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace,
			Name:      "kubelet_pods_read_duration_seconds",
			Help:      "Latency of reads of the kubelet's /pods endpoint, decoding included.",
			Buckets:   []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		annotationErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "annotation_errors_total",
			Help:      "Allocator annotations that could not be decoded; the pod is answered without those devices.",
		}, []string{"allocator"}),
		allocationsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "allocations_refused_total",
			Help:      "Decoded devices not reported because the trust rules refused them, by allocator and reason (wrong-scheduler, no-request, not-on-node, contested: forged; unsafe-id: malformed; spec-unknown: not vetted yet). Counted when a pod's refusals change, not per query.",
		}, []string{"allocator", "reason"}),
		connectionsRejected: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace,
			Name:      "connections_rejected_total",
			Help:      "Client connections closed at once because the connection cap was reached.",
		}),
	}
	m.listPodsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "list_pods_total",
		Help:      "Pods of List answers, by how their part of the answer was made: reused (the kubelet, the store and the inventory said the same as before) or rebuilt.",
	}, []string{"answer"})
	m.upstreamShared = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "upstream_shared_calls_total",
		Help:      "Calls answered from a kubelet call shared with other clients' calls, by method (Get shares the kubelet's List); each such kubelet call counts once per caller after the first, including calls beyond the rate limit, which joined it at no cost to the kubelet.",
	}, []string{"method"})
	reg.MustRegister(m.connectionsRejected, m.requestsTotal, m.requestsList, m.requestsGet, m.requestsGetAllocatable,
		m.errorsList, m.errorsGet, m.errorsGetAllocatable, m.rateLimited, m.upstreamDuration,
		m.podsReads, m.podsReadDuration, m.annotationErrors, m.allocationsRefused,
		m.listPodsTotal, m.upstreamShared)
	return m
}

// ObservePodsRead records one /pods read; it fits kubeletpods.ReaderOptions.OnRead.
func (m *Metrics) ObservePodsRead(d time.Duration, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.podsReads.WithLabelValues(result).Inc()
	m.podsReadDuration.Observe(d.Seconds())
}

// AnnotationError counts one undecodable annotation; it fits allocator.NewSet's onError.
func (m *Metrics) AnnotationError(allocator string) {
	if m == nil {
		return
	}
	m.annotationErrors.WithLabelValues(allocator).Inc()
}

// ListPods counts the pods of one List answer by how they were made.
func (m *Metrics) ListPods(reused, rebuilt int) {
	if m == nil {
		return
	}
	m.listPodsTotal.WithLabelValues("reused").Add(float64(reused))
	m.listPodsTotal.WithLabelValues("rebuilt").Add(float64(rebuilt))
}

// Shared counts the callers of one shared kubelet call beyond the first.
func (m *Metrics) Shared(method string, others int) {
	if m == nil || others <= 0 {
		return
	}
	m.upstreamShared.WithLabelValues(method).Add(float64(others))
}

// AllocationRefused counts one refused device; it fits
// trust.GateOptions.OnRefuse.
func (m *Metrics) AllocationRefused(allocator, reason string) {
	if m == nil {
		return
	}
	m.allocationsRefused.WithLabelValues(allocator, reason).Inc()
}

// ConnectionRejected counts a connection refused by the connection cap.
func (m *Metrics) ConnectionRejected() {
	if m == nil {
		return
	}
	m.connectionsRejected.Inc()
}

// Upstream records the latency of one kubelet call, by method and code.
func (m *Metrics) Upstream(method string, code codes.Code, d time.Duration) {
	if m == nil {
		return
	}
	m.upstreamDuration.WithLabelValues(method, code.String()).Observe(d.Seconds())
}

// Request counts a call the way the kubelet does: requests_total plus the
// per-method counter, and the per-method error counter when it failed.
func (m *Metrics) Request(version, method string, failed bool) {
	if m == nil {
		return
	}
	m.requestsTotal.WithLabelValues(version).Inc()
	var req, errs *prometheus.CounterVec
	switch method {
	case "List":
		req, errs = m.requestsList, m.errorsList
	case "Get":
		req, errs = m.requestsGet, m.errorsGet
	case "GetAllocatableResources":
		req, errs = m.requestsGetAllocatable, m.errorsGetAllocatable
	}
	if version == "v1alpha1" {
		// The kubelet counts v1alpha1 calls in requests_total only.
		return
	}
	if req != nil {
		req.WithLabelValues(version).Inc()
		if failed {
			errs.WithLabelValues(version).Inc()
		}
	}
}

// RateLimited counts a call rejected by the rate limit.
func (m *Metrics) RateLimited() {
	if m == nil {
		return
	}
	m.rateLimited.Inc()
}
