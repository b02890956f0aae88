package plugin

import "time"

// Observer receives what the plugin measures (the CRI reconciler's
// counters are cri.Observer's); the daemon
// backs it with Prometheus collectors, so this package imports none.
// Implementations must be safe for concurrent use and must not block: they
// are called from NRI handlers.
type Observer interface {
	// Event counts one NRI request handled, by its NRI name
	// (RunPodSandbox, ..., RemoveContainer, Synchronize), and how long the
	// handler took.
	Event(name string, took time.Duration)
	// Connected reports whether the plugin is registered with the runtime
	// (it got Synchronize) or has lost the connection.
	Connected(up bool)
	// Reconnect counts a connection attempt after the first one.
	Reconnect()
}

// NoObserver discards everything. Embed it to implement part of Observer.
type NoObserver struct{}

func (NoObserver) Event(string, time.Duration) {}
func (NoObserver) Connected(bool)              {}
func (NoObserver) Reconnect()                  {}
