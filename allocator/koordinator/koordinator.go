package koordinator

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

const (
	// Name is the Koordinator decoder's Name and the Allocator
	// of its devices.
	Name = "koordinator"
	// Annotation is the pod annotation koord-scheduler writes at
	// PreBind with the pod's device allocation.
	Annotation = "scheduling.koordinator.sh/device-allocated"
	// HintAnnotation is the pod's own input to koord-scheduler:
	// per device type, how to allocate. Its allocateStrategy
	// "RequestsAsCount" makes koordinator.sh/rdma and koordinator.sh/fpga
	// requests count devices (VFs) instead of percent.
	HintAnnotation = "scheduling.koordinator.sh/device-allocate-hint"
	// koordRequestsAsCount is the allocateStrategy that counts devices.
	koordRequestsAsCount = "RequestsAsCount"

	// DefaultRDMAResource is the resource name RDMA devices are reported as
	// by default: the one Koordinator's docs put in NetworkAttachmentDefinitions.
	DefaultRDMAResource = "koordinator.sh/rdma"
	// DefaultFPGAResource is the resource name FPGAs are reported as by default.
	DefaultFPGAResource = "koordinator.sh/fpga"
)

// Koordinator's device types: the keys of the annotation's JSON object.
const (
	koordGPU  = "gpu"
	koordRDMA = "rdma"
	koordFPGA = "fpga"
)

// Resource names Koordinator uses in pod requests and in allocations.
const (
	koordResGPU            = "koordinator.sh/gpu"
	koordResGPUShared      = "koordinator.sh/gpu.shared"
	koordResGPUCore        = "koordinator.sh/gpu-core"
	koordResGPUMemory      = "koordinator.sh/gpu-memory"
	koordResGPUMemoryRatio = "koordinator.sh/gpu-memory-ratio"
	koordResRDMA           = "koordinator.sh/rdma"
	koordResFPGA           = "koordinator.sh/fpga"
)

// Options say which resource name each Koordinator device type is
// reported as. Consumers match resource names exactly (Multus against the
// NetworkAttachmentDefinition, DCGM against nvidia.com/gpu), so a node whose
// "gpu" devices are another vendor's sets GPUResource to that vendor's name.
// Empty fields take the defaults.
type Options struct {
	GPUResource  string // default DefaultGPUResource
	RDMAResource string // default DefaultRDMAResource
	FPGAResource string // default DefaultFPGAResource
}

// requestKind is how a pod resource request counts devices.
type requestKind int

const (
	countsDevices requestKind = iota // n devices (vendor device-plugin style)
	countsPercent                    // 100 per device, Koordinator style
	asksShare                        // some of a device, however much
)

// Format decodes scheduling.koordinator.sh/device-allocated.
type Format struct {
	resource map[string]string                 // device type -> reported resource name
	requests map[string]map[string]requestKind // device type -> pod resource -> how it counts
}

// New returns the Koordinator decoder.
func New(opts Options) *Format {
	k := &Format{
		resource: map[string]string{
			koordGPU:  cmp.Or(opts.GPUResource, parse.DefaultGPUResource),
			koordRDMA: cmp.Or(opts.RDMAResource, DefaultRDMAResource),
			koordFPGA: cmp.Or(opts.FPGAResource, DefaultFPGAResource),
		},
		requests: map[string]map[string]requestKind{
			koordGPU: {
				koordResGPU:            countsPercent,
				koordResGPUCore:        countsPercent,
				koordResGPUMemoryRatio: countsPercent,
				koordResGPUMemory:      asksShare,
				koordResGPUShared:      asksShare,
			},
			koordRDMA: {koordResRDMA: countsPercent},
			koordFPGA: {koordResFPGA: countsPercent},
		},
	}
	// A configured name that is one of Koordinator's own keeps Koordinator's
	// meaning; any other is a vendor device-plugin resource counting devices.
	for typ, name := range k.resource {
		if _, own := k.requests[typ][name]; !own {
			k.requests[typ][name] = countsDevices
		}
	}
	return k
}

// Name implements allocator.Format.
func (k *Format) Name() string { return Name }

// SchedulerNames implements allocator.Scheduled.
func (k *Format) SchedulerNames() []string { return []string{"koord-scheduler"} }

// Exclusive implements allocator.Exclusive: Koordinator's allocation of a
// whole device (a whole GPU, a VF, an RDMA PF without VFs, an FPGA) is the
// pod's alone; a share (a fractional gpu-core) is shared by design.
func (k *Format) Exclusive(dev model.Device) bool { return !dev.Shared }

