// Package plugin is the NRI plugin: it records pod and container lifecycle
// into the state store, applying the runtime's events as they happen. The
// CRI reconciler that closes the gaps NRI leaves is package plugin/cri.
//
// # NRI plugin
//
// [Plugin] registers with the runtime's NRI socket (containerd 1.7 and later,
// CRI-O 1.26 and later) and subscribes to RunPodSandbox, StopPodSandbox,
// RemovePodSandbox, PostCreateContainer, PostStartContainer, StopContainer
// and RemoveContainer. Each event becomes one [state.Store] update with
// source [state.OriginNRI]; Synchronize, sent on every connection, becomes a
// full [state.Store.Reconcile].
//
// The plugin is an observer and never fails or delays a pod. Handlers always
// return nil. They update the store inline, in the order the runtime sent
// the events: the store decodes annotations outside its lock and holds the
// lock only to swap records in (microseconds), so no other pod's event or
// query can make a handler wait. Persistence is the store's business and
// asynchronous.
//
// [Plugin.Run] keeps the plugin connected: when the runtime restarts, it
// redials with exponential backoff and the runtime's fresh Synchronize brings
// the store up to date. It registers as "90-podres-proxy" by default: index
// 90 runs it after the plugins that may veto a pod, so a pod they reject is
// never recorded as running. When the runtime pre-launched the binary (from
// its NRI plugin directory), the name and index come from the runtime's
// environment and the connection is the one the runtime handed over; it
// cannot be redialled, so Run returns when it closes and the runtime launches
// the plugin again when it restarts.
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
// Synchronize and never get RemoveContainer. The reconciler in package
// plugin/cri therefore lists the runtime's sandboxes and containers over CRI
// and reconciles the store with source [state.OriginCRI]; the daemon
// triggers it when the plugin re-synchronizes (Options.OnSynchronized).
//
// # Usage
//
//	p, err := plugin.New(store, plugin.Options{Socket: nriSocket, Log: log})
//	...
//	go p.Run(ctx) // returns nil when ctx is done
//	r, err := cri.NewReconciler(store, cri.Options{Endpoint: criSocket, Log: log})
//	...
//	go r.Run(ctx)
//
// Counters go through [Metrics], for which the daemon passes its one
// metrics.Metrics.
package plugin
