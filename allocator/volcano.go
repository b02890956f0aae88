package allocator

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/podres-proxy/podres-proxy/model"
)

const (
	// VolcanoVGPUName is the Volcano vGPU decoder's Name and the Allocator
	// of its devices.
	VolcanoVGPUName = "volcano-vgpu"
	// VolcanoVGPUAnnotation is the pod annotation in which Volcano's vGPU
	// scheduler plugin (derived from HAMi) records the vGPUs it allocated,
	// in HAMi's format.
	VolcanoVGPUAnnotation = "volcano.sh/vgpu-ids-new"
	// DefaultVolcanoVGPUCountResource and DefaultVolcanoVGPUMemoryResource are
	// the requests by which Volcano's vGPU plugin decides that a container
	// gets vGPUs (its vgpu-number and vgpu-memory defaults).
	DefaultVolcanoVGPUCountResource  = "volcano.sh/vgpu-number"
	DefaultVolcanoVGPUMemoryResource = "volcano.sh/vgpu-memory"

	// VolcanoGPUShareName is the Volcano gpushare decoder's Name and the
	// Allocator of its devices.
	VolcanoGPUShareName = "volcano-gpushare"
	// VolcanoGPUShareAnnotation is the pod annotation in which Volcano's
	// gpushare plugin records the GPUs it chose, by nvidia-smi index.
	VolcanoGPUShareAnnotation = "volcano.sh/gpu-index"
	// DefaultVolcanoGPUNumberResource and DefaultVolcanoGPUMemoryResource
	// are the requests of Volcano's gpushare plugin: whole GPUs, or GPU
	// memory on a shared one.
	DefaultVolcanoGPUNumberResource = "volcano.sh/gpu-number"
	DefaultVolcanoGPUMemoryResource = "volcano.sh/gpu-memory"

	// volcanoGPUType is the inventory type Volcano's GPUs are translated as.
	volcanoGPUType = "gpu"
)

// VolcanoVGPUOptions configure the Volcano vGPU decoder. Empty fields take
// the defaults.
type VolcanoVGPUOptions struct {
	// Resource is the resource name the vGPUs are reported as; default
	// DefaultGPUResource, the one DCGM exporter matches.
	Resource string
	// CountResource and MemoryResource are the requests that make a
	// container one Volcano allocates to (Volcano's --vgpu-number and
	// --vgpu-memory resource names).
	CountResource  string // default DefaultVolcanoVGPUCountResource
	MemoryResource string // default DefaultVolcanoVGPUMemoryResource
}

// VolcanoVGPU decodes volcano.sh/vgpu-ids-new.
type VolcanoVGPU struct {
	opts VolcanoVGPUOptions
}

var _ Decoder = (*VolcanoVGPU)(nil)

// NewVolcanoVGPU returns the Volcano vGPU decoder.
func NewVolcanoVGPU(opts VolcanoVGPUOptions) Decoder {
	if opts.Resource == "" {
		opts.Resource = DefaultGPUResource
	}
	if opts.CountResource == "" {
		opts.CountResource = DefaultVolcanoVGPUCountResource
	}
	if opts.MemoryResource == "" {
		opts.MemoryResource = DefaultVolcanoVGPUMemoryResource
	}
	return &VolcanoVGPU{opts: opts}
}

// Name implements Decoder.
func (v *VolcanoVGPU) Name() string { return VolcanoVGPUName }

// ReplacedResources implements Replacer: Volcano's vGPU device plugin, like
// HAMi's, gives the kubelet ids that are not GPU UUIDs.
func (v *VolcanoVGPU) ReplacedResources() []string { return []string{v.opts.Resource} }

// Relevant implements Decoder.
func (v *VolcanoVGPU) Relevant(key string) bool { return key == VolcanoVGPUAnnotation }

// Decode implements Decoder. The value is in HAMi's format, with one entry
// per app container that requests vGPUs, so the devices' ContainerScope is
// model.ScopeRequesting.
func (v *VolcanoVGPU) Decode(annotations map[string]string) ([]model.Device, error) {
	value, ok := annotations[VolcanoVGPUAnnotation]
	if !ok {
		return nil, nil
	}
	return decodeHAMiList(VolcanoVGPUAnnotation, value, hamiList{
		allocator: VolcanoVGPUName,
		resource:  v.opts.Resource,
		scope:     model.ScopeRequesting,
	})
}

