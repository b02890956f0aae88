package plugin

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// events are the NRI events the plugin subscribes to. Configure returns them
// explicitly rather than letting the stub derive them from the handlers:
// runtimes built with nri older than v0.10 (containerd 1.7 and 2.0 to 2.1)
// drop a plugin that subscribes to an event they do not know, such as
// UpdatePodSandbox. Creation is recorded at PostCreateContainer, not
// CreateContainer, because a later plugin can still veto the creation.
var events = func() api.EventMask {
	var m api.EventMask
	m.Set(api.Event_RUN_POD_SANDBOX, api.Event_STOP_POD_SANDBOX, api.Event_REMOVE_POD_SANDBOX,
		api.Event_POST_CREATE_CONTAINER, api.Event_POST_START_CONTAINER,
		api.Event_STOP_CONTAINER, api.Event_REMOVE_CONTAINER)
	return m
}()

// handlers handle NRI requests: every handler turns its event into a store
// update and returns nil.
type handlers struct {
	store   *state.Store
	log     logrus.FieldLogger
	metrics Metrics
	// onSynced is called, in its own goroutine, after a Synchronize.
	onSynced func()

	mu     sync.Mutex
	conn   uint64 // counts connections, so a late update from an old one is recognized
	synced bool   // a Synchronize was applied on connection conn
	// configured is closed when the runtime configures connection conn;
	// abandoned makes Configure fail once Run has given the connection up.
	configured chan struct{}
	abandoned  bool
}

func newHandlers(store *state.Store, log logrus.FieldLogger, metrics Metrics, onSynced func()) *handlers {
	if metrics == nil {
		metrics = noMetrics{}
	}
	return &handlers{store: store, log: log, metrics: metrics, onSynced: onSynced}
}

// Configure subscribes to the events the plugin records. The configuration
// string is only non-empty for a pre-launched plugin whose runtime has a
// drop-in file for it; the plugin takes its configuration from flags.
func (p *handlers) Configure(_ context.Context, config, runtime, version string) (stub.EventMask, error) {
	p.mu.Lock()
	abandoned := p.abandoned
	if !abandoned && p.configured != nil {
		close(p.configured)
		p.configured = nil
	}
	p.mu.Unlock()
	if abandoned {
		return 0, errAbandoned
	}
	log := p.log.WithFields(logrus.Fields{"runtime": runtime, "runtimeVersion": version})
	if config != "" {
		log.Warn("Ignoring the NRI configuration the runtime passed; podres-proxy is configured by flags")
	}
	log.WithField("events", events.PrettyString()).Info("Connected to the runtime's NRI")
	return events, nil
}

// Synchronize reconciles the store with the runtime's full list of pods and
// containers, which the runtime sends on every new connection: listed pods
// and containers are recorded, recorded ones that are not listed are gone.
func (p *handlers) Synchronize(ctx context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	asOf := time.Now() // the runtime holds back other events while it syncs
	p.mu.Lock()
	conn := p.conn
	p.mu.Unlock()
	p.metrics.NRIConnected(true)
	p.log.WithFields(logrus.Fields{"pods": len(pods), "containers": len(ctrs)}).Info("Synchronizing with the runtime")

	containers := make([]model.RuntimeContainer, 0, len(ctrs))
	for _, ctr := range ctrs {
		if ctr.GetId() != "" {
			containers = append(containers, container(nil, ctr, containerState(ctr.GetState())))
		}
	}
	p.update(ctx, "Synchronize", func() {
		sandboxes := make([]model.Sandbox, 0, len(pods))
		for _, pod := range pods {
			if pod.GetId() == "" {
				continue
			}
			sandboxes = append(sandboxes, p.syncedSandbox(pod))
		}
		p.store.Reconcile(record.OriginNRI, asOf, sandboxes, containers, false)
		p.mu.Lock()
		current := p.conn == conn
		if current {
			p.synced = true
		}
		p.mu.Unlock()
		if current && p.onSynced != nil {
			go p.onSynced()
		}
	})
	return nil, nil
}

// syncedSandbox maps a pod listed by Synchronize. NRI does not say whether a
// listed sandbox is ready, and containerd lists stopped ones too: a sandbox
// the store already knows as stopped stays stopped, the others are taken as
// ready. One that stopped while the plugin was disconnected is corrected by
// the CRI reconciler, which sees sandbox states.
func (p *handlers) syncedSandbox(pod *api.PodSandbox) model.Sandbox {
	sb := sandbox(pod, true)
	if r, ok := p.store.Get(sb.UID); ok && r.SandboxID == sb.ID && r.State == record.PhaseStopped {
		sb.Ready = false
	}
	return sb
}

// RunPodSandbox records a pod whose sandbox the runtime has started, with
// its annotations (the scheduler's device allocation).
func (p *handlers) RunPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	if pod.GetId() == "" && pod.GetUid() == "" {
		p.log.Debug("Ignoring RunPodSandbox without a pod")
		return nil
	}
	sb := sandbox(pod, true)
	podLog(p.log, pod).Info("Pod sandbox started")
	p.update(ctx, "RunPodSandbox", func() { p.store.ObserveSandbox(record.OriginNRI, sb) })
	return nil
}

// StopPodSandbox records that a pod's sandbox stopped: its devices must no
// longer be trusted for a pod of the same name.
func (p *handlers) StopPodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	p.sandboxEnded(ctx, "StopPodSandbox", "Pod sandbox stopped", pod, p.store.SandboxStopped)
	return nil
}

// RemovePodSandbox records that a pod's sandbox is gone.
func (p *handlers) RemovePodSandbox(ctx context.Context, pod *api.PodSandbox) error {
	p.sandboxEnded(ctx, "RemovePodSandbox", "Pod sandbox removed", pod, p.store.SandboxRemoved)
	return nil
}

