package state

import "time"

// SchemaVersion is the version of the on-disk record format. It is written
// into every file and changes only when the format changes incompatibly; a
// file with another version is set aside, never guessed at.
const SchemaVersion = 3

// Phase is a pod's lifecycle as far as this node knows it.
type Phase string

const (
	// PhasePending: the pod was seen in the kubelet's /pods but no sandbox
	// has been recorded for it yet (this is when Multus asks, during CNI ADD).
	PhasePending Phase = "pending"
	// PhaseReady: the runtime reported the pod's sandbox as running.
	PhaseReady Phase = "ready"
	// PhaseStopped: the sandbox was stopped; the pod may still be listed by
	// the kubelet but its allocation must not be trusted for a new pod of
	// the same name.
	PhaseStopped Phase = "stopped"
	// PhaseRemoved: the sandbox (or the pending pod) is gone; the record is
	// kept for the prune grace period so operators can still inspect it.
	PhaseRemoved Phase = "removed"
)

// Source names where a fact came from.
type Source string

const (
	SourceKubelet Source = "kubelet" // the kubelet's /pods endpoint
	SourceNRI     Source = "nri"     // an NRI event or Synchronize
	SourceCRI     Source = "cri"     // the runtime's CRI ListPodSandbox/ListContainers
)

// Seen says where and when a fact was last learned.
type Seen struct {
	Source Source    `json:"source"`
	At     time.Time `json:"at"`
}

// Sources records the provenance of each fact of a Record. A nil entry means
// the fact has never been learned.
type Sources struct {
	Sandbox     *Seen `json:"sandbox,omitempty"`     // sandbox id and State
	Annotations *Seen `json:"annotations,omitempty"` // allocator annotations and Devices
	Spec        *Seen `json:"spec,omitempty"`        // container requests
	Containers  *Seen `json:"containers,omitempty"`  // runtime containers
}

// ContainerState is a runtime container's state.
type ContainerState string

const (
	ContainerCreated ContainerState = "created"
	ContainerRunning ContainerState = "running"
	ContainerStopped ContainerState = "stopped"
	ContainerRemoved ContainerState = "removed"
	ContainerUnknown ContainerState = "unknown"
)

// Container is a runtime container of the pod, as NRI or CRI reported it.
type Container struct {
	Name  string         `json:"name"`
	ID    string         `json:"id"`
	State ContainerState `json:"state"`
}

// ContainerKind says how the kubelet treats a container in PodResources:
// sidecars (restartable init containers) are listed before app containers,
// plain init containers are never listed, v1alpha1 lists app containers only.
type ContainerKind string

const (
	KindInit    ContainerKind = "init"
	KindSidecar ContainerKind = "sidecar"
	KindApp     ContainerKind = "app"
)

// ContainerSpec is what the pod spec says about one container: its kind and
// the extended resources it requests (limits where set, else requests; cpu,
// memory, ephemeral-storage and hugepages are left out).
type ContainerSpec struct {
	Name     string            `json:"name"`
	Kind     ContainerKind     `json:"kind"`
	Requests map[string]string `json:"requests,omitempty"`
}

// PodSpec is the part of a pod spec that device attribution needs, in spec
// order: init containers (plain and sidecar) first, then app containers.
// NRI does not carry it, so it is learned from the kubelet's /pods once per
// pod UID; it does not change during a pod's life.
type PodSpec struct {
	// SchedulerName is the pod's spec.schedulerName. An allocator's
	// annotation is believed only on a pod its scheduler placed (see
	// proxy/allocator/trust.go); empty in records written before it was
	// kept, which are read from /pods again before they are believed.
	SchedulerName string          `json:"schedulerName,omitempty"`
	Containers    []ContainerSpec `json:"containers"`
}