// Cap implements allocator.Capped: Koordinator allocates per pod from the sum
// of its containers' requests, each whole device or share counted. Its joint
// allocation (device-joint-allocate, GPU first) gives one RDMA device (or
// FPGA) per PCIe switch of the pod's GPUs, whatever their own request, so of
// those the pod may hold up to as many as the GPUs it asks for; the
// joint-allocate annotation itself is not read.
func (k *Format) Cap(dev model.Device, asks func(model.Device) int64) int64 {
	n := asks(dev)
	if dev.Type == koordRDMA || dev.Type == koordFPGA {
		n = max(n, asks(model.Device{Allocator: Name, Type: koordGPU}))
	}
	return n
}

// Relevant implements allocator.Format: the allocation, and the pod's hint, which
// says how the containers' requests count.
func (k *Format) Relevant(key string) bool {
	return key == Annotation || key == HintAnnotation
}

// maxHintBytes bounds the hint a pod source keeps: the decoder reads one
// word of it (allocateStrategy, per device type), and a selector and a
// policy for two device types fit many times over. The pod's owner writes
// it (an admission policy that stops forged allocations leaves it
// writable), so it must not cost what an allocation may.
const maxHintBytes = 4 << 10

// MaxAnnotationBytes implements allocator.Bounded: the hint is small; the
// allocation takes the default bound.
func (k *Format) MaxAnnotationBytes(key string) int {
	if key == HintAnnotation {
		return maxHintBytes
	}
	return 0
}

// Decode implements allocator.Format. A hint that cannot be read is reported and
// the allocation is read as if there were none (requests in percent): the
// devices are the pod's either way, only their split between its
// containers could be off.
func (k *Format) Decode(annotations map[string]string) ([]model.Device, error) {
	value, ok := annotations[Annotation]
	if !ok {
		return nil, nil
	}
	var hintErr error
	var counted map[string]bool
	if hint, ok := annotations[HintAnnotation]; ok {
		if counted, hintErr = requestsAsCount(hint); hintErr != nil {
			hintErr = fmt.Errorf("decode %s: %w: requests read in percent", HintAnnotation, hintErr)
		}
	}
	devices, err := k.decode(value, counted)
	if err != nil {
		return devices, errors.Join(fmt.Errorf("decode %s: %w", Annotation, err), hintErr)
	}
	return devices, hintErr
}

// requestsAsCount returns the device types (rdma, fpga) whose hint asks
// the RequestsAsCount strategy. Other fields and types are not read.
func requestsAsCount(hint string) (map[string]bool, error) {
	var byType map[string]json.RawMessage
	if err := json.Unmarshal([]byte(hint), &byType); err != nil {
		return nil, fmt.Errorf("want a JSON object of device types: %w", err)
	}
	out := map[string]bool{}
	for _, typ := range []string{koordRDMA, koordFPGA} {
		raw := byType[typ]
		if isNull(raw) {
			continue
		}
		fields, err := object(raw, typ)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", typ, err)
		}
		if v := fields["allocateStrategy"]; !isNull(v) {
			strategy, err := str(v, typ+".allocateStrategy")
			if err != nil {
				return nil, err
			}
			out[typ] = strategy == koordRequestsAsCount
		}
	}
	return out, nil
}

// decode reads the allocation; counted are the device types whose requests
// count devices (RequestsAsCount).
func (k *Format) decode(value string, counted map[string]bool) ([]model.Device, error) {
	var byType map[string]json.RawMessage
	if err := json.Unmarshal([]byte(value), &byType); err != nil {
		return nil, fmt.Errorf("want a JSON object of device types: %w", err)
	}
	if byType == nil {
		return nil, errors.New("want a JSON object of device types, got null")
	}
	var devices []model.Device
	var unknown []string
	owner := map[string]string{} // device id -> where it was first seen
	for _, typ := range slices.Sorted(maps.Keys(byType)) {
		if _, known := k.resource[typ]; !known {
			unknown = append(unknown, typ)
			continue
		}
		raw := byType[typ]
		if isNull(raw) {
			continue // Go encodes a type with no allocations as null
		}
		var entries []json.RawMessage
		if err := json.Unmarshal(raw, &entries); err != nil {
			return nil, fmt.Errorf("%s: want a list of allocations, got %s", typ, excerpt(raw))
		}
		for i, entry := range entries {
			where := fmt.Sprintf("%s[%d]", typ, i)
			a, err := parseAllocation(entry)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			dev, err := k.device(typ, a)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			for _, id := range dev.IDs {
				if first, dup := owner[id]; dup {
					return nil, fmt.Errorf("%s: device id %q already allocated by %s", where, id, first)
				}
				owner[id] = where
			}
			if counted[typ] {
				devices = append(devices, countedDevices(dev)...)
				continue
			}
			devices = append(devices, dev)
		}
	}
	if len(unknown) > 0 {
		return devices, fmt.Errorf("unknown device type %s skipped (known: fpga, gpu, rdma)", quoteAll(unknown))
	}
	return devices, nil
}

