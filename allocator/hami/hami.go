package hami

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

const (
	// Name is the HAMi decoder's Name and the Allocator of its devices.
	Name = "hami"
	// NVIDIAAnnotation is the pod annotation in which HAMi's scheduler
	// records the NVIDIA vGPUs it allocated. Other vendors' devices are under
	// hami.io/<vendor>-devices-allocated, in the same format.
	NVIDIAAnnotation = "hami.io/vgpu-devices-allocated"

	hamiKeyPrefix = "hami.io/"
	hamiKeySuffix = "-devices-allocated"
	// hamiAscendPrefix starts the vendor word of every Ascend chip (HAMi
	// names Ascend keys after the chip's commonWord, "Ascend910B2"); the
	// Ascend device plugin names its resource huawei.com/<commonWord>.
	hamiAscendPrefix = "Ascend"
)

// DefaultResources returns the resource name each HAMi vendor's devices
// are reported as, keyed by the <vendor> word of their annotation
// hami.io/<vendor>-devices-allocated. They are the count resources of the
// device plugins HAMi deploys (HAMi's chart defaults), so that the decoded
// ids replace exactly the ids those plugins gave the kubelet. A vendor word
// starting with "Ascend" that is not listed maps to huawei.com/<word>.
func DefaultResources() map[string]string {
	return map[string]string{
		"vgpu":          parse.DefaultGPUResource, // NVIDIA; what DCGM exporter matches
		"amd":           "amd.com/gpu",
		"aws-neuron":    "aws.amazon.com/neuron",
		"Biren":         "birentech.com/gpu",
		"cambricon-mlu": "cambricon.com/vmlu",
		"dcu":           "hygon.com/dcunum", // Hygon DCU
		"enflame-gcu":   "enflame.com/gcu",
		"enflame-vgpu":  "enflame.com/drs-gcu",
		"metax-gpu":     "metax-tech.com/gpu",
		"metax-sgpu":    "metax-tech.com/sgpu",
		"mthreads-vgpu": "mthreads.com/vgpu",
		"Vastai":        "vastaitech.com/va",
		"xpu":           "kunlunxin.com/vxpu", // Kunlunxin
		"MR-V100":       "iluvatar.ai/MR-V100-vgpu",
		"MR-V50":        "iluvatar.ai/MR-V50-vgpu",
		"BI-V100":       "iluvatar.ai/BI-V100-vgpu",
		"BI-V150":       "iluvatar.ai/BI-V150-vgpu",
	}
}

// Options configure the HAMi decoder.
type Options struct {
	// Resources maps a vendor word (the <vendor> of
	// hami.io/<vendor>-devices-allocated) to the resource name its devices
	// are reported as. Entries override DefaultHAMiResources; an empty name
	// removes a default, and that vendor's annotation is then skipped with
	// an error like an unknown vendor's.
	Resources map[string]string
}

// Format decodes hami.io/<vendor>-devices-allocated.
type Format struct {
	resources map[string]string // vendor word -> resource name
}

// New returns the HAMi decoder.
func New(opts Options) *Format {
	h := &Format{resources: DefaultResources()}
	for vendor, name := range opts.Resources {
		if name == "" {
			delete(h.resources, vendor)
			continue
		}
		h.resources[vendor] = name
	}
	return h
}

// Name implements allocator.Format.
func (h *Format) Name() string { return Name }

// ReplacedResources implements allocator.Replacer: every resource HAMi reports.
func (h *Format) ReplacedResources() []string {
	return slices.Compact(slices.Sorted(maps.Values(h.resources)))
}

// Relevant implements allocator.Format: every vendor's allocated-devices key, not the
// in-flight -devices-to-allocate ones, which the device plugin empties
// container by container as the kubelet allocates; and the MIG instances
// HAMi's NVIDIA device plugin records.
func (h *Format) Relevant(key string) bool {
	if key == MIGAnnotation {
		return true
	}
	_, ok := hamiVendor(key)
	return ok
}

// hamiVendor returns the <vendor> word of hami.io/<vendor>-devices-allocated.
func hamiVendor(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, hamiKeyPrefix)
	if !ok {
		return "", false
	}
	vendor, ok := strings.CutSuffix(rest, hamiKeySuffix)
	if !ok || vendor == "" {
		return "", false
	}
	return vendor, true
}

// resource returns the resource name a vendor's devices are reported as.
func (h *Format) resource(vendor string) (string, bool) {
	if name, ok := h.resources[vendor]; ok {
		return name, true
	}
	if strings.HasPrefix(vendor, hamiAscendPrefix) && len(vendor) > len(hamiAscendPrefix) {
		return "huawei.com/" + vendor, true
	}
	return "", false
}