// Device is one allocated device decoded from a scheduler's annotation.
type Device struct {
	// Allocator is the decoder that produced it ("koordinator", "hami"...).
	Allocator string `json:"allocator"`
	// Type is the allocator's own device type ("gpu", "rdma", "fpga").
	Type string `json:"type,omitempty"`
	// Resource is the PodResources resource_name the device is reported as.
	Resource string `json:"resource"`
	// IDs are the device ids reported for this device: a GPU UUID, the VF
	// PCI addresses of an RDMA allocation, or the PF address when there are
	// no VFs. Each becomes one ContainerDevices entry. Empty when the
	// allocator named the device only by Minor and no inventory translated it.
	IDs []string `json:"ids"`
	// Minor is the device minor when the allocator gave one.
	Minor *int64 `json:"minor,omitempty"`
	// Parent is the GPU a MIG instance (IDs ["MIG-<uuid>"]) is carved
	// from, when the allocator says: the inventory knows whole GPUs only,
	// so the instance is reported on its parent's NUMA node.
	Parent string `json:"parent,omitempty"`
	// Shared is true when only a share of the device was allocated (for
	// example koordinator.sh/gpu-core: 50); every container that requests a
	// share of it gets it.
	Shared bool `json:"shared,omitempty"`
	// ContainerIndex is set by allocators that allocate per container (HAMi,
	// Volcano vGPU): the position in the allocator's own container list, or
	// with ScopeRequestingAll the rank among its non-empty entries. Nil
	// means the allocation is pod-level and attribution follows the pod spec.
	ContainerIndex *int `json:"containerIndex,omitempty"`
	// Container is the name of the container the allocator gave the device
	// to, for allocators that name containers (TensorFusion's
	// container-gpus); it takes precedence over ContainerIndex.
	Container string `json:"container,omitempty"`
	// ContainerScope says which containers of the pod spec the allocator's
	// list covers, that is what ContainerIndex counts; empty is ScopeAll.
	ContainerScope ContainerScope `json:"containerScope,omitempty"`
	// ContainerCount is the length of the allocator's container list (with
	// ScopeRequestingAll, its non-empty entries), 0 when unknown. For
	// ScopeAll, ScopeApp and ScopeRequesting, when it disagrees with the
	// scope's size, the scope whose size it matches is used instead.
	ContainerCount int `json:"containerCount,omitempty"`
	// Index is the vendor's enumeration index (nvidia-smi index) when the
	// allocator named the device by it (Volcano gpushare); like Minor, it is
	// translated to an id through the node's device inventory.
	Index *int64 `json:"index,omitempty"`
	// Replace means the ids replace what the kubelet itself reported for
	// Resource in that container instead of being appended to it.
	Replace bool `json:"replace,omitempty"`
	// CountsRequests means the allocator counted the pod's requests for this
	// device in devices, not in its usual unit (Koordinator's
	// RequestsAsCount strategy: koordinator.sh/rdma: 1 is one VF, not 1% of
	// a NIC); attribution reads the containers' requests the same way.
	CountsRequests bool `json:"countsRequests,omitempty"`
}

// Refused is a decoded device that was not reported, and why. Reason is
// one of the trust rules' reasons (a metric label too); Class tells an
// operator whether the annotation looks forged ("forged": it names a device
// the pod has no right to) or broken ("malformed": an id no device can
// have), or the pod could not be checked yet ("unvetted").
type Refused struct {
	Allocator string   `json:"allocator"`
	Resource  string   `json:"resource"`
	IDs       []string `json:"ids"`
	Reason    string   `json:"reason"`
	Class     string   `json:"class"`
	Detail    string   `json:"detail,omitempty"`
}

// ContainerScope names the containers of a PodSpec that a per-container
// allocator's list covers, in PodSpec order.
type ContainerScope string

const (
	// ScopeAll: every container, init and sidecar containers first (HAMi
	// since its PR #1650, as schema-1 records read it; no decoder writes it
	// any more).
	ScopeAll ContainerScope = ""
	// ScopeApp: the app containers only (HAMi before that; likewise).
	ScopeApp ContainerScope = "app"
	// ScopeRequesting: the app containers that request the device, as the
	// allocator's decoder judges requests (Volcano vGPU).
	ScopeRequesting ContainerScope = "requesting"
	// ScopeRequestingAll: every container that requests the device, init
	// and sidecar containers first, as the allocator's decoder judges
	// requests; ContainerIndex then counts the allocator's non-empty entries
	// (HAMi, whose device plugin hands its k-th non-empty entry to the k-th
	// container asking for the vendor's resource, whatever the list's
	// padding).
	ScopeRequestingAll ContainerScope = "requesting-all"
)

