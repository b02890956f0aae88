package model

import "strings"

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

// PodSpec is the part of a pod spec that device attribution needs, in spec
// order: init containers (plain and sidecar) first, then app containers.
// NRI does not carry it, so it is learned from the kubelet's /pods once per
// pod UID; it does not change during a pod's life.
type PodSpec struct {
	// SchedulerName is the pod's spec.schedulerName. An allocator's
	// annotation is believed only on a pod its scheduler placed (see
	// trust/gate.go); empty in records written before it was
	// kept, which are read from /pods again before they are believed.
	SchedulerName string          `json:"schedulerName,omitempty"`
	Containers    []ContainerSpec `json:"containers"`
}

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

// ContainerKind says how the kubelet treats a container in PodResources:
// sidecars (restartable init containers) are listed before app containers,
// plain init containers are never listed, v1alpha1 lists app containers only.
type ContainerKind string

const (
	KindInit    ContainerKind = "init"
	KindSidecar ContainerKind = "sidecar"
	KindApp     ContainerKind = "app"
)

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
	// Annotations are those the container was created with (the kubelet's
	// and its device plugins'), not the pod's.
	Annotations map[string]string
}

// KubeletPod is what a /pods read says about one pod.
type KubeletPod struct {
	UID         string
	Namespace   string
	Name        string
	Phase       string // Pending, Running, Succeeded, Failed, Unknown
	Annotations map[string]string
	Spec        PodSpec
	// ExtendedResourceClaim is the pod's status.extendedResourceClaimStatus:
	// nil unless the scheduler satisfied an extended resource from a DRA
	// driver (KEP-5004). It is set once, at binding, and never changes.
	ExtendedResourceClaim *ExtendedResourceClaim
}

// ExtendedResourceClaim is a pod's status.extendedResourceClaimStatus: the
// special ResourceClaim the scheduler made for the pod's extended resources
// that DRA devices satisfy, and which container's extended resource became
// which request of it. The package dra reads it to tell which of the
// claim's devices answer which container's extended resource.
type ExtendedResourceClaim struct {
	ClaimName string
	Requests  []ExtendedResourceRequest
}

// ExtendedResourceRequest is one of the claim's request mappings.
type ExtendedResourceRequest struct {
	Container string
	Resource  string
	Request   string
}

// Terminal reports whether the kubelet considers the pod finished.
func (p *KubeletPod) Terminal() bool { return p.Phase == "Succeeded" || p.Phase == "Failed" }

// ContainerState is a runtime container's state.
type ContainerState string

const (
	ContainerCreated ContainerState = "created"
	ContainerRunning ContainerState = "running"
	ContainerStopped ContainerState = "stopped"
	ContainerRemoved ContainerState = "removed"
	ContainerUnknown ContainerState = "unknown"
)

// ExtendedResource reports whether a container resource can be a device:
// anything but the kubelet's own cpu, memory, ephemeral-storage and
// hugepages-<size>, which no allocator annotates. Both kubelet pod sources
// (/pods, the Pods API) keep only these of a container's requests.
func ExtendedResource(name string) bool {
	switch name {
	case "cpu", "memory", "ephemeral-storage":
		return false
	}
	return !strings.HasPrefix(name, "hugepages-")
}
