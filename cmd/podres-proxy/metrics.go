package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podres-proxy/podres-proxy/state"
)

// pluginMetrics backs plugin.Observer (the NRI plugin) and cri.Observer (the
// CRI reconciler) with Prometheus collectors.
type pluginMetrics struct {
	events            *prometheus.HistogramVec
	connected         prometheus.Gauge
	reconnects        prometheus.Counter
	reconciles        *prometheus.CounterVec
	reconcileDuration prometheus.Histogram
}

func newPluginMetrics(reg prometheus.Registerer) *pluginMetrics {
	m := &pluginMetrics{
		events: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "podres_proxy", Subsystem: "nri", Name: "event_duration_seconds",
			Help:    "NRI requests handled, by event, and how long the handler took (the runtime waits for it).",
			Buckets: []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .005, .025, .1},
		}, []string{"event"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "podres_proxy", Subsystem: "nri", Name: "connected",
			Help: "1 while the NRI plugin is registered with the runtime.",
		}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "podres_proxy", Subsystem: "nri", Name: "reconnects_total",
			Help: "Connection attempts to the runtime's NRI socket after the first.",
		}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podres_proxy", Subsystem: "cri", Name: "reconciles_total",
			Help: "Reconciles of the state store against CRI, by result (ok, error).",
		}, []string{"result"}),
		reconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "podres_proxy", Subsystem: "cri", Name: "reconcile_duration_seconds",
			Help:    "How long a CRI reconcile took.",
			Buckets: prometheus.DefBuckets,
		}),
	}
	reg.MustRegister(m.events, m.connected, m.reconnects, m.reconciles, m.reconcileDuration)
	return m
}

func (m *pluginMetrics) Event(name string, took time.Duration) {
	m.events.WithLabelValues(name).Observe(took.Seconds())
}
func (m *pluginMetrics) Connected(up bool) {
	if up {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}
func (m *pluginMetrics) Reconnect() { m.reconnects.Inc() }
func (m *pluginMetrics) Reconciled(took time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.reconciles.WithLabelValues(result).Inc()
	m.reconcileDuration.Observe(took.Seconds())
}

// registerStoreMetrics exposes the state store's counters.
func registerStoreMetrics(reg prometheus.Registerer, store *state.Store) {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "podres_proxy", Subsystem: "state", Name: name, Help: help}
	}
	gauge := func(name, help string, f func(state.Stats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts(name, help)), func() float64 { return f(store.Stats()) })
	}
	counter := func(name, help string, f func(state.Stats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts(opts(name, help)), func() float64 { return f(store.Stats()) })
	}
	reg.MustRegister(
		gauge("records", "Pod records in the state store.", func(s state.Stats) float64 { return float64(s.Records) }),
		gauge("pending_writes", "Records changed in memory and not yet on disk.", func(s state.Stats) float64 { return float64(s.Pending) }),
		gauge("last_durable_seconds", "Time from a record's change to its file being durable, for the last write.", func(s state.Stats) float64 { return s.LastDurable.Seconds() }),
		gauge("max_durable_seconds", "The longest time from a change to its file being durable since start.", func(s state.Stats) float64 { return s.MaxDurable.Seconds() }),
		counter("writes_total", "Record files written.", func(s state.Stats) float64 { return float64(s.Writes) }),
		counter("write_errors_total", "Record writes that failed and will be retried; the log says why.", func(s state.Stats) float64 { return float64(s.WriteErrors) }),
		counter("corrupt_files_total", "Record files set aside into corrupt/ at start.", func(s state.Stats) float64 { return float64(s.CorruptFiles) }),
	)
}
