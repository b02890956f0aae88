// Package allocator turns the device allocations that centralized
// schedulers record in pod annotations into state.Devices, and decides which
// container of the pod each device is reported on. It is pure: no I/O, no
// clock, the same input always gives the same output, so the proxy's List
// and Get, which both call it, always agree.
//
// One Decoder per scheduler's annotation format (NewKoordinator today; HAMi
// and Volcano later) is gathered in a Set, which is the state.Decoder the
// store calls and the attribution policy the proxy calls.
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
// Which pod resources request which device type, and how they count
// (Koordinator's percentages count 100 per whole device; "share" means the
// container asks for a fraction of a device):
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
// # Attribution
//
// Koordinator allocates per pod, but the kubelet reports devices per
// container, and consumers (DCGM labels metrics with the container name) need
// the container that uses them. Set.Assign decides, given the pod spec
// (init, sidecar and app containers in spec order):
//
//   - A device with ContainerIndex (per-container allocators) goes to
//     spec.Containers[index]; if that is a plain init container it is
//     dropped, because the kubelet never reports init containers and the
//     device was not the other containers'; if the index is out of range the
//     device falls through to the pod-level policy below.
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
package allocator
