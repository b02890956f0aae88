package tensorfusion

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

// TensorFusion's annotation keys and name.
const (
	Name                = "tensorfusion"
	ContainerGPUsKey    = "tensor-fusion.ai/container-gpus"
	GPUIDsKey           = "tensor-fusion.ai/gpu-ids"
	PartitionUUIDsKey   = "tensor-fusion.ai/partition-uuids"
	indexResourcePrefix = "tensor-fusion.ai/index"
)

// Options configure the TensorFusion decoder.
type Options struct {
	// Resource is what its GPUs and MIG instances are reported as;
	// parse.DefaultGPUResource when empty.
	Resource string
}

// Format decodes TensorFusion's annotations.
type Format struct {
	resource string
}

// New returns the TensorFusion decoder.
func New(opts Options) *Format {
	if opts.Resource == "" {
		opts.Resource = parse.DefaultGPUResource
	}
	return &Format{resource: opts.Resource}
}

// Name implements allocator.Format.
func (t *Format) Name() string { return Name }

// Relevant implements allocator.Format.
func (t *Format) Relevant(key string) bool {
	return key == ContainerGPUsKey || key == GPUIDsKey || key == PartitionUUIDsKey
}

// Wants implements allocator.Format: a container asks for a share of the pod's GPUs
// when its limits name a tensor-fusion.ai/index resource (index or
// index_<hex>).
func (t *Format) Wants(_ model.Device, requests map[string]string) (whole int64, share bool) {
	for name := range requests {
		if strings.HasPrefix(name, indexResourcePrefix) {
			return 0, true
		}
	}
	return 0, false
}

// Decode implements allocator.Format. Each annotation is decoded alone: a malformed
// one is refused with an error naming it, the others still count.
func (t *Format) Decode(annotations map[string]string) ([]model.Device, error) {
	var errs []error
	var migs []model.Device
	if v, ok := annotations[PartitionUUIDsKey]; ok {
		var err error
		if migs, err = t.partitions(v); err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w", PartitionUUIDsKey, err))
		}
	}
	sliced := map[string]bool{}
	for _, m := range migs {
		sliced[claimKey(m.Parent)] = true
	}
	var gpus []model.Device
	if v, ok := annotations[ContainerGPUsKey]; ok {
		var err error
		if gpus, err = t.containerGPUs(v); err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w", ContainerGPUsKey, err))
		}
	} else if v, ok := annotations[GPUIDsKey]; ok {
		ids, err := splitIDs(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w", GPUIDsKey, err))
		}
		for _, id := range ids {
			gpus = append(gpus, t.gpu(id, ""))
		}
	}
	gpus = slices.DeleteFunc(gpus, func(d model.Device) bool { return sliced[claimKey(d.IDs[0])] })
	devices := append(gpus, migs...)
	if len(devices) == 0 {
		devices = nil
	}
	return devices, errors.Join(errs...)
}

// gpu is a GPU the pod shares, or a MIG instance named where GPUs are,
// which is whole.
func (t *Format) gpu(id, container string) model.Device {
	return model.Device{Allocator: Name, Type: "gpu", Resource: t.resource, IDs: []string{id}, Shared: !parse.IsMIG(id), Container: container}
}

// containerGPUs reads {container: [ids]}, containers in name order.
func (t *Format) containerGPUs(value string) ([]model.Device, error) {
	var m map[string][]string
	if err := json.Unmarshal([]byte(value), &m); err != nil {
		return nil, fmt.Errorf("want a JSON object from container name to GPU ids: %w", err)
	}
	names := make([]string, 0, len(m))
	for name := range m {
		if !safeName(name) {
			return nil, fmt.Errorf("container name %s is not a container name", parse.Quote(name))
		}
		names = append(names, name)
	}
	slices.Sort(names)
	var out []model.Device
	for _, name := range names {
		seen := map[string]bool{}
		for _, id := range m[name] {
			id = strings.TrimSpace(id)
			if !safeName(id) {
				return nil, fmt.Errorf("container %s: GPU id %s is empty or has spaces or control characters", parse.Quote(name), parse.Quote(id))
			}
			if seen[claimKey(id)] {
				return nil, fmt.Errorf("container %s: GPU %s listed twice", parse.Quote(name), parse.Quote(id))
			}
			seen[claimKey(id)] = true
			out = append(out, t.gpu(id, name))
		}
	}
	return out, nil
}

// partitions reads "MIG-<uuid>[/<gi>/<ci>]:<parent>,...".
func (t *Format) partitions(value string) ([]model.Device, error) {
	pairs, err := splitIDs(value)
	if err != nil {
		return nil, err
	}
	var out []model.Device
	seen := map[string]bool{}
	for _, p := range pairs {
		mig, parent, ok := strings.Cut(p, ":")
		mig, parent = strings.TrimSpace(mig), strings.TrimSpace(parent)
		if !ok || parent == "" || !safeName(parent) {
			return nil, fmt.Errorf("partition %s: want <MIG instance>:<parent GPU>", parse.Quote(p))
		}
		if !parse.IsMIG(mig) {
			return nil, fmt.Errorf("partition %s: %s is not a MIG-<uuid>", parse.Quote(p), parse.Quote(mig))
		}
		if base, _, cut := strings.Cut(mig, "/"); cut && !strings.HasPrefix(strings.ToUpper(base), "MIG-GPU-") {
			mig = base // MIG-<uuid>/<gi>/<ci>: DCGM resolves MIG-<uuid>
		}
		if !parse.IsMIG(mig) || !safeName(mig) {
			return nil, fmt.Errorf("partition %s: %s is not a MIG-<uuid>", parse.Quote(p), parse.Quote(mig))
		}
		if seen[claimKey(mig)] {
			return nil, fmt.Errorf("MIG instance %s listed twice", parse.Quote(mig))
		}
		seen[claimKey(mig)] = true
		out = append(out, model.Device{Allocator: Name, Type: "gpu", Resource: t.resource, IDs: []string{mig}, Parent: parent})
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
			return nil, fmt.Errorf("%s has spaces or control characters", parse.Quote(item))
		}
		if seen[claimKey(item)] {
			return nil, fmt.Errorf("%s listed twice", parse.Quote(item))
		}
		seen[claimKey(item)] = true
		out = append(out, item)
	}
	return out, nil
}

// claimKey compares ids as the inventory and the trust gate do:
// case-insensitively.
func claimKey(id string) string { return strings.ToLower(id) }

// safeName reports whether s is a non-empty name of at most 253 bytes
// without spaces or control characters.
func safeName(s string) bool {
	return s != "" && len(s) <= 253 && strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) < 0
}
