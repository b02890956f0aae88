// Package volcano decodes Volcano's two device allocations: vGPU
// (volcano.sh/vgpu-ids-new, HAMi's format, read by hami.DecodeList) and
// gpushare (volcano.sh/gpu-index, nvidia-smi indices that Translate turns
// into UUIDs).
package volcano
