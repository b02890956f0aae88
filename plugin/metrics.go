package plugin

import "time"

// Metrics receives what the NRI plugin and the CRI reconciler measure; the
// daemon passes its one metrics.Metrics, so this
// package imports no Prometheus. Implementations must be safe for
// concurrent use and must not block: they are called from NRI handlers.
type Metrics interface {
	// NRIEvent counts one NRI request handled, by its NRI name
	// (RunPodSandbox, ..., RemoveContainer, Synchronize), and how long the
	// handler took.
	NRIEvent(name string, took time.Duration)
	// NRIConnected reports whether the plugin is registered with the
	// runtime (it got Synchronize) or has lost the connection.
	NRIConnected(up bool)
	// NRIReconnect counts a connection attempt after the first one.
	NRIReconnect()
	// CRIReconciled counts one CRI reconcile, how long it took and its
	// error, nil on success.
	CRIReconciled(took time.Duration, err error)
}

// noMetrics discards everything.
type noMetrics struct{}

func (noMetrics) NRIEvent(string, time.Duration)     {}
func (noMetrics) NRIConnected(bool)                  {}
func (noMetrics) NRIReconnect()                      {}
func (noMetrics) CRIReconciled(time.Duration, error) {}
