// Package allocator turns the device allocations that centralized
// schedulers record in pod annotations into state.Devices, and decides which
// container of the pod each device is reported on. It is pure: no I/O, no
// clock, the same input always gives the same output, so the proxy's List
// and Get, which both call it, always agree.
//
// One Decoder per scheduler's annotation format (NewKoordinator, NewHAMi,
// NewVolcanoVGPU, NewVolcanoGPUShare, NewTensorFusion; NewDecoders builds
// them by name) is
// gathered in a Set, which is the state.Decoder the store calls and the
// attribution policy the proxy calls. Translate gives ids to devices an
// allocator named by number only.
//
// # Koordinator
//
// scheduling.koordinator.sh/device-allocated holds a JSON object from device
// type to a list of allocations {minor, resources, id, extension}. Each
// allocation becomes one state.Device:
//
//	type  Resource (configurable)  IDs
//	gpu   nvidia.com/gpu           [id] (the GPU UUID, what DCGM matches)
//	rdma  koordinator.sh/rdma      the VFs' busIDs (what Multus hands to
//	                               SR-IOV CNI), or [id] (the PF address)
//	                               when there are no VFs
//	fpga  koordinator.sh/fpga      [id]
//
// Device types are read in sorted order, allocations in annotation order.
// An allocation without id (Koordinator before v1.6) is kept with no IDs and
// its Minor, so that a device inventory can translate it later; one with
// neither id, VFs nor minor identifies nothing and is an error. A GPU with a
// gpuSharedResourceTemplate but no VFs keeps its id (koordlet's proxy drops
// it). VFs are read for rdma only. Device.Shared is set when the allocation is
// a fraction of the device: gpu-core or gpu-memory-ratio below 100, a
// gpuSharedResourceTemplate, or rdma/fpga below 100 on a device without VFs
// (a VF is never shared).
//
// A malformed annotation (invalid JSON, wrong types, null allocations, a
// negative minor, an empty VF busID, an invalid or negative quantity, an id
// given twice in the pod) is rejected as a whole: guessing which half of a
// corrupt allocation is right could hand Multus the wrong VF. An unknown
// device type is not malformed (a newer Koordinator may add one): its
// allocations are skipped with an error naming it, and the pod keeps the
// devices of the known types.
//
// scheduling.koordinator.sh/device-allocate-hint, the pod's own input to
// koord-scheduler, is read for one field only: allocateStrategy
// "RequestsAsCount" for rdma or fpga makes that type's koordinator.sh/rdma or
// koordinator.sh/fpga count devices instead of percent (rdma: 1 is one VF).
// Each VF of such an allocation is then a device of its own, whole, marked
// CountsRequests, and Wants counts the containers' requests in devices. A
// hint that cannot be read is reported and ignored (requests in percent):
// the devices are the pod's either way.
//
// Which pod resources request which device type, and how they count
// (Koordinator's percentages count 100 per whole device, or 1 per device
// under RequestsAsCount; "share" means the container asks for a fraction
// of a device):
//
//	type  request                          counts as
//	gpu   GPUResource (nvidia.com/gpu)     whole devices (a fraction: share)
//	gpu   koordinator.sh/gpu               100 per device, else share
//	gpu   koordinator.sh/gpu-core          100 per device, else share
//	gpu   koordinator.sh/gpu-memory-ratio  100 per device, else share
//	gpu   koordinator.sh/gpu-memory        share
//	gpu   koordinator.sh/gpu.shared        share
//	rdma  koordinator.sh/rdma              100 per device, else share
//	rdma  RDMAResource                     as koordinator.sh/rdma if it is that,
//	                                       else whole devices
//	fpga  koordinator.sh/fpga              100 per device, else share
//	fpga  FPGAResource                     as koordinator.sh/fpga if it is that,
//	                                       else whole devices
//
// A container asking a fraction in any counting resource asks a share; else
// it asks the largest whole count among them; share-only resources count only
// when no counting resource is requested (gpu-core: 100 with gpu-memory is
// one whole GPU).
//
// # HAMi
//
// hami.io/<vendor>-devices-allocated (hami.io/vgpu-devices-allocated for
// NVIDIA; not the in-flight -devices-to-allocate keys) holds one entry per
// container, each ended by ';', each a list of devices "UUID,Type,mem,cores"
// each ended by ':':
//
//	GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76,NVIDIA,500,5:;
//
// Each device becomes a state.Device with IDs [UUID], Type the annotation's
// type, Resource the vendor's resource name (DefaultHAMiResources, which
// HAMiOptions.Resources overrides; vgpu is nvidia.com/gpu), ContainerIndex
// its entry's rank among the non-empty entries, ContainerScope
// state.ScopeRequestingAll, ContainerCount the number of non-empty entries,
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
// Which container an entry is for: HAMi's device plugin hands the k-th
// non-empty entry to the k-th container, in spec order (init and sidecar
// containers first), that requests the vendor's resource, and so does
// Attribution. HAMi has written three shapes of list: one entry per app
// container (before its PR #1650), one per container, init containers
// first (after), and recently no entry at all for a container without the
// vendor's devices; counting non-empty entries reads all three alike, so
// HAMiOptions.LegacyIndexing, which chose between the first two, no longer
// changes anything.
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
//
// # Volcano
//
// volcano.sh/vgpu-ids-new (Volcano's HAMi-derived vGPU plugin) is read by
// the same parser and rules as HAMi, reported as nvidia.com/gpu by default,
// with Replace. Volcano writes one entry per app container that requests
// volcano.sh/vgpu-number or volcano.sh/vgpu-memory (state.ScopeRequesting),
// empty ones included, joined by ';' without a trailing one; ContainerIndex
// is the entry's position.
//
// volcano.sh/gpu-index (gpushare) is a comma-separated list of nvidia-smi
// indices ("0,2"). Each becomes a pod-level device of type "gpu" with Index
// and no ids, appended (not Replace: the container is the policy's choice);
// Translate gives it its UUID. A malformed list is rejected as a whole.
//
// # TensorFusion
//
// tensor-fusion.ai/container-gpus, tensor-fusion.ai/gpu-ids and
// tensor-fusion.ai/partition-uuids: see tensorfusion.go. A GPU named for a
// container (Device.Container) goes to that container.
//
// # Answered ids
//
// Where a pod's devices are answered, ids are spelt as consumers match
// them (NormalizeID, normalize.go), the sharers of a GPU other than its
// first get "<uuid>::<slot>" (SharedGPUs, sharedgpu.go), and MIG instances
// sit on their parent GPU's NUMA node under a configurable resource
// (mig.go). Decoding itself never changes an id's spelling.
//
// # Limits
//
// Set.Decode refuses, as malformed, the devices of an allocator that would
// take the pod past the limit on device ids (DefaultMaxDevicesPerPod, 256,
// or Set.LimitDevicesPerPod; --max-devices-per-pod): one limit for each
// allocator's annotations and for the pod's total. Every decoder is linear
// in its annotation's length (duplicate checks are maps), so a 256 KiB
// annotation naming thousands of VFs is read and refused quickly.
//
// # Not read
//
// In-flight keys (-devices-to-allocate), scheduling bookkeeping, HAMi's
// hami.io/kunlun-allocated (no writer's format checked; Kunlunxin devices
// come from hami.io/xpu-devices-allocated), and Koordinator's other hint
// fields and adapter annotations. A VF's minor (0..n, left out when 0) is
// not reported. HAMi's Cambricon MLU ids (<node>-cambricon-mlu-<n>) are
// names HAMi makes up; they replace the kubelet's, which are the device
// plugin's own and name no card either, so that a container shows the card
// HAMi chose and its sharers the same one.
//
// # Translation
//
// Translate, called when devices are answered, fills the ids of devices
// that have none from the node's inventory: by Index if set, else by Minor,
// for the device's Type. Untranslatable devices keep no ids and are
// reported; the merge skips them.
//
// # Several allocators
//
// Every decoder reads only its own keys, so enabling all of them costs
// nothing for pods of one scheduler. A pod carrying two allocators'
// annotations for one device shows it once per container and resource (the
// merge never repeats an id there), but may show it on two containers if the
// allocators attribute it differently. NewDecoders puts the replacing
// decoders (HAMi, Volcano vGPU) first, so that a replacement drops only the
// kubelet's own entries, never a device another allocator added.
//
// # Attribution
//
// Koordinator allocates per pod, but the kubelet reports devices per
// container, and consumers (DCGM labels metrics with the container name) need
// the container that uses them. Set.Assign decides, given the pod spec
// (init, sidecar and app containers in spec order):
//
//   - A device with ContainerIndex (per-container allocators) goes to the
//     index-th container of its ContainerScope: every container that
//     requests it by its decoder's Wants, init containers included, in spec
//     order (ScopeRequestingAll: HAMi), the app containers that request it
//     (ScopeRequesting: Volcano vGPU), and, for records written by earlier
//     versions, every container (ScopeAll) or the app containers (ScopeApp).
//     For those last two, when the device's ContainerCount differs from the
//     scope's size, the first of ScopeAll, ScopeApp, ScopeRequesting whose
//     size equals it is used instead. If the container is a plain init
//     container the device is dropped, because the kubelet never reports
//     init containers and the device was not the other containers'; if the
//     index is out of range the device falls through to the pod-level policy
//     below.
//   - Pod-level devices are grouped by kind (allocator, type, resource). The
//     requesting containers of a kind are the sidecars and app containers
//     whose requests Want it; plain init containers never request.
//   - None requests: the first app container gets them all (never a sidecar,
//     which the kubelet lists first, nor an init container).
//   - Exactly one requests: it gets them all.
//   - Several request: a Shared device goes to every container that asks
//     for a share; each other device goes to one container asking whole
//     devices, in container order, as many as it asks for; what is left goes
//     to every container asking a share if there is one (they share it),
//     else to the last requesting container. A Shared device when nobody asks
//     a share is handed out like the others.
//
// Each container's devices keep the order of the input.
//
// # Trust
//
// Decoding believes nothing: any tenant can write any annotation on its own
// pod. Whether a decoded device is reported is decided in trust.go alone:
// Gate.Vet keeps a device only on a pod its allocator's scheduler placed
// (spec.schedulerName), that requests what the device provides, whose ids
// have their resource's shape and, where the inventory knows the type, are
// this node's; Gate.Holders and Gate.Contest show an exclusive device
// (Koordinator's whole GPU, VF, PF, FPGA) on the pod that claimed it first
// only. Refusals carry a reason and a class (forged, malformed, unvetted)
// for the log, the metric and the record. The proxy applies the gate where
// a pod's devices are answered, after Translate and before Assign.
package allocator