// device maps one allocation to the device consumers are shown.
func (k *Format) device(typ string, a allocation) (model.Device, error) {
	dev := model.Device{
		Allocator: Name,
		Type:      typ,
		Resource:  k.resource[typ],
		Minor:     a.minor,
	}
	switch {
	case typ == koordRDMA && len(a.vfs) > 0:
		// The pod got VFs of this PF: Multus must hand a VF's address to
		// SR-IOV CNI, which refuses the PF's.
		dev.IDs = a.vfs
	case a.id != "":
		dev.IDs = []string{a.id}
	}
	if len(dev.IDs) == 0 && dev.Minor == nil {
		return model.Device{}, errors.New("allocation has neither id, VFs nor minor: it names no device")
	}
	switch typ {
	case koordGPU:
		dev.Shared = a.template != "" ||
			below100(a.resources, koordResGPUCore) ||
			below100(a.resources, koordResGPUMemoryRatio)
	case koordRDMA:
		dev.Shared = len(a.vfs) == 0 && below100(a.resources, koordResRDMA)
	case koordFPGA:
		dev.Shared = below100(a.resources, koordResFPGA)
	}
	return dev, nil
}

// countedDevices splits an allocation whose requests count devices
// (RequestsAsCount) into one whole device per id: koordinator.sh/rdma: 1
// asks one VF, so each VF is a device a container can be given alone.
func countedDevices(dev model.Device) []model.Device {
	dev.Shared, dev.CountsRequests = false, true
	if len(dev.IDs) <= 1 {
		return []model.Device{dev}
	}
	out := make([]model.Device, 0, len(dev.IDs))
	for _, id := range dev.IDs {
		one := dev
		one.IDs = []string{id}
		out = append(out, one)
	}
	return out
}

// below100 reports whether the allocation holds less than a whole device of
// a percentage resource. Absent means the allocation does not say.
func below100(resources map[string]resource.Quantity, name string) bool {
	q, ok := resources[name]
	return ok && q.CmpInt64(100) < 0
}

// Wants implements allocator.Format; the package doc has the table of which request
// asks for which device type and how it counts.
func (k *Format) Wants(dev model.Device, requests map[string]string) (whole int64, share bool) {
	typ := k.deviceType(dev)
	names := k.requests[typ]
	if len(names) == 0 || len(requests) == 0 {
		return 0, false
	}
	fraction, shareOnly := false, false
	for name, kind := range names {
		v, ok := requests[name]
		if !ok {
			continue
		}
		n, part, ok := parse.Quantity(v)
		if !ok {
			continue // not a request we can read: it asks for nothing
		}
		exact := !part
		if kind == countsPercent && dev.CountsRequests {
			kind = countsDevices // RequestsAsCount: koordinator.sh/rdma: 1 is one VF
		}
		switch kind {
		case countsDevices:
			if exact {
				whole = max(whole, n)
			} else {
				fraction = true
			}
		case countsPercent:
			if exact && n%100 == 0 {
				whole = max(whole, n/100)
			} else {
				fraction = true
			}
		case asksShare:
			shareOnly = true
		}
	}
	switch {
	case fraction:
		return 0, true
	case whole > 0:
		return whole, false
	default:
		return 0, shareOnly
	}
}

// Asks implements allocator.Asker: the whole devices Wants counts, or one
// for a share, or as many as koordinator.sh/gpu.shared asks to share (a
// GPU request spread over that many GPUs), whichever is more.
func (k *Format) Asks(dev model.Device, requests map[string]string) int64 {
	n, share := k.Wants(dev, requests)
	if n == 0 && !share {
		return 0
	}
	if share {
		n = max(n, 1)
	}
	if v, ok := requests[koordResGPUShared]; ok && k.requests[k.deviceType(dev)][koordResGPUShared] == asksShare {
		if shared, fraction, ok := parse.Quantity(v); ok && !fraction {
			n = max(n, shared)
		}
	}
	return n
}

// deviceType returns dev's Koordinator device type: its Type, or for a
// device that lost it, the type its resource is reported for.
func (k *Format) deviceType(dev model.Device) string {
	if _, known := k.resource[dev.Type]; known {
		return dev.Type
	}
	return k.typeOf(dev.Resource)
}

// typeOf finds the device type a resource name is reported for, for devices
// that lost their Type; "" if none.
func (k *Format) typeOf(resourceName string) string {
	for _, typ := range []string{koordGPU, koordRDMA, koordFPGA} {
		if k.resource[typ] == resourceName {
			return typ
		}
	}
	return ""
}
