// Package hami decodes HAMi's allocations (hami.io/<vendor>-devices-allocated
// and the MIG instances of hami.io/vgpu-mig-allocations) in HAMi's list
// format, which Volcano's vGPU plugin writes too (DecodeList).
//
// hami.io/<vendor>-devices-allocated (hami.io/vgpu-devices-allocated for
// NVIDIA; not the in-flight -devices-to-allocate keys) holds one entry per
// container, each ended by ';', each a list of devices "UUID,Type,mem,cores"
// each ended by ':':
//
//	GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76,NVIDIA,500,5:;
//
// Each device becomes a model.Device with IDs [UUID], Type the annotation's
// type, Resource the vendor's resource name (DefaultHAMiResources, which
// HAMiOptions.Resources overrides; vgpu is nvidia.com/gpu), ContainerIndex
// its entry's rank among the non-empty entries, ContainerScope
// model.ScopeRequestingAll, ContainerCount the number of non-empty entries,
// and Replace:
// HAMi's device plugins give the kubelet ids of their own (<UUID>-<n> for
// NVIDIA) that DCGM cannot match, so the decoded ids replace what the kubelet
// reported for that resource in that container. Shared is cores below 100
// (HAMi gives a device with all its cores to no one else). A legacy MIG id
// GPU-<uuid>[<profile>-<slot>] is reported as its parent GPU-<uuid>, shared:
// DCGM matches GPU or MIG UUIDs, never the bracketed form. HAMi's dynamic
// MIG writes each slice under its parent's UUID, so one id listed twice in a
// container entry is one device, shared, never an error. When
// hami.io/vgpu-mig-allocations records a slice's MIG instance (migUUID,
// added by HAMi's device plugin once it created the instance; the entry's
// containerIndex and deviceIndex are the device's position in the list and
// in its entry, and its gpuUUID must be the one written there), the slice is
// reported as that MIG-<uuid>, whole. A malformed MIG annotation is reported
// and ignored: the slices stay their parent GPU.
//
// HAMi's Ascend keys (hami.io/Ascend<chip>-devices-allocated) are written by
// Volcano's vNPU support too, with HAMi's encoding, on Volcano's pods
// (Format.Ascend tells their devices apart for the trust gate). A container
// asks for a vendor's devices as HAMi's own code counts them
// (GenerateResourceRequests): by the count resource the devices are reported
// as, and, for AWS Neuron, by aws.amazon.com/neuroncore alone too.
//
// Which container an entry is for: HAMi's device plugin hands the k-th
// non-empty entry to the k-th container, in spec order (init and sidecar
// containers first), that requests the vendor's resource, and so does
// Attribution. HAMi has written three shapes of list: one entry per app
// container (before its PR #1650), one per container, init containers
// first (after), and recently no entry at all for a container without the
// vendor's devices; counting non-empty entries reads all three alike.
//
// Empty entries (";;", a trailing ';' or ':') are containers or devices
// without allocation, not errors. Whitespace around fields is ignored, and
// fields after the fourth, which a newer HAMi may add. A container entry
// that cannot be read (fewer than four fields, no UUID or type, a memory or
// cores that is not a non-negative int32, a malformed MIG id, a UUID with
// spaces, one UUID twice) loses that container's devices only, with an error
// naming the annotation, the container and the device (three containers in
// detail, then a count): ';' alone decides positions, so the damage cannot
// move another container's devices. A vendor with no resource name is
// skipped with an error naming its key.
package hami