// Wants implements Decoder as Volcano's vGPU plugin reads requests: the
// count resource asks that many vGPUs, the memory resource alone one.
func (v *VolcanoVGPU) Wants(_ model.Device, requests map[string]string) (whole int64, share bool) {
	if _, ok := requests[v.opts.CountResource]; ok {
		return countRequest(requests, v.opts.CountResource)
	}
	if _, _, ok := quantity(requests[v.opts.MemoryResource]); ok {
		return 1, false
	}
	return 0, false
}

// VolcanoGPUShareOptions configure the Volcano gpushare decoder. Empty
// fields take the defaults.
type VolcanoGPUShareOptions struct {
	// Resource is the resource name the GPUs are reported as; default
	// DefaultGPUResource.
	Resource string
	// NumberResource asks whole GPUs, MemoryResource a share of one
	// (Volcano's gpushare request names).
	NumberResource string // default DefaultVolcanoGPUNumberResource
	MemoryResource string // default DefaultVolcanoGPUMemoryResource
}

// VolcanoGPUShare decodes volcano.sh/gpu-index.
type VolcanoGPUShare struct {
	opts VolcanoGPUShareOptions
}

var _ Decoder = (*VolcanoGPUShare)(nil)

// NewVolcanoGPUShare returns the Volcano gpushare decoder.
func NewVolcanoGPUShare(opts VolcanoGPUShareOptions) Decoder {
	if opts.Resource == "" {
		opts.Resource = DefaultGPUResource
	}
	if opts.NumberResource == "" {
		opts.NumberResource = DefaultVolcanoGPUNumberResource
	}
	if opts.MemoryResource == "" {
		opts.MemoryResource = DefaultVolcanoGPUMemoryResource
	}
	return &VolcanoGPUShare{opts: opts}
}

// Name implements Decoder.
func (v *VolcanoGPUShare) Name() string { return VolcanoGPUShareName }

// Relevant implements Decoder.
func (v *VolcanoGPUShare) Relevant(key string) bool { return key == VolcanoGPUShareAnnotation }

// Decode implements Decoder. The value is a comma-separated list of GPU
// indices ("0,2"), pod-level. Each becomes a device of type "gpu" with its
// Index and no ids: Translate fills the UUID in from the node's inventory.
// The devices are appended to what the kubelet reports, never replace it:
// the container they go to is the attribution policy's choice, not the
// allocator's. An empty value allocates nothing.
//
// A malformed list (an empty, non-numeric or negative index, one index
// twice) is rejected as a whole: with no structure to confine the damage,
// guessing which indices are right could name another pod's GPU.
func (v *VolcanoGPUShare) Decode(annotations map[string]string) ([]model.Device, error) {
	value, ok := annotations[VolcanoGPUShareAnnotation]
	if !ok {
		return nil, nil
	}
	devices, err := v.decode(value)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", VolcanoGPUShareAnnotation, err)
	}
	return devices, nil
}

func (v *VolcanoGPUShare) decode(value string) ([]model.Device, error) {
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	var devices []model.Device
	seen := map[int64]int{}
	for i, field := range strings.Split(value, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			return nil, fmt.Errorf("index %d is empty in %s", i, quote(value))
		}
		if strings.HasPrefix(field, "-") && isDigits(field[1:]) {
			return nil, fmt.Errorf("index %d: GPU index %s is negative", i, field)
		}
		if !isDigits(field) {
			return nil, fmt.Errorf("index %d: GPU index %s is not a number", i, quote(field))
		}
		n, err := strconv.ParseInt(field, 10, 64)
		if err != nil || n > math.MaxInt32 {
			return nil, fmt.Errorf("index %d: GPU index %s is out of range", i, field)
		}
		if first, dup := seen[n]; dup {
			return nil, fmt.Errorf("index %d: GPU %d already listed at index %d", i, n, first)
		}
		seen[n] = i
		devices = append(devices, model.Device{
			Allocator: VolcanoGPUShareName,
			Type:      volcanoGPUType,
			Resource:  v.opts.Resource,
			Index:     &n,
		})
	}
	return devices, nil
}

// Wants implements Decoder: the number resource asks whole GPUs, the memory
// resource a share of one. The reported resource (nvidia.com/gpu) does not
// count: a container asking it is served by another device plugin.
func (v *VolcanoGPUShare) Wants(_ model.Device, requests map[string]string) (whole int64, share bool) {
	if whole, share := countRequest(requests, v.opts.NumberResource); whole > 0 || share {
		return whole, share
	}
	if _, _, ok := quantity(requests[v.opts.MemoryResource]); ok {
		return 0, true
	}
	return 0, false
}
