package allocator

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/podres-proxy/podres-proxy/state"
)

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
//
// GPUs come from container-gpus when it is there (each to its named
// container), else from gpu-ids (pod level). A partition's instance is
// reported as MIG-<uuid> (a /<gi>/<ci> suffix dropped: DCGM resolves the
// bare instance UUID), with its parent for the NUMA node, and the parent
// GPU itself is then not reported to the pod: the pod holds a slice of it.
// TensorFusion writes GPU ids in their Kubernetes-name form (gpu-<uuid>);
// the proxy spells them GPU-<uuid> when it answers (NormalizeID).
//
// TensorFusion shares GPUs by design (fractions of TFLOPs and VRAM), so
// every GPU is Shared and its sharers get shared-GPU ids (sharedgpu.go); a
// MIG instance is a device of its own, whole. A container asks for the
// pod's GPUs when its limits name a tensor-fusion.ai/index resource, which
// TensorFusion's webhook adds to each container it injects.
//
// Any malformed value (invalid JSON, an empty or unsafe id or container
// name, an id twice in one container, a partition without parent) makes
// the whole annotation refused: which half of a corrupt allocation is right
// cannot be known.

// TensorFusion's annotation keys and name.
const (
	TensorFusionName                = "tensorfusion"
	TensorFusionContainerGPUsKey    = "tensor-fusion.ai/container-gpus"
	TensorFusionGPUIDsKey           = "tensor-fusion.ai/gpu-ids"
	TensorFusionPartitionUUIDsKey   = "tensor-fusion.ai/partition-uuids"
	tensorFusionIndexResourcePrefix = "tensor-fusion.ai/index"
)

// TensorFusionOptions configure the TensorFusion decoder.
type TensorFusionOptions struct {
	// Resource is what its GPUs and MIG instances are reported as;
	// DefaultGPUResource when empty.
	Resource string
}

// TensorFusion decodes TensorFusion's annotations.
type TensorFusion struct {
	resource string
}

// NewTensorFusion returns the TensorFusion decoder.
func NewTensorFusion(opts TensorFusionOptions) *TensorFusion {
	if opts.Resource == "" {
		opts.Resource = DefaultGPUResource
	}
	return &TensorFusion{resource: opts.Resource}
}

// Name implements Decoder.
func (t *TensorFusion) Name() string { return TensorFusionName }

// Relevant implements Decoder.
func (t *TensorFusion) Relevant(key string) bool {
	return key == TensorFusionContainerGPUsKey || key == TensorFusionGPUIDsKey || key == TensorFusionPartitionUUIDsKey
}

// Wants implements Decoder: a container asks for a share of the pod's GPUs
// when its limits name a tensor-fusion.ai/index resource (index or
// index_<hex>).
func (t *TensorFusion) Wants(_ state.Device, requests map[string]string) (whole int64, share bool) {
	for name := range requests {
		if strings.HasPrefix(name, tensorFusionIndexResourcePrefix) {
			return 0, true
		}
	}
	return 0, false
}

// Decode implements Decoder. Each annotation is decoded alone: a malformed
// one is refused with an error naming it, the others still count.
func (t *TensorFusion) Decode(annotations map[string]string) ([]state.Device, error) {
	var errs []error
	var migs []state.Device
	if v, ok := annotations[TensorFusionPartitionUUIDsKey]; ok {
		var err error
		if migs, err = t.partitions(v); err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w", TensorFusionPartitionUUIDsKey, err))
		}
	}
	sliced := map[string]bool{}
	for _, m := range migs {
		sliced[claimKey(m.Parent)] = true
	}
	var gpus []state.Device
	if v, ok := annotations[TensorFusionContainerGPUsKey]; ok {
		var err error
		if gpus, err = t.containerGPUs(v); err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w", TensorFusionContainerGPUsKey, err))
		}
	} else if v, ok := annotations[TensorFusionGPUIDsKey]; ok {
		ids, err := splitIDs(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w", TensorFusionGPUIDsKey, err))
		}
		for _, id := range ids {
			gpus = append(gpus, t.gpu(id, ""))
		}
	}
	gpus = slices.DeleteFunc(gpus, func(d state.Device) bool { return sliced[claimKey(d.IDs[0])] })
	devices := append(gpus, migs...)
	if len(devices) == 0 {
		devices = nil
	}
	return devices, errors.Join(errs...)
}

