// Package record is what the state store knows about one pod, the Record:
// its fields, what one fact reported about the pod does to it (change.go),
// and its file format: one JSON file per pod, with a schema version that
// changes only when the format changes incompatibly. The store (package
// state) keeps Records in memory and applies the facts under its lock, and
// package state/persist writes them; this package is what both, and every
// reader of the files (`podres-proxy inspect`), agree on.
// docs/state-format.md describes the format for operators.
package record

import (
	"sort"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

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

// Origin names where a fact came from.
type Origin string

const (
	OriginKubelet Origin = "kubelet" // the kubelet's /pods endpoint
	OriginNRI     Origin = "nri"     // an NRI event or Synchronize
	OriginCRI     Origin = "cri"     // the runtime's CRI ListPodSandbox/ListContainers
)

// Seen says where and when a fact was last learned.
type Seen struct {
	Origin Origin    `json:"source"`
	At     time.Time `json:"at"`
}

// Provenance records where and when each fact of a Record was learned. A
// nil entry means the fact has never been learned.
type Provenance struct {
	Sandbox     *Seen `json:"sandbox,omitempty"`     // sandbox id and State
	Annotations *Seen `json:"annotations,omitempty"` // allocator annotations and Devices
	Spec        *Seen `json:"spec,omitempty"`        // container requests
	Containers  *Seen `json:"containers,omitempty"`  // runtime containers
}

// Container is a runtime container of the pod, as NRI or CRI reported it.
type Container struct {
	Name  string               `json:"name"`
	ID    string               `json:"id"`
	State model.ContainerState `json:"state"`
	// Annotations holds only the container annotations some allocator
	// decodes (a device plugin's, such as TensorFusion's MIG partitions),
	// as the runtime created the container with them; Devices include
	// what they say.
	Annotations map[string]string `json:"annotations,omitempty"`
}

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
	Spec *model.PodSpec `json:"spec,omitempty"`
	// Annotations holds only the annotations some allocator decodes.
	Annotations map[string]string `json:"annotations,omitempty"`
	// Devices are what the allocators decoded from Annotations and the
	// containers' Annotations.
	Devices []model.Device `json:"devices"`
	// DecodeErrors says why an allocator annotation was not understood; the
	// pod is then answered without those devices.
	DecodeErrors []string `json:"decodeErrors,omitempty"`
	// Refused are the decoded devices the proxy does not report, and why
	// (the trust rules in trust/gate.go), as of the last answer
	// computed for the pod: Devices minus what consumers were shown.
	Refused []model.Refused `json:"refused,omitempty"`
	// GPUSlots are the slots this pod is reported with on the GPUs it
	// shares as other than their first live sharer, by GPU UUID in lower
	// case ("<uuid>::<slot>", trust/sharedgpu.go): kept so that a pod
	// keeps its slot for its life, daemon restarts included.
	GPUSlots map[string]int `json:"gpuSlots,omitempty"`
	// Edited are the allocation annotation keys whose value in the API
	// (the last /pods read) differs from the one the runtime started the
	// sandbox with, or that the API no longer has. The runtime's value is
	// kept: an allocation is fixed when the sandbox starts.
	Edited []string `json:"edited,omitempty"`
	// Provenance says where and when each fact was last learned (the file
	// keeps the name "sources").
	Provenance Provenance `json:"sources"`
	// UpdatedAt is when the record last changed.
	UpdatedAt time.Time `json:"updatedAt"`
	// RemovedAt is when the record entered PhaseRemoved; it is pruned a grace
	// period later.
	RemovedAt *time.Time `json:"removedAt,omitempty"`
}

// Key is the namespace and name a PodResources answer identifies pods by.
func (r *Record) Key() model.PodKey { return model.PodKey{Namespace: r.Namespace, Name: r.Name} }

// Live reports whether the record is a running sandbox the runtime told us
// about. Only live records may answer a query without a fresh /pods read:
// PodResources has no UID, and a pod recreated under the same name must
// never get its predecessor's devices.
func (r *Record) Live() bool {
	if r.State != PhaseReady || r.SandboxID == "" || r.Provenance.Sandbox == nil {
		return false
	}
	src := r.Provenance.Sandbox.Origin
	return src == OriginNRI || src == OriginCRI
}

// Sort sorts records by namespace, name and UID.
func Sort(rs []*Record) {
	sort.Slice(rs, func(i, j int) bool {
		a, b := rs[i], rs[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.UID < b.UID
	})
}
