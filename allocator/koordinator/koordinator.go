package koordinator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

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
	if opts.GPUResource == "" {
		opts.GPUResource = parse.DefaultGPUResource
	}
	if opts.RDMAResource == "" {
		opts.RDMAResource = DefaultRDMAResource
	}
	if opts.FPGAResource == "" {
		opts.FPGAResource = DefaultFPGAResource
	}
	k := &Format{
		resource: map[string]string{
			koordGPU:  opts.GPUResource,
			koordRDMA: opts.RDMAResource,
			koordFPGA: opts.FPGAResource,
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

// Relevant implements allocator.Format: the allocation, and the pod's hint, which
// says how the containers' requests count.
func (k *Format) Relevant(key string) bool {
	return key == Annotation || key == HintAnnotation
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
	types := make([]string, 0, len(byType))
	for typ := range byType {
		types = append(types, typ)
	}
	slices.Sort(types)

	var devices []model.Device
	var unknown []string
	owner := map[string]string{} // device id -> where it was first seen
	for _, typ := range types {
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

// allocation is one entry of a device type's list, validated.
type allocation struct {
	minor     *int64
	id        string
	resources map[string]resource.Quantity
	vfs       []string // busIDs, in annotation order
	template  string   // gpuSharedResourceTemplate
}

// parseAllocation reads one entry field by field, so that an error names the
// field and the value at fault. Fields it does not know are ignored (a newer
// Koordinator may add some); a null field counts as absent, like Go's
// omitempty would have left it.
func parseAllocation(raw json.RawMessage) (allocation, error) {
	var a allocation
	fields, err := object(raw, "allocation")
	if err != nil {
		return a, err
	}
	if v := fields["minor"]; !isNull(v) {
		n, err := integer(v, "minor")
		if err != nil {
			return a, err
		}
		if n < 0 || n > math.MaxInt32 {
			return a, fmt.Errorf("minor %d out of range [0, %d]", n, math.MaxInt32)
		}
		a.minor = &n
	}
	if v := fields["id"]; !isNull(v) {
		if a.id, err = str(v, "id"); err != nil {
			return a, err
		}
	}
	if v := fields["resources"]; !isNull(v) {
		if a.resources, err = quantities(v); err != nil {
			return a, err
		}
	}
	if v := fields["extension"]; !isNull(v) {
		if err := parseExtension(v, &a); err != nil {
			return a, fmt.Errorf("extension: %w", err)
		}
	}
	return a, nil
}

func parseExtension(raw json.RawMessage, a *allocation) error {
	fields, err := object(raw, "extension")
	if err != nil {
		return err
	}
	if v := fields["gpuSharedResourceTemplate"]; !isNull(v) {
		if a.template, err = str(v, "gpuSharedResourceTemplate"); err != nil {
			return err
		}
	}
	v := fields["vfs"]
	if isNull(v) {
		return nil
	}
	var vfs []json.RawMessage
	if err := json.Unmarshal(v, &vfs); err != nil {
		return fmt.Errorf("vfs: want a list, got %s", excerpt(v))
	}
	for i, vf := range vfs {
		where := fmt.Sprintf("vfs[%d]", i)
		f, err := object(vf, "VF")
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		// A VF's minor (0..n, omitted when 0) is not reported; only its type
		// is checked.
		if m := f["minor"]; !isNull(m) {
			if _, err := integer(m, "minor"); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		var busID string
		if b := f["busID"]; !isNull(b) {
			if busID, err = str(b, "busID"); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		if busID == "" {
			// Skipping it would shift every later VF onto the wrong network
			// attachment in Multus, which hands ids out in order.
			return fmt.Errorf("%s: no busID", where)
		}
		a.vfs = append(a.vfs, busID)
	}
	return nil
}

// quantities reads a resource list whose values are Kubernetes quantities,
// as strings ("23040Mi") or bare JSON numbers (100).
func quantities(raw json.RawMessage) (map[string]resource.Quantity, error) {
	fields, err := object(raw, "resources")
	if err != nil {
		return nil, fmt.Errorf("resources: %w", err)
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names) // the first bad one reported is always the same
	out := make(map[string]resource.Quantity, len(fields))
	for _, name := range names {
		v := fields[name]
		text := string(v)
		if len(v) > 0 && v[0] == '"' {
			if err := json.Unmarshal(v, &text); err != nil {
				return nil, fmt.Errorf("resources %s: %w", name, err)
			}
		} else if len(v) == 0 || !(v[0] == '-' || v[0] >= '0' && v[0] <= '9') {
			return nil, fmt.Errorf("resources %s: want a quantity, got %s", name, excerpt(v))
		}
		q, err := resource.ParseQuantity(text)
		if err != nil {
			return nil, fmt.Errorf("resources %s: %q: %w", name, text, err)
		}
		if q.Sign() < 0 {
			return nil, fmt.Errorf("resources %s: negative quantity %s", name, q.String())
		}
		out[name] = q
	}
	return out, nil
}

func object(raw json.RawMessage, what string) (map[string]json.RawMessage, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("null %s", what)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("want a JSON object, got %s", excerpt(raw))
	}
	return fields, nil
}

func integer(raw json.RawMessage, field string) (int64, error) {
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("%s: want an integer, got %s", field, excerpt(raw))
	}
	return n, nil
}

func str(raw json.RawMessage, field string) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: want a string, got %s", field, excerpt(raw))
	}
	return s, nil
}

// isNull reports whether a field is absent (nil) or JSON null.
func isNull(raw json.RawMessage) bool {
	return raw == nil || bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// excerpt quotes a JSON value for an error message, shortened: annotations
// can be long and end up in logs and records.
func excerpt(raw json.RawMessage) string {
	const max = 40
	s := string(raw)
	if len(s) > max {
		s = s[:max] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// Wants implements allocator.Format; the package doc has the table of which request
// asks for which device type and how it counts.
func (k *Format) Wants(dev model.Device, requests map[string]string) (whole int64, share bool) {
	typ := dev.Type
	if _, known := k.resource[typ]; !known {
		typ = k.typeOf(dev.Resource)
	}
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
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Sign() <= 0 {
			continue // not a request we can read: it asks for nothing
		}
		n, exact := q.Value(), q.CmpInt64(q.Value()) == 0
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
