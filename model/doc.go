// Package model is the daemon's shared vocabulary: what the runtime reports
// (Sandbox, RuntimeContainer), what the kubelet's /pods says (KubeletPod,
// PodSpec), what an allocator's annotation decodes to (Device) and what the
// trust rules refuse (Refused), and how PodResources names a pod (PodKey).
// It holds types only; the store, the decoders, the trust gate and the proxy
// all speak it, and none of them owns it.
package model
