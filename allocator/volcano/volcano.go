package volcano

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

const (
	// VGPUName is the Volcano vGPU decoder's Name and the Allocator
	// of its devices.
	VGPUName = hami.VolcanoVGPUName
	// VGPUAnnotation is the pod annotation in which Volcano's vGPU
	// scheduler plugin (derived from HAMi) records the vGPUs it allocated,
	// in HAMi's format.
	VGPUAnnotation = "volcano.sh/vgpu-ids-new"
	// DefaultVGPUCountResource and DefaultVolcanoVGPUMemoryResource are
	// the requests by which Volcano's vGPU plugin decides that a container
	// gets vGPUs (its vgpu-number and vgpu-memory defaults).
	DefaultVGPUCountResource  = "volcano.sh/vgpu-number"
	DefaultVGPUMemoryResource = "volcano.sh/vgpu-memory"

	// GPUShareName is the Volcano gpushare decoder's Name and the
	// Allocator of its devices.
	GPUShareName = "volcano-gpushare"
	// GPUShareAnnotation is the pod annotation in which Volcano's
	// gpushare plugin records the GPUs it chose, by nvidia-smi index.
	GPUShareAnnotation = "volcano.sh/gpu-index"
	// DefaultGPUNumberResource and DefaultVolcanoGPUMemoryResource
	// are the requests of Volcano's gpushare plugin: whole GPUs, or GPU
	// memory on a shared one.
	DefaultGPUNumberResource = "volcano.sh/gpu-number"
	DefaultGPUMemoryResource = "volcano.sh/gpu-memory"

	// volcanoGPUType is the inventory type Volcano's GPUs are translated as.
	volcanoGPUType = "gpu"
)

// VGPUOptions configure the Volcano vGPU decoder. Empty fields take
// the defaults.
type VGPUOptions struct {
	// Resource is the resource name the vGPUs are reported as; default
	// DefaultGPUResource, the one DCGM exporter matches.
	Resource string
	// CountResource and MemoryResource are the requests that make a
	// container one Volcano allocates to (Volcano's --vgpu-number and
	// --vgpu-memory resource names).
	CountResource  string // default DefaultVolcanoVGPUCountResource
	MemoryResource string // default DefaultVolcanoVGPUMemoryResource
}

// VGPU decodes volcano.sh/vgpu-ids-new.
type VGPU struct {
	opts VGPUOptions
}

// NewVGPU returns the Volcano vGPU decoder.
func NewVGPU(opts VGPUOptions) *VGPU {
	opts.Resource = cmp.Or(opts.Resource, parse.DefaultGPUResource)
	opts.CountResource = cmp.Or(opts.CountResource, DefaultVGPUCountResource)
	opts.MemoryResource = cmp.Or(opts.MemoryResource, DefaultVGPUMemoryResource)
	return &VGPU{opts: opts}
}

// Name implements allocator.Format.
func (v *VGPU) Name() string { return VGPUName }

// SchedulerNames implements allocator.Scheduled.
func (v *VGPU) SchedulerNames() []string { return []string{"volcano"} }

// ReplacedResources implements allocator.Replacer: Volcano's vGPU device plugin, like
// HAMi's, gives the kubelet ids that are not GPU UUIDs.
func (v *VGPU) ReplacedResources() []string { return []string{v.opts.Resource} }

// Relevant implements allocator.Format.
func (v *VGPU) Relevant(key string) bool { return key == VGPUAnnotation }

// Decode implements allocator.Format. The value is in HAMi's format, with one entry
// per app container that requests vGPUs, so the devices' ContainerScope is
// model.ScopeRequesting.
func (v *VGPU) Decode(annotations map[string]string) ([]model.Device, error) {
	value, ok := annotations[VGPUAnnotation]
	if !ok {
		return nil, nil
	}
	return hami.DecodeList(VGPUAnnotation, value, hami.List{
		Allocator: VGPUName,
		Resource:  v.opts.Resource,
		Scope:     model.ScopeRequesting,
	})
}