// Record is everything the node knows about one pod, keyed by UID. A Record
// returned by the Store is shared and must not be modified.
type Record struct {
	// SchemaVersion is the file format's version, SchemaVersion when written.
	SchemaVersion int `json:"schemaVersion"`
	// UID is the pod's UID, the key; the record's file is named after it.
	UID string `json:"uid"`
	// Namespace and Name identify the pod the way PodResources does.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// SandboxID is the runtime's sandbox id; empty while pending.
	SandboxID string `json:"sandboxID,omitempty"`
	// State is the pod's lifecycle on this node (see Phase).
	State Phase `json:"state"`
	// KubeletPhase is the pod phase /pods last reported (Pending, Running,
	// Succeeded, Failed), empty if never seen there.
	KubeletPhase string `json:"kubeletPhase,omitempty"`
	// Containers are the runtime containers of the current sandbox.
	Containers []Container `json:"containers"`
	// Spec is nil until a /pods read has seen the pod.
	Spec *PodSpec `json:"spec,omitempty"`
	// Annotations holds only the annotations some allocator decodes.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Devices are what the allocators decoded from Annotations.
	Devices []Device `json:"devices"`
	// DecodeErrors says why an allocator annotation was not understood; the
	// pod is then answered without those devices.
	DecodeErrors []string `json:"decodeErrors,omitempty"`
	// Refused are the decoded devices the proxy does not report, and why
	// (the trust rules in proxy/allocator/trust.go), as of the last answer
	// computed for the pod: Devices minus what consumers were shown.
	Refused []Refused `json:"refused,omitempty"`
	// GPUSlots are the slots this pod is reported with on the GPUs it
	// shares as other than their first live sharer, by GPU UUID in lower
	// case ("<uuid>::<slot>", proxy/allocator/sharedgpu.go): kept so that
	// a pod keeps its slot for its life, daemon restarts included.
	GPUSlots map[string]int `json:"gpuSlots,omitempty"`
	// Edited are the allocation annotation keys whose value in the API
	// (the last /pods read) differs from the one the runtime started the
	// sandbox with, or that the API no longer has. The runtime's value is
	// kept: an allocation is fixed when the sandbox starts.
	Edited []string `json:"edited,omitempty"`
	// Sources says where and when each fact was last learned.
	Sources Sources `json:"sources"`
	// UpdatedAt is when the record last changed.
	UpdatedAt time.Time `json:"updatedAt"`
	// RemovedAt is when the record entered PhaseRemoved; it is pruned a grace
	// period later.
	RemovedAt *time.Time `json:"removedAt,omitempty"`
}

// Key is the namespace and name a PodResources answer identifies pods by.
func (r *Record) Key() PodKey { return PodKey{Namespace: r.Namespace, Name: r.Name} }

// Live reports whether the record is a running sandbox the runtime told us
// about. Only live records may answer a query without a fresh /pods read:
// PodResources has no UID, and a pod recreated under the same name must
// never get its predecessor's devices.
func (r *Record) Live() bool {
	if r.State != PhaseReady || r.SandboxID == "" || r.Sources.Sandbox == nil {
		return false
	}
	src := r.Sources.Sandbox.Source
	return src == SourceNRI || src == SourceCRI
}

// PodKey identifies a pod the way PodResources does.
type PodKey struct {
	Namespace string
	Name      string
}

func (k PodKey) String() string { return k.Namespace + "/" + k.Name }

// PodRef names a pod in logs and errors.
type PodRef struct {
	UID       string
	Namespace string
	Name      string
}

func (p PodRef) String() string { return p.Namespace + "/" + p.Name + " (uid " + p.UID + ")" }

// Sandbox is what the runtime reports about a pod sandbox, through NRI or CRI.
type Sandbox struct {
	ID          string
	UID         string
	Namespace   string
	Name        string
	Annotations map[string]string
	// Ready is false for a sandbox the runtime lists as not ready (stopped).
	Ready bool
}

// RuntimeContainer is what the runtime reports about a container.
type RuntimeContainer struct {
	ID        string
	SandboxID string
	Name      string
	State     ContainerState
}

// KubeletPod is what a /pods read says about one pod.
type KubeletPod struct {
	UID         string
	Namespace   string
	Name        string
	Phase       string // Pending, Running, Succeeded, Failed, Unknown
	Annotations map[string]string
	Spec        PodSpec
}

// Terminal reports whether the kubelet considers the pod finished.
func (p *KubeletPod) Terminal() bool { return p.Phase == "Succeeded" || p.Phase == "Failed" }
