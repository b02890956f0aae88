// Package plugin records pod and container lifecycle into the state store
// from the runtime: the NRI plugin applies the runtime's events as they
// happen, and the CRI reconciler closes the gaps NRI leaves.
//
// # NRI plugin
//
// [Plugin] registers with the runtime's NRI socket (containerd 1.7 and later,
// CRI-O 1.26 and later); its handlers are named after the events. Each event
// becomes one [state.Store] update with source [record.OriginNRI];
// Synchronize, sent on every connection, becomes a full
// [state.Store.Reconcile].
//
// The plugin is an observer and never fails or delays a pod. Handlers always
// return nil. They update the store inline, in the order the runtime sent
// the events: the store decodes annotations outside its lock and holds the
// lock only to swap records in (microseconds), so no other pod's event or
// query can make a handler wait. Persistence is the store's business and
// asynchronous.
//
// Deployment notes: the plugin must run as root (the runtime creates the NRI
// socket directory 0700), and a container must mount the socket's directory
// (/var/run/nri), not the socket file, or it cannot reconnect after a runtime
// restart re-creates the socket.
//
// # CRI reconciler
//
// NRI misses things: events sent while the plugin was disconnected are lost,
// containerd does not send StopPodSandbox and RemovePodSandbox for pods
// created before it restarted, and exited containers are absent from
// Synchronize and never get RemoveContainer. The [Reconciler] therefore
// lists the runtime's sandboxes and containers over CRI, at start, then
// periodically and when the plugin re-synchronizes
// (Options.OnSynchronized), and reconciles the store with source
// [record.OriginCRI]. A CRI socket that is missing or restarting is logged
// and retried, never fatal.
//
// Counters of both go through [Metrics], for which the daemon passes its one
// metrics.Metrics.
package plugin
