// Package tensorfusion decodes the allocations of TensorFusion.
//
// TensorFusion (NexusGPU/tensor-fusion) virtualises GPUs: its scheduler
// (tensor-fusion-scheduler) writes which GPUs a pod got into annotations,
// and its device plugin gives the kubelet dummy entries
// (tensor-fusion.ai/index_<hex>) that name no GPU. TensorFusion ships a
// proxy of its own for DCGM exporter, with List only; this decoder lets
// podres-proxy answer those pods in every method, with NUMA nodes.
//
// Annotations read, as TensorFusion writes them (pkg/constants):
//
//	tensor-fusion.ai/container-gpus   JSON {container name: [GPU ids]}, when
//	                                  containers got different GPUs
//	tensor-fusion.ai/gpu-ids          "id,id": the pod's GPUs, shared by
//	                                  every container that asks for one
//	tensor-fusion.ai/partition-uuids  "MIG-<uuid>[/<gi>/<ci>]:<parent GPU>,...":
//	                                  the MIG instances of partitioned mode
//	                                  (TensorFusion's own proxy reads it here)
//	tensor-fusion.ai/isolation        the pod's mode; "partitioned": its GPUs
//	                                  are MIG instances carved out of gpu-ids'
//
// Its device plugin writes partition-uuids in fact per container, in the
// AllocateResponse, which the runtime creates the container with and the
// pod's metadata never gets: read from there too (DecodeContainer). A
// partition's instance is reported as MIG-<uuid>, with its parent for the
// NUMA node, and the parent GPU itself is then not reported to the pod: the
// pod holds a slice of it. TensorFusion writes GPU ids as gpu-<uuid>; the
// proxy spells them GPU-<uuid> when it answers (devids.NormalizeID).
//
// TensorFusion shares GPUs by design (fractions of TFLOPs and VRAM), so
// every GPU is Shared and its sharers get shared-GPU ids (trust.SharedGPUs); a
// MIG instance is a device of its own, whole. A container asks for the
// pod's GPUs when its limits name a tensor-fusion.ai/index resource, which
// TensorFusion's webhook adds to each container it injects.
//
// Any malformed value (invalid JSON, an empty or unsafe id or container
// name, an id twice in one container, a partition without parent) makes
// the whole annotation refused: which half of a corrupt allocation is right
// cannot be known.
package tensorfusion
