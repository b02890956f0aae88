package tensorfusion

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

// TensorFusion's annotation keys and name.
const (
	Name              = "tensorfusion"
	ContainerGPUsKey  = "tensor-fusion.ai/container-gpus"
	GPUIDsKey         = "tensor-fusion.ai/gpu-ids"
	PartitionUUIDsKey = "tensor-fusion.ai/partition-uuids"
	// IsolationKey is the isolation mode TensorFusion's webhook gives a
	// pod; in partitioned mode its GPUs are MIG instances the device plugin
	// carves out of the gpu-ids GPUs when the containers are created.
	IsolationKey         = "tensor-fusion.ai/isolation"
	isolationPartitioned = "partitioned"
	indexResourcePrefix  = "tensor-fusion.ai/index"
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
	return &Format{resource: cmp.Or(opts.Resource, parse.DefaultGPUResource)}
}

// Name implements allocator.Format.
func (t *Format) Name() string { return Name }

// SchedulerNames implements allocator.Scheduled.
func (t *Format) SchedulerNames() []string { return []string{"tensor-fusion-scheduler"} }

// Relevant implements allocator.Format.
func (t *Format) Relevant(key string) bool {
	return key == ContainerGPUsKey || key == GPUIDsKey || key == PartitionUUIDsKey || key == IsolationKey
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
	gpus, key, err := t.podGPUs(annotations)
	if err != nil {
		errs = append(errs, fmt.Errorf("decode %s: %w", key, err))
	}
	partitioned := strings.TrimSpace(annotations[IsolationKey]) == isolationPartitioned
	gpus = slices.DeleteFunc(gpus, func(d model.Device) bool {
		// In partitioned mode the pod holds slices of its GPUs, never a
		// whole one: until the containers' partitions are known (their
		// annotations, DecodeContainer) it is shown none.
		return sliced[claimKey(d.IDs[0])] || (partitioned && !parse.IsMIG(d.IDs[0]))
	})
	devices := append(gpus, migs...)
	if len(devices) == 0 {
		devices = nil
	}
	return devices, errors.Join(errs...)
}

// RelevantToContainer implements allocator.ContainerFormat: TensorFusion's
// device plugin returns the MIG instances of partitioned mode in the
// container's AllocateResponse annotations, which the runtime creates the
// container with and which never reach the pod's metadata.
func (t *Format) RelevantToContainer(key string) bool { return key == PartitionUUIDsKey }

// DecodeContainer implements allocator.ContainerFormat: the partitions in
// one container's annotations ("MIG-<uuid>[/<gi>/<ci>]:<parent GPU>,...", as
// in the pod's) become MIG devices of that container, and their parent GPUs
// leave devices, the pod's allocation: the pod holds slices of them, as
// when the pod's annotations list the partitions. TensorFusion allocates
// per pod (its worker), so every container the device plugin serves gets
// the same partitions: an instance another container listed already
// becomes the pod's, which the attribution policy gives every container
// asking for the pod's GPUs. A malformed value adds and removes nothing.
func (t *Format) DecodeContainer(devices []model.Device, container string, annotations map[string]string) ([]model.Device, error) {
	v, ok := annotations[PartitionUUIDsKey]
	if !ok {
		return devices, nil
	}
	if !safeName(container) {
		return devices, fmt.Errorf("decode %s of container %s: not a container name", PartitionUUIDsKey, parse.Quote(container))
	}
	migs, err := t.partitions(v)
	if err != nil {
		return devices, fmt.Errorf("decode %s of container %s: %w", PartitionUUIDsKey, container, err)
	}
	out := slices.Clone(devices)
	at := map[string]int{} // the pod's MIG instances so far -> index in out
	for i, d := range out {
		if d.Allocator == Name && len(d.IDs) > 0 && parse.IsMIG(d.IDs[0]) {
			at[claimKey(d.IDs[0])] = i
		}
	}
	sliced := map[string]bool{}
	for _, m := range migs {
		sliced[claimKey(m.Parent)] = true
		if i, dup := at[claimKey(m.IDs[0])]; dup {
			if out[i].Container != container {
				out[i].Container = "" // out is a copy: devices' elements stay
			}
			continue
		}
		m.Container = container
		at[claimKey(m.IDs[0])] = len(out)
		out = append(out, m)
	}
	return slices.DeleteFunc(out, func(d model.Device) bool {
		return d.Allocator == Name && len(d.IDs) > 0 && !parse.IsMIG(d.IDs[0]) && sliced[claimKey(d.IDs[0])]
	}), nil
}

// CarvedFrom implements allocator.Carver: a partition's MIG instance
// (one with a parent: partition-uuids, the pod's or a container's) must be
// a slice of a GPU the scheduler gave the pod, which container-gpus names
// when it is there (any container's), else gpu-ids. The device plugin only
// carves instances out of those; a container's annotations are as
// forgeable as the runtime's pass-through of pod annotations allows. A
// malformed list gives no GPU, as it gives the pod none.
func (t *Format) CarvedFrom(dev model.Device, annotations map[string]string) (gpus []string, confined bool) {
	if dev.Allocator != Name || dev.Parent == "" || len(dev.IDs) == 0 || !parse.IsMIG(dev.IDs[0]) {
		return nil, false
	}
	devs, _, err := t.podGPUs(annotations)
	if err != nil {
		return nil, true
	}
	for _, d := range devs {
		gpus = append(gpus, d.IDs...)
	}
	return gpus, true
}

// podGPUs returns the GPUs the scheduler gave the pod: those of
// container-gpus when it is there, each for its container, else gpu-ids',
// for the pod; key is the annotation read.
func (t *Format) podGPUs(annotations map[string]string) (gpus []model.Device, key string, err error) {
	if v, ok := annotations[ContainerGPUsKey]; ok {
		gpus, err = t.containerGPUs(v)
		return gpus, ContainerGPUsKey, err
	}
	ids, err := splitIDs(annotations[GPUIDsKey])
	for _, id := range ids {
		gpus = append(gpus, t.gpu(id, ""))
	}
	return gpus, GPUIDsKey, err
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
	return s != "" && len(s) <= 253 && !parse.HasSpaceOrControl(s)
}
