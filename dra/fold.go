// Package dra folds devices a DRA driver allocated for a container's
// extended resource (KEP-5004) into the container's `devices`, as the
// device-plugin path would have reported them: the extended resource's name,
// the device's id in the spelling consumers match (GPU UUID, PCI address),
// its NUMA node. The kubelet reports such devices only under
// `dynamic_resources`, which NFD, resource-topology-exporter and nri-plugins
// never read. docs/dra.md has the design: where each fact comes from and why.
//
// FoldPod and Allocatable are pure: given the kubelet's answer and the facts
// (the pod's extended resource claim, the claim's allocation, the node's
// ResourceSlices and DeviceClasses), they edit the answer. Only devices the
// kubelet itself listed under a container are ever folded into that
// container: the other facts only name and attribute them. View wires them
// to their sources for the proxy.
package dra

import (
	"cmp"
	"slices"
	"strings"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
)

// DeviceRef names a DRA device as PodResources and ResourceClaims do.
type DeviceRef struct {
	Driver, Pool, Device string
}

func (r DeviceRef) String() string { return r.Driver + "/" + r.Pool + "/" + r.Device }

// Device is what the node's ResourceSlices say about one device: the id
// consumers match it by and its NUMA node (negative: unknown).
type Device struct {
	ID       string
	NUMANode int64
}

// Allocation is a ResourceClaim's status.allocation.devices.results: the
// devices each request got.
type Allocation map[string][]DeviceRef

// Facts are what the folding knows besides the kubelet's answer.
type Facts struct {
	// Devices are the node's devices, from its ResourceSlices.
	Devices map[DeviceRef]Device
	// ClassResources maps a driver to the extended resource a DeviceClass
	// gives all of its devices (read by resourceapi):
	// GetAllocatableResources lists them.
	ClassResources map[string]string
	// DriverResources is the operator's mapping of a driver to a resource
	// name (--dra-resource): a pod's own claims of that driver are folded
	// too, and its devices are allocatable.
	DriverResources map[string]string
}

// PodFacts are the facts about one pod.
type PodFacts struct {
	// Claim is the pod's status.extendedResourceClaimStatus; nil when none.
	Claim *model.ExtendedResourceClaim
	// Allocation is Claim's allocation; nil when it was not read. It is
	// needed only when the claim answers several containers or resources.
	Allocation Allocation
}

// Unfolded reasons: why a device the kubelet reported stays under
// dynamic_resources only.
const (
	// ReasonNoSlice: no ResourceSlice of the node lists the device.
	ReasonNoSlice = "no-resourceslice"
	// ReasonNoID: the device's slice gives none of the id attributes.
	ReasonNoID = "no-id-attribute"
	// ReasonUnattributed: the claim serves several containers or
	// resources and its allocation is unknown, or names no request of
	// this container for the device.
	ReasonUnattributed = "claim-allocation-unknown"
)

// Unfolded is a device of the pod's extended resource claim, or of a
// mapped driver, that stays under dynamic_resources only.
type Unfolded struct {
	Container string
	Device    DeviceRef
	Reason    string
}

// FoldPod adds to each container of pod (a v1 PodResources from the
// kubelet, edited in place) the devices of its dynamic_resources that
// answer an extended resource: those of the pod's extended resource claim,
// attributed to the container's requests, and those of drivers the
// operator mapped. One ContainerDevices per id; an id the container
// already lists under that resource is not added again. Every folded
// device is then removed from the dynamic_resources of every container of
// the pod (a claim left without devices is dropped), so that a consumer
// reading both never sees it twice. It returns the devices it could not
// fold.
func FoldPod(pod *v1.PodResources, pf PodFacts, f Facts) []Unfolded {
	if pod == nil {
		return nil
	}
	var unfolded []Unfolded
	folded := map[claimDevice]bool{}
	special := pf.Claim != nil && pf.Claim.ClaimName != ""
	for _, c := range pod.GetContainers() {
		if c == nil {
			continue
		}
		for _, dr := range c.GetDynamicResources() {
			isSpecial := special && isClaim(dr, pod, pf.Claim)
			for _, cr := range dr.GetClaimResources() {
				ref := DeviceRef{Driver: cr.GetDriverName(), Pool: cr.GetPoolName(), Device: cr.GetDeviceName()}
				var resource string
				if isSpecial {
					resource = attribute(ref, c.GetName(), pf)
					if resource == "" {
						if !ownedElsewhere(ref, c.GetName(), pf) {
							unfolded = append(unfolded, Unfolded{c.GetName(), ref, ReasonUnattributed})
						}
						continue
					}
				} else if resource = f.DriverResources[ref.Driver]; resource == "" {
					continue // a pod's own claim: dynamic_resources only
				}
				d, ok := f.Devices[ref]
				switch {
				case !ok:
					unfolded = append(unfolded, Unfolded{c.GetName(), ref, ReasonNoSlice})
					continue
				case d.ID == "":
					unfolded = append(unfolded, Unfolded{c.GetName(), ref, ReasonNoID})
					continue
				}
				folded[claimDevice{dr.GetClaimName(), ref}] = true
				if !lists(c, resource, d.ID) {
					c.Devices = append(c.Devices, containerDevice(resource, d))
				}
			}
		}
	}
	if len(folded) > 0 {
		for _, c := range pod.GetContainers() {
			if c != nil {
				c.DynamicResources = without(c.DynamicResources, folded)
			}
		}
	}
	return unfolded
}

