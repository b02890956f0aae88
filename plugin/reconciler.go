package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podres-proxy/podres-proxy/internal/unixsock"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// Defaults for CRIOptions.
const (
	DefaultReconcileInterval = 30 * time.Second
	DefaultCRITimeout        = 5 * time.Second
)

// maxCRIMessageSize is the largest CRI answer accepted, the kubelet's own
// limit: a node with many containers exceeds gRPC's default of 4 MiB.
const maxCRIMessageSize = 16 << 20

// CRIOptions configure a Reconciler. Zero values mean the defaults.
type CRIOptions struct {
	// Endpoint is the runtime's CRI socket, as a unix:// URL or a path,
	// e.g. unix:///run/containerd/containerd.sock.
	Endpoint string
	// Interval is the time between reconciles.
	Interval time.Duration
	// Timeout bounds each CRI call.
	Timeout time.Duration
	// Log receives the reconciler's messages; nil means logrus's standard
	// logger.
	Log logrus.FieldLogger
	// Metrics receives counters; nil discards them.
	Metrics Metrics
}

// Reconciler brings the store in line with what the runtime lists over CRI,
// which closes the gaps NRI leaves (missed events, containerd's skipped
// Stop and Remove events after it restarts).
type Reconciler struct {
	store   *state.Store
	opts    CRIOptions
	target  string        // gRPC target, unix:///path
	trigger chan struct{} // asks Run for a reconcile now
}

// NewReconciler returns a reconciler of store against the runtime at
// opts.Endpoint. It does not connect: the runtime may not be up yet.
func NewReconciler(store *state.Store, opts CRIOptions) (*Reconciler, error) {
	if store == nil {
		return nil, errors.New("creating CRI reconciler: nil state store")
	}
	target, err := unixsock.Target(opts.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("creating CRI reconciler: %w", err)
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultReconcileInterval
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultCRITimeout
	}
	opts.Log = cmp.Or[logrus.FieldLogger](opts.Log, logrus.StandardLogger())
	if opts.Metrics == nil {
		opts.Metrics = noMetrics{}
	}
	return &Reconciler{store: store, opts: opts, target: target, trigger: make(chan struct{}, 1)}, nil
}

// Run reconciles at once and then every Interval until ctx is done, and
// returns nil. A failed reconcile (runtime socket missing, runtime
// restarting) is logged and tried again at the next interval.
func (r *Reconciler) Run(ctx context.Context) error {
	log := r.opts.Log.WithField("endpoint", r.target)
	ticker := time.NewTicker(r.opts.Interval)
	defer ticker.Stop()
	failing := false
	for {
		err := r.ReconcileOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err != nil && !failing:
			log.WithError(err).Warnf("CRI reconcile failed; retrying every %s", r.opts.Interval)
		case err != nil:
			log.WithError(err).Debug("CRI reconcile failed again")
		case failing:
			log.Info("CRI reconcile works again")
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-r.trigger:
		}
	}
}

// Trigger asks Run to reconcile now rather than at the next interval; it
// never blocks, and triggers that arrive while one is pending are merged.
// The daemon calls it when the NRI plugin has re-synchronized after a
// reconnect: NRI's Synchronize does not say which sandboxes are stopped,
// and CRI does.
func (r *Reconciler) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// ReconcileOnce lists the runtime's pod sandboxes and containers over CRI
// and reconciles the store with them (state.Store.Reconcile): listed
// Kubernetes pods and their containers are recorded, recorded ones that are
// not listed are removed, and anything the store learned after the listing
// began is kept. It fails, changing nothing, when the runtime cannot be
// dialled or either list fails.
//
// It connects afresh every time, so that a restarted runtime (a new socket)
// or one that was not up yet is found without waiting out gRPC's reconnect
// backoff; a reconcile every half minute costs one connect.
func (r *Reconciler) ReconcileOnce(ctx context.Context) (err error) {
	start := time.Now()
	defer func() { r.opts.Metrics.CRIReconciled(time.Since(start), err) }()
	asOf, pods, ctrs, err := r.list(ctx)
	if err != nil {
		return err
	}
	sandboxes, containers := fromCRI(pods, ctrs)
	r.store.Reconcile(record.OriginCRI, asOf, sandboxes, containers, true)
	r.opts.Log.WithFields(logrus.Fields{
		"pods": len(sandboxes), "containers": len(containers), "took": time.Since(start),
	}).Debug("Reconciled the state store with CRI")
	return nil
}