// Wants implements allocator.Format as Volcano's vGPU plugin reads requests: the
// count resource asks that many vGPUs, the memory resource alone one.
func (v *VGPU) Wants(_ model.Device, requests map[string]string) (whole int64, share bool) {
	if _, ok := requests[v.opts.CountResource]; ok {
		return parse.CountRequest(requests, v.opts.CountResource)
	}
	if _, _, ok := parse.Quantity(requests[v.opts.MemoryResource]); ok {
		return 1, false
	}
	return 0, false
}

// GPUShareOptions configure the Volcano gpushare decoder. Empty
// fields take the defaults.
type GPUShareOptions struct {
	// Resource is the resource name the GPUs are reported as; default
	// DefaultGPUResource.
	Resource string
	// NumberResource asks whole GPUs, MemoryResource a share of one
	// (Volcano's gpushare request names).
	NumberResource string // default DefaultVolcanoGPUNumberResource
	MemoryResource string // default DefaultVolcanoGPUMemoryResource
}

// GPUShare decodes volcano.sh/gpu-index.
type GPUShare struct {
	opts GPUShareOptions
}

// NewGPUShare returns the Volcano gpushare decoder.
func NewGPUShare(opts GPUShareOptions) *GPUShare {
	opts.Resource = cmp.Or(opts.Resource, parse.DefaultGPUResource)
	opts.NumberResource = cmp.Or(opts.NumberResource, DefaultGPUNumberResource)
	opts.MemoryResource = cmp.Or(opts.MemoryResource, DefaultGPUMemoryResource)
	return &GPUShare{opts: opts}
}

// Name implements allocator.Format.
func (v *GPUShare) Name() string { return GPUShareName }

// SchedulerNames implements allocator.Scheduled.
func (v *GPUShare) SchedulerNames() []string { return []string{"volcano"} }

// Relevant implements allocator.Format.
func (v *GPUShare) Relevant(key string) bool { return key == GPUShareAnnotation }

// Decode implements allocator.Format. The value is a comma-separated list of GPU
// indices ("0,2"), pod-level. Each becomes a device of type "gpu" with its
// Index and no ids: Translate fills the UUID in from the node's inventory.
// The devices are appended to what the kubelet reports, never replace it:
// the container they go to is the attribution policy's choice, not the
// allocator's. An empty value allocates nothing.
//
// A malformed list (an empty, non-numeric or negative index, one index
// twice) is rejected as a whole: with no structure to confine the damage,
// guessing which indices are right could name another pod's GPU.
func (v *GPUShare) Decode(annotations map[string]string) ([]model.Device, error) {
	value, ok := annotations[GPUShareAnnotation]
	if !ok {
		return nil, nil
	}
	devices, err := v.decode(value)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", GPUShareAnnotation, err)
	}
	return devices, nil
}

func (v *GPUShare) decode(value string) ([]model.Device, error) {
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	var devices []model.Device
	seen := map[int64]int{}
	for i, field := range strings.Split(value, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			return nil, fmt.Errorf("index %d is empty in %s", i, parse.Quote(value))
		}
		n, err := parse.Int32(field, "GPU index")
		if err != nil {
			return nil, fmt.Errorf("index %d: %w", i, err)
		}
		if first, dup := seen[n]; dup {
			return nil, fmt.Errorf("index %d: GPU %d already listed at index %d", i, n, first)
		}
		seen[n] = i
		devices = append(devices, model.Device{
			Allocator: GPUShareName,
			Type:      volcanoGPUType,
			Resource:  v.opts.Resource,
			Index:     &n,
		})
	}
	return devices, nil
}

// Wants implements allocator.Format: the number resource asks whole GPUs, the memory
// resource a share of one. The reported resource (nvidia.com/gpu) does not
// count: a container asking it is served by another device plugin.
func (v *GPUShare) Wants(_ model.Device, requests map[string]string) (whole int64, share bool) {
	if whole, share := parse.CountRequest(requests, v.opts.NumberResource); whole > 0 || share {
		return whole, share
	}
	if _, _, ok := parse.Quantity(requests[v.opts.MemoryResource]); ok {
		return 0, true
	}
	return 0, false
}
