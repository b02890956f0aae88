// Package volcano decodes Volcano's two device allocations: vGPU
// (volcano.sh/vgpu-ids-new, HAMi's format) and gpushare
// (volcano.sh/gpu-index, nvidia-smi indices).
//
// volcano.sh/vgpu-ids-new (Volcano's HAMi-derived vGPU plugin) is read by
// the same parser and rules as HAMi, reported as nvidia.com/gpu by default,
// with Replace. Volcano writes one entry per app container that requests
// volcano.sh/vgpu-number or volcano.sh/vgpu-memory (model.ScopeRequesting),
// empty ones included, joined by ';' without a trailing one; ContainerIndex
// is the entry's position.
//
// volcano.sh/gpu-index (gpushare) is a comma-separated list of nvidia-smi
// indices ("0,2"). Each becomes a pod-level device of type "gpu" with Index
// and no ids, appended (not Replace: the container is the policy's choice);
// Translate gives it its UUID. A malformed list is rejected as a whole.
package volcano