// isClaim reports whether dr is the pod's extended resource claim.
func isClaim(dr *v1.DynamicResource, pod *v1.PodResources, claim *model.ExtendedResourceClaim) bool {
	ns := cmp.Or(dr.GetClaimNamespace(), pod.GetNamespace())
	return dr.GetClaimName() == claim.ClaimName && ns == pod.GetNamespace()
}

// attribute returns the extended resource that ref answers for container,
// or "" when it answers none of its requests or that is not known. With
// the claim's allocation, the device is the container's when a request
// mapped to the container got it. Without, the claim's devices are all the
// container's when every request of the claim is the container's and for
// one resource. (Counting the containers the kubelet lists the claim under
// would not do: it lists no plain init container, whose requests the
// claim may hold too.)
func attribute(ref DeviceRef, container string, pf PodFacts) string {
	if pf.Allocation != nil {
		for _, m := range pf.Claim.Requests {
			if m.Container == container && slices.Contains(pf.Allocation[m.Request], ref) {
				return m.Resource
			}
		}
		return ""
	}
	var only string
	for _, m := range pf.Claim.Requests {
		if m.Container != container || (only != "" && only != m.Resource) {
			return ""
		}
		only = m.Resource
	}
	return only
}

// ownedElsewhere reports whether the claim's allocation gives ref to
// another container's request: the kubelet lists every device of the
// claim under every container that has a request of it, and the device is
// then that container's, not missing.
func ownedElsewhere(ref DeviceRef, container string, pf PodFacts) bool {
	if pf.Allocation == nil {
		return false
	}
	for _, m := range pf.Claim.Requests {
		if m.Container != container && slices.Contains(pf.Allocation[m.Request], ref) {
			return true
		}
	}
	return false
}

// lists reports whether c already lists id under resource.
func lists(c *v1.ContainerResources, resource, id string) bool {
	for _, d := range c.GetDevices() {
		if d.GetResourceName() == resource && slices.Contains(d.GetDeviceIds(), id) {
			return true
		}
	}
	return false
}

func containerDevice(resource string, d Device) *v1.ContainerDevices {
	cd := &v1.ContainerDevices{ResourceName: resource, DeviceIds: []string{d.ID}}
	if d.NUMANode >= 0 {
		cd.Topology = &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: d.NUMANode}}}
	}
	return cd
}

// claimDevice is a device of one of the pod's claims: a device is removed
// from the claim it was folded from, never from another claim of the pod
// that shares it.
type claimDevice struct {
	claim string
	ref   DeviceRef
}

// without returns drs less the claim resources of the folded devices,
// dropping claims left without any.
func without(drs []*v1.DynamicResource, folded map[claimDevice]bool) []*v1.DynamicResource {
	out := drs[:0]
	for _, dr := range drs {
		if dr == nil {
			continue
		}
		had := len(dr.ClaimResources)
		dr.ClaimResources = slices.DeleteFunc(dr.ClaimResources, func(cr *v1.ClaimResource) bool {
			return folded[claimDevice{dr.GetClaimName(), DeviceRef{Driver: cr.GetDriverName(), Pool: cr.GetPoolName(), Device: cr.GetDeviceName()}}]
		})
		if had > 0 && len(dr.ClaimResources) == 0 {
			continue
		}
		out = append(out, dr)
	}
	clear(drs[len(out):])
	return out
}

// Allocatable returns the node's devices that DeviceClasses with an
// extended resource name, or the operator's mapping, make allocatable as a
// resource, one ContainerDevices per id, in a stable order, less those
// existing already lists (the kubelet's own device plugins).
func Allocatable(f Facts, existing []*v1.ContainerDevices) []*v1.ContainerDevices {
	refs := make([]DeviceRef, 0, len(f.Devices))
	for ref := range f.Devices {
		refs = append(refs, ref)
	}
	slices.SortFunc(refs, func(a, b DeviceRef) int {
		return cmp.Or(strings.Compare(a.Driver, b.Driver), strings.Compare(a.Pool, b.Pool), strings.Compare(a.Device, b.Device))
	})
	seen := map[[2]string]bool{}
	for _, d := range existing {
		for _, id := range d.GetDeviceIds() {
			seen[[2]string{d.GetResourceName(), id}] = true
		}
	}
	var out []*v1.ContainerDevices
	for _, ref := range refs {
		resource := cmp.Or(f.DriverResources[ref.Driver], f.ClassResources[ref.Driver])
		d := f.Devices[ref]
		if resource == "" || d.ID == "" || seen[[2]string{resource, d.ID}] {
			continue
		}
		seen[[2]string{resource, d.ID}] = true
		out = append(out, containerDevice(resource, d))
	}
	return out
}
