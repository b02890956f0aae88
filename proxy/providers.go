package proxy

import (
	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/trust"
)

// Providers are what the server composes its answers from, gathered in one
// struct as the kubelet's PodResourcesProviders are. The upstream kubelet,
// dialled from Config, says which pods and containers exist; these say which
// devices each pod gets and where they sit.
type Providers struct {
	// Store holds the pods' records: their sandboxes, specs and decoded
	// devices.
	Store *state.Store
	// Pods reads the kubelet's /pods. The server shares reads between
	// concurrent queries (kubeletpods.Reader) and records each read in
	// Store. Nil answers pods unknown to the store with Unavailable.
	Pods kubeletpods.Fetch
	// PodLogs is the kubelet's pod logs directory: while it shows that no
	// sandbox began since the last /pods read, that read says which pod a
	// name not running is, and a query about one costs no read (package
	// podlogs). Nil: such a pod is read again for every query.
	PodLogs *podlogs.Dir
	// Watching reports whether a kubelet watch (the Pods API) keeps the
	// store's names current (resolve.Options.Watching); nil: never.
	Watching func() bool
	// Allocators attribute a pod's devices to its containers.
	Allocators *allocator.Set
	// Inventory returns the current device inventory snapshot: the
	// devices' NUMA nodes, the allocatable devices and the translation of
	// devices named by minor or index. Each pod's plan is computed from one
	// snapshot (package plans). Nil: no inventory.
	Inventory func() *inventory.Snapshot
	// InventoryChanged, when set, returns a channel closed at the
	// inventory's next change (inventory.Inventory.Changed), so that plans
	// follow the inventory before a query asks.
	InventoryChanged func() <-chan struct{}
	// ResourceNames name the inventory's devices in GetAllocatableResources;
	// nil means inventory.DefaultResourceNames.
	ResourceNames inventory.ResourceNames
	// Trust decides which decoded devices are reported (package trust).
	// Required: any tenant can annotate its own pod, so no device is
	// reported that the gate has not vetted.
	Trust   *trust.Gate
	Metrics *metrics.Metrics
	// MIGResource, when set, is the resource MIG instances are reported
	// as (e.g. nvidia.com/mig-1g.10gb); empty keeps their GPU's.
	MIGResource string
	// Fold folds DRA devices into the legacy view's answers (package
	// dra); required when a socket serves merge.Legacy.
	Fold Folder
	// DeviceInfo writes the NPWG device-info files of the VFs and RDMA
	// devices pods are answered with; nil writes none.
	DeviceInfo plans.DeviceInfoWriter
	// Report is told the pods' decisions when they change (Events); nil
	// reports none.
	Report plans.Reporter
}
