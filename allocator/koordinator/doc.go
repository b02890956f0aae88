// Package koordinator decodes Koordinator's device allocation,
// scheduling.koordinator.sh/device-allocated, and reads pod requests as
// koord-scheduler does.
//
// scheduling.koordinator.sh/device-allocated holds a JSON object from device
// type to a list of allocations {minor, resources, id, extension}. Each
// allocation becomes one model.Device:
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
// Of scheduling.koordinator.sh/device-allocate-hint, the pod's own input to
// koord-scheduler, only allocateStrategy is read (HintAnnotation).
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
package koordinator