// list dials the runtime and lists its pod sandboxes and containers, each
// call bounded by the Timeout; asOf is when the listing began.
func (r *Reconciler) list(ctx context.Context) (asOf time.Time, pods []*criv1.PodSandbox, ctrs []*criv1.Container, err error) {
	conn, err := grpc.NewClient(r.target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxCRIMessageSize)))
	if err != nil {
		return asOf, nil, nil, fmt.Errorf("connecting to CRI at %s: %w", r.target, err)
	}
	defer conn.Close()
	client := criv1.NewRuntimeServiceClient(conn)

	asOf = time.Now()
	callCtx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	podsResp, err := client.ListPodSandbox(callCtx, &criv1.ListPodSandboxRequest{})
	cancel()
	if err != nil {
		return asOf, nil, nil, fmt.Errorf("listing pod sandboxes from CRI at %s: %w", r.target, err)
	}
	callCtx, cancel = context.WithTimeout(ctx, r.opts.Timeout)
	ctrsResp, err := client.ListContainers(callCtx, &criv1.ListContainersRequest{})
	cancel()
	if err != nil {
		return asOf, nil, nil, fmt.Errorf("listing containers from CRI at %s: %w", r.target, err)
	}
	return asOf, podsResp.GetItems(), ctrsResp.GetContainers(), nil
}

// fromCRI returns what a CRI listing says of Kubernetes pods, as the store
// records it: each sandbox with an id and a pod UID (others are not
// Kubernetes pods), and each container with an id of such a sandbox. It
// never fails; a nil entry or field reads as empty.
func fromCRI(pods []*criv1.PodSandbox, ctrs []*criv1.Container) ([]model.Sandbox, []model.RuntimeContainer) {
	sandboxes := make([]model.Sandbox, 0, len(pods))
	k8s := make(map[string]bool, len(pods))
	for _, pod := range pods {
		md := pod.GetMetadata()
		if pod.GetId() == "" || md.GetUid() == "" {
			continue // not a Kubernetes pod
		}
		k8s[pod.GetId()] = true
		sandboxes = append(sandboxes, model.Sandbox{
			ID:          pod.GetId(),
			UID:         md.GetUid(),
			Namespace:   md.GetNamespace(),
			Name:        md.GetName(),
			Annotations: pod.GetAnnotations(),
			Ready:       pod.GetState() == criv1.PodSandboxState_SANDBOX_READY,
		})
	}
	containers := make([]model.RuntimeContainer, 0, len(ctrs))
	for _, ctr := range ctrs {
		if ctr.GetId() == "" || !k8s[ctr.GetPodSandboxId()] {
			continue
		}
		containers = append(containers, model.RuntimeContainer{
			ID:          ctr.GetId(),
			SandboxID:   ctr.GetPodSandboxId(),
			Name:        ctr.GetMetadata().GetName(),
			State:       criContainerState(ctr.GetState()),
			Annotations: ctr.GetAnnotations(), // a device plugin's are only there
		})
	}
	return sandboxes, containers
}

// criContainerState maps a CRI container state.
func criContainerState(s criv1.ContainerState) model.ContainerState {
	switch s {
	case criv1.ContainerState_CONTAINER_CREATED:
		return model.ContainerCreated
	case criv1.ContainerState_CONTAINER_RUNNING:
		return model.ContainerRunning
	case criv1.ContainerState_CONTAINER_EXITED:
		return model.ContainerStopped
	default:
		return model.ContainerUnknown
	}
}