// gpu is a GPU the pod shares, or a MIG instance named where GPUs are,
// which is whole.
func (t *TensorFusion) gpu(id, container string) state.Device {
	return state.Device{Allocator: TensorFusionName, Type: "gpu", Resource: t.resource, IDs: []string{id}, Shared: !isMIG(id), Container: container}
}

// containerGPUs reads {container: [ids]}, containers in name order.
func (t *TensorFusion) containerGPUs(value string) ([]state.Device, error) {
	var m map[string][]string
	if err := json.Unmarshal([]byte(value), &m); err != nil {
		return nil, fmt.Errorf("want a JSON object from container name to GPU ids: %w", err)
	}
	names := make([]string, 0, len(m))
	for name := range m {
		if !safeName(name) {
			return nil, fmt.Errorf("container name %s is not a container name", quote(name))
		}
		names = append(names, name)
	}
	slices.Sort(names)
	var out []state.Device
	for _, name := range names {
		seen := map[string]bool{}
		for _, id := range m[name] {
			id = strings.TrimSpace(id)
			if !safeName(id) {
				return nil, fmt.Errorf("container %s: GPU id %s is empty or has spaces or control characters", quote(name), quote(id))
			}
			if seen[claimKey(id)] {
				return nil, fmt.Errorf("container %s: GPU %s listed twice", quote(name), quote(id))
			}
			seen[claimKey(id)] = true
			out = append(out, t.gpu(id, name))
		}
	}
	return out, nil
}

// partitions reads "MIG-<uuid>[/<gi>/<ci>]:<parent>,...".
func (t *TensorFusion) partitions(value string) ([]state.Device, error) {
	pairs, err := splitIDs(value)
	if err != nil {
		return nil, err
	}
	var out []state.Device
	seen := map[string]bool{}
	for _, p := range pairs {
		mig, parent, ok := strings.Cut(p, ":")
		mig, parent = strings.TrimSpace(mig), strings.TrimSpace(parent)
		if !ok || parent == "" || !safeName(parent) {
			return nil, fmt.Errorf("partition %s: want <MIG instance>:<parent GPU>", quote(p))
		}
		if !isMIG(mig) {
			return nil, fmt.Errorf("partition %s: %s is not a MIG-<uuid>", quote(p), quote(mig))
		}
		if base, _, cut := strings.Cut(mig, "/"); cut && !strings.HasPrefix(strings.ToUpper(base), "MIG-GPU-") {
			mig = base // MIG-<uuid>/<gi>/<ci>: DCGM resolves MIG-<uuid>
		}
		if !isMIG(mig) || !safeName(mig) {
			return nil, fmt.Errorf("partition %s: %s is not a MIG-<uuid>", quote(p), quote(mig))
		}
		if seen[claimKey(mig)] {
			return nil, fmt.Errorf("MIG instance %s listed twice", quote(mig))
		}
		seen[claimKey(mig)] = true
		out = append(out, state.Device{Allocator: TensorFusionName, Type: "gpu", Resource: t.resource, IDs: []string{mig}, Parent: parent})
	}
	return out, nil
}

// splitIDs splits a comma-separated list, dropping empty items; an item
// with spaces inside or control characters, or one given twice, is an
// error.
func splitIDs(value string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, item := range strings.Split(value, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if !safeName(item) {
			return nil, fmt.Errorf("%s has spaces or control characters", quote(item))
		}
		if seen[claimKey(item)] {
			return nil, fmt.Errorf("%s listed twice", quote(item))
		}
		seen[claimKey(item)] = true
		out = append(out, item)
	}
	return out, nil
}

// safeName reports whether s is a non-empty name of at most 253 bytes
// without spaces or control characters.
func safeName(s string) bool {
	return s != "" && len(s) <= 253 && strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) < 0
}
