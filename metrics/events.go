package metrics

import "github.com/prometheus/client_golang/prometheus"

// eventMetrics count the Events the daemon reports (package report).
type eventMetrics struct {
	emitted     *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	writeErrors prometheus.Counter
}

func newEventMetrics(counter func(subsystem, name, help string) prometheus.Counter,
	counterVec func(subsystem, name, help string, labels ...string) *prometheus.CounterVec) eventMetrics {
	return eventMetrics{
		emitted: counterVec("events", "emitted_total",
			"Events handed to the API server's client, by reason: each a decision that changed, never one per query.", "reason"),
		dropped: counterVec("events", "dropped_total",
			"Events dropped because their queue was full (the API server slow, failing or unreachable), by reason.", "reason"),
		writeErrors: counter("events", "write_errors_total",
			"Writes of Events the API server refused or did not answer in time; the client retries them."),
	}
}

// EventEmitted counts an Event handed to its first write (report.Metrics).
func (m *Metrics) EventEmitted(reason string) { m.events.emitted.WithLabelValues(reason).Inc() }

// EventDropped counts an Event dropped from a full queue (report.Metrics).
func (m *Metrics) EventDropped(reason string) { m.events.dropped.WithLabelValues(reason).Inc() }

// EventWriteFailed counts a failed write of an Event (report.Metrics).
func (m *Metrics) EventWriteFailed() { m.events.writeErrors.Inc() }