// Decode implements allocator.Format. Keys are read in sorted order. A vendor
// without a resource name is skipped with an error naming its key; a
// malformed container entry loses that container's devices only (see the
// package doc).
func (h *Format) Decode(annotations map[string]string) ([]model.Device, error) {
	var keys []string
	for key := range annotations {
		if _, ok := hamiVendor(key); ok {
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	slices.Sort(keys)
	var devices []model.Device
	var errs []error
	var migs map[migSlot]string
	if value, ok := annotations[MIGAnnotation]; ok {
		var err error
		if migs, err = parseMIGAllocations(value); err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w: MIG instances reported as their parent GPU", MIGAnnotation, err))
		}
	}
	for _, key := range keys {
		vendor, _ := hamiVendor(key)
		name, ok := h.resource(vendor)
		if !ok {
			errs = append(errs, fmt.Errorf("decode %s: no resource name for vendor %q: skipped (configure one)", key, vendor))
			continue
		}
		l := List{Allocator: Name, Resource: name, Scope: model.ScopeRequestingAll}
		if key == NVIDIAAnnotation {
			l.migs = migs
		}
		got, err := DecodeList(key, annotations[key], l)
		devices = append(devices, got...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return devices, errors.Join(errs...)
}

// Wants implements allocator.Format with the requests HAMi's own code counts
// (each vendor's GenerateResourceRequests). Most vendors count devices in
// the resource the devices are reported as (nvidia.com/gpu: 2 is two
// vGPUs); their memory and core resources only size each one. AWS Neuron is
// the exception: a container asking only aws.amazon.com/neuroncore gets
// devices too, as many as the cores fill (neuronCoresPerDevice each, one
// device, shared, for fewer), so HAMi writes an allocation for it. HAMi
// devices carry a ContainerIndex, so Wants decides which containers a list's
// entries stand for and whether any container asked at all.
func (h *Format) Wants(dev model.Device, requests map[string]string) (whole int64, share bool) {
	if whole, share = parse.CountRequest(requests, dev.Resource); whole > 0 || share {
		return whole, share
	}
	if dev.Resource == h.resources[neuronVendor] {
		return neuronCores(requests)
	}
	return 0, false
}

// AWS Neuron: HAMi's vendor word, the core resource its awsneuron device
// counts devices in when the count resource is absent, and the cores per
// device it assumes (HAMi caps the node's cores per device at two).
const (
	neuronVendor         = "aws-neuron"
	neuronCoreResource   = "aws.amazon.com/neuroncore"
	neuronCoresPerDevice = 2
)

// neuronCores reads a NeuronCore request as HAMi's awsneuron device splits
// it: up to neuronCoresPerDevice cores are one device (a share of it when
// fewer), more are that many cores per device. HAMi refuses a count it
// cannot split (3 cores); such a container asks nothing.
func neuronCores(requests map[string]string) (whole int64, share bool) {
	cores, fraction := parse.CountRequest(requests, neuronCoreResource)
	switch {
	case fraction || cores <= 0:
		return 0, false
	case cores < neuronCoresPerDevice:
		return 0, true
	case cores%neuronCoresPerDevice != 0:
		return 0, false
	default:
		return cores / neuronCoresPerDevice, false
	}
}

// SchedulerNames implements allocator.Scheduled.
func (h *Format) SchedulerNames() []string { return []string{"hami-scheduler"} }

// VolcanoVGPUName is the name of Volcano's vGPU decoder (volcano.VGPUName,
// defined here because package volcano imports this one), whose scheduler
// writes HAMi's Ascend keys.
const VolcanoVGPUName = "volcano-vgpu"

// AlsoWrittenBy implements allocator.CoWritten: Volcano's vNPU support (its
// HAMi-core Ascend path) writes hami.io/Ascend<chip>-devices-allocated on
// Volcano's pods, with HAMi's encoding, and the Ascend device plugin hands
// those NPUs out; it writes no other HAMi key. A device is Ascend when its
// type is a vendor word starting with "Ascend" whose key's devices are
// reported as dev's resource: the type is the annotation's, but the resource
// comes from the key, so a device of another key (NVIDIA's vGPUs, say) that
// claims an Ascend type is not Ascend.
func (h *Format) AlsoWrittenBy(dev model.Device) []string {
	if !strings.HasPrefix(dev.Type, hamiAscendPrefix) {
		return nil
	}
	if name, ok := h.resource(dev.Type); !ok || name != dev.Resource {
		return nil
	}
	return []string{VolcanoVGPUName}
}