// sandboxEnded records a sandbox event that needs only the pod's ids.
func (p *handlers) sandboxEnded(ctx context.Context, event, msg string, pod *api.PodSandbox, apply func(origin record.Origin, id, uid string)) {
	id, uid := pod.GetId(), pod.GetUid()
	if id == "" && uid == "" {
		p.log.Debugf("Ignoring %s without a pod", event)
		return
	}
	podLog(p.log, pod).Info(msg)
	p.update(ctx, event, func() { apply(record.OriginNRI, id, uid) })
}

// PostCreateContainer records a container the runtime created.
func (p *handlers) PostCreateContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.observeContainer(ctx, "PostCreateContainer", pod, ctr, model.ContainerCreated)
	return nil
}

// PostStartContainer records a container the runtime started.
func (p *handlers) PostStartContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.observeContainer(ctx, "PostStartContainer", pod, ctr, model.ContainerRunning)
	return nil
}

// StopContainer records a container that stopped. The runtime sends it once
// the container has stopped, whether it was asked to or exited by itself.
// The state comes from the event, not from the container, which containerd
// reports as unknown once it has exited.
func (p *handlers) StopContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.observeContainer(ctx, "StopContainer", pod, ctr, model.ContainerStopped)
	return nil, nil
}

// RemoveContainer records a container that is gone.
func (p *handlers) RemoveContainer(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.observeContainer(ctx, "RemoveContainer", pod, ctr, model.ContainerRemoved)
	return nil
}

// observeContainer records a container event. Containers unknown to the
// store (containerd sends Stop and Remove for containers whose creation
// failed) are ignored by the store.
func (p *handlers) observeContainer(ctx context.Context, event string, pod *api.PodSandbox, ctr *api.Container, st model.ContainerState) {
	c := container(pod, ctr, st)
	if c.ID == "" || c.SandboxID == "" {
		p.log.WithField("event", event).Debug("Ignoring a container event without container or sandbox id")
		return
	}
	podLog(p.log, pod).WithFields(logrus.Fields{"container": c.Name, "containerID": c.ID}).Debugf("Container %s", st)
	p.update(ctx, event, func() { p.store.ObserveContainer(record.OriginNRI, c) })
}

// update applies a store update inline, as nri-plugins' handlers do. The
// store decodes annotations before it takes its lock and holds the lock
// only to swap records in, so an update takes microseconds even while a
// hostile pod's annotation is decoded elsewhere; only the event's own pod
// is decoded here. The runtime serializes NRI calls, so updates stay in
// the runtime's order.
func (p *handlers) update(_ context.Context, event string, apply func()) {
	start := time.Now()
	apply()
	p.metrics.NRIEvent(event, time.Since(start))
}

// errAbandoned fails the Configure of a connection Run gave up on.
var errAbandoned = errors.New("the NRI connection was given up: no configuration in time")

// connecting starts a new connection: nothing is synchronized on it yet.
// The channel it returns is closed when the runtime configures it.
func (p *handlers) connecting() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conn++
	p.synced = false
	p.abandoned = false
	p.configured = make(chan struct{})
	return p.configured
}

// abandon makes the current connection's Configure fail from now on.
func (p *handlers) abandon() {
	p.mu.Lock()
	p.abandoned = true
	p.mu.Unlock()
}

// disconnected ends the current connection and reports whether it had been
// synchronized, that is, whether the runtime had accepted the plugin.
func (p *handlers) disconnected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	was := p.synced
	p.conn++
	p.synced = false
	return was
}

// sandbox maps an NRI pod. pod may be nil.
func sandbox(pod *api.PodSandbox, ready bool) model.Sandbox {
	return model.Sandbox{
		ID:          pod.GetId(),
		UID:         pod.GetUid(),
		Namespace:   pod.GetNamespace(),
		Name:        pod.GetName(),
		Annotations: pod.GetAnnotations(),
		Ready:       ready,
	}
}

// container maps an NRI container in state st, of pod when the container
// does not name its sandbox. pod may be nil.
func container(pod *api.PodSandbox, ctr *api.Container, st model.ContainerState) model.RuntimeContainer {
	return model.RuntimeContainer{
		ID:        ctr.GetId(),
		SandboxID: cmp.Or(ctr.GetPodSandboxId(), pod.GetId()),
		Name:      ctr.GetName(),
		State:     st,
		// The annotations the container was created with: a device
		// plugin's (TensorFusion's MIG partitions) are only there.
		Annotations: ctr.GetAnnotations(),
	}
}

// containerState maps the state NRI lists a container in. Synchronize lists
// only created and running containers; a paused container is still there.
func containerState(s api.ContainerState) model.ContainerState {
	switch s {
	case api.ContainerState_CONTAINER_CREATED:
		return model.ContainerCreated
	case api.ContainerState_CONTAINER_RUNNING, api.ContainerState_CONTAINER_PAUSED:
		return model.ContainerRunning
	case api.ContainerState_CONTAINER_STOPPED:
		return model.ContainerStopped
	default:
		return model.ContainerUnknown
	}
}

// podLog names a pod in log lines. pod may be nil or carry only its id.
func podLog(log logrus.FieldLogger, pod *api.PodSandbox) logrus.FieldLogger {
	fields := logrus.Fields{"sandboxID": pod.GetId()}
	if pod.GetName() != "" {
		fields["pod"] = pod.GetNamespace() + "/" + pod.GetName()
	}
	if pod.GetUid() != "" {
		fields["podUID"] = pod.GetUid()
	}
	return log.WithFields(fields)
}
