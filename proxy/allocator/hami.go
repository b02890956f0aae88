package allocator

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podres-proxy/podres-proxy/state"
)

const (
	// HAMiName is the HAMi decoder's Name and the Allocator of its devices.
	HAMiName = "hami"
	// HAMiNVIDIAAnnotation is the pod annotation in which HAMi's scheduler
	// records the NVIDIA vGPUs it allocated. Other vendors' devices are under
	// hami.io/<vendor>-devices-allocated, in the same format.
	HAMiNVIDIAAnnotation = "hami.io/vgpu-devices-allocated"

	hamiKeyPrefix = "hami.io/"
	hamiKeySuffix = "-devices-allocated"
	// hamiAscendPrefix starts the vendor word of every Ascend chip (HAMi
	// names Ascend keys after the chip's commonWord, "Ascend910B2"); the
	// Ascend device plugin names its resource huawei.com/<commonWord>.
	hamiAscendPrefix = "Ascend"
)

// DefaultHAMiResources returns the resource name each HAMi vendor's devices
// are reported as, keyed by the <vendor> word of their annotation
// hami.io/<vendor>-devices-allocated. They are the count resources of the
// device plugins HAMi deploys (HAMi's chart defaults), so that the decoded
// ids replace exactly the ids those plugins gave the kubelet. A vendor word
// starting with "Ascend" that is not listed maps to huawei.com/<word>.
func DefaultHAMiResources() map[string]string {
	return map[string]string{
		"vgpu":          DefaultGPUResource, // NVIDIA; what DCGM exporter matches
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

// HAMiOptions configure the HAMi decoder.
type HAMiOptions struct {
	// Resources maps a vendor word (the <vendor> of
	// hami.io/<vendor>-devices-allocated) to the resource name its devices
	// are reported as. Entries override DefaultHAMiResources; an empty name
	// removes a default, and that vendor's annotation is then skipped with
	// an error like an unknown vendor's.
	Resources map[string]string
	// LegacyIndexing is ignored and kept for the --hami-legacy-indexing
	// flag's sake. It chose between HAMi's two ways of padding its list
	// (app containers only, before HAMi's PR #1650; every container, init
	// containers first, after). The decoder now reads what HAMi's device
	// plugin reads, the k-th non-empty entry for the k-th container asking
	// for the vendor's resource, which is right for both and for recent
	// HAMi, which pads no longer.
	LegacyIndexing bool
}

// HAMi decodes hami.io/<vendor>-devices-allocated.
type HAMi struct {
	resources map[string]string // vendor word -> resource name
}

var _ Decoder = (*HAMi)(nil)

// NewHAMi returns the HAMi decoder.
func NewHAMi(opts HAMiOptions) Decoder {
	h := &HAMi{resources: DefaultHAMiResources()}
	for vendor, name := range opts.Resources {
		if name == "" {
			delete(h.resources, vendor)
			continue
		}
		h.resources[vendor] = name
	}
	return h
}

// Name implements Decoder.
func (h *HAMi) Name() string { return HAMiName }

// ReplacedResources implements Replacer: every resource HAMi reports.
func (h *HAMi) ReplacedResources() []string {
	var out []string
	for _, name := range h.resources {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Relevant implements Decoder: every vendor's allocated-devices key, not the
// in-flight -devices-to-allocate ones, which the device plugin empties
// container by container as the kubelet allocates; and the MIG instances
// HAMi's NVIDIA device plugin records.
func (h *HAMi) Relevant(key string) bool {
	if key == HAMiMIGAnnotation {
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
func (h *HAMi) resource(vendor string) (string, bool) {
	if name, ok := h.resources[vendor]; ok {
		return name, true
	}
	if strings.HasPrefix(vendor, hamiAscendPrefix) && len(vendor) > len(hamiAscendPrefix) {
		return "huawei.com/" + vendor, true
	}
	return "", false
}

// Decode implements Decoder. Keys are read in sorted order. A vendor
// without a resource name is skipped with an error naming its key; a
// malformed container entry loses that container's devices only (see the
// package doc).
func (h *HAMi) Decode(annotations map[string]string) ([]state.Device, error) {
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
	var devices []state.Device
	var errs []error
	var migs map[migSlot]string
	if value, ok := annotations[HAMiMIGAnnotation]; ok {
		var err error
		if migs, err = parseMIGAllocations(value); err != nil {
			errs = append(errs, fmt.Errorf("decode %s: %w: MIG instances reported as their parent GPU", HAMiMIGAnnotation, err))
		}
	}
	for _, key := range keys {
		vendor, _ := hamiVendor(key)
		name, ok := h.resource(vendor)
		if !ok {
			errs = append(errs, fmt.Errorf("decode %s: no resource name for vendor %q: skipped (configure one)", key, vendor))
			continue
		}
		l := hamiList{allocator: HAMiName, resource: name, scope: state.ScopeRequestingAll}
		if key == HAMiNVIDIAAnnotation {
			l.migs = migs
		}
		got, err := decodeHAMiList(key, annotations[key], l)
		devices = append(devices, got...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return devices, errors.Join(errs...)
}

// Wants implements Decoder. HAMi's device plugins count devices in the
// resource the devices are reported as (nvidia.com/gpu: 2 is two vGPUs);
// their memory and core resources only size each one. HAMi devices carry a
// ContainerIndex, so this matters only when the index is outside the pod.
func (h *HAMi) Wants(dev state.Device, requests map[string]string) (whole int64, share bool) {
	return countRequest(requests, dev.Resource)
}

// countRequest reads a request that counts devices: whole devices, or a
// share for a fractional quantity; (0, false) when absent, unreadable or
// not positive.
func countRequest(requests map[string]string, name string) (whole int64, share bool) {
	v, ok := requests[name]
	if !ok {
		return 0, false
	}
	n, fraction, ok := quantity(v)
	switch {
	case !ok:
		return 0, false
	case fraction:
		return 0, true
	default:
		return n, false
	}
}

// hamiList says how devices of one HAMi-format annotation are reported.
type hamiList struct {
	allocator string
	resource  string
	// scope is the containers the list's entries stand for. With
	// state.ScopeRequestingAll the devices' ContainerIndex counts non-empty
	// entries only; otherwise every entry, empty or not.
	scope state.ContainerScope
	// migs are the MIG instances known for (entry, device) positions.
	migs map[migSlot]string
}

// decodeHAMiList decodes one annotation in HAMi's format (HAMi's
// hami.io/<vendor>-devices-allocated and Volcano's volcano.sh/vgpu-ids-new):
// containers separated by ';', each a list of devices "UUID,Type,mem,cores"
// each followed by ':'. Every device gets its container's index and the
// list's length as l.scope counts them (every entry, or only non-empty ones
// for state.ScopeRequestingAll), and Replace: the per-container device
// plugins of both allocators give the kubelet ids that name no real device.
//
// A container entry that cannot be read loses its devices and is reported;
// the other containers keep theirs. That is safe because ';' alone decides
// positions, so one container's damage cannot move another's devices.
func decodeHAMiList(key, value string, l hamiList) ([]state.Device, error) {
	containers := splitContainers(value)
	count := len(containers)
	byOrdinal := l.scope == state.ScopeRequestingAll
	if byOrdinal {
		count = 0
		for _, entry := range containers {
			if !emptyEntry(entry) {
				count++
			}
		}
	}
	var devices []state.Device
	var errs []error
	more := 0    // malformed containers beyond maxContainerErrors
	ordinal := 0 // non-empty entries before this one
	for i, entry := range containers {
		index := i
		if byOrdinal {
			if emptyEntry(entry) {
				continue
			}
			index = ordinal
			ordinal++
		}
		parsed, err := parseHAMiContainer(entry, i, l.migs)
		if err != nil {
			if len(errs) < maxContainerErrors {
				errs = append(errs, fmt.Errorf("decode %s: container %d %s: %w", key, i, quote(entry), err))
			} else {
				more++
			}
			continue
		}
		for _, d := range parsed {
			devices = append(devices, state.Device{
				Allocator:      l.allocator,
				Type:           d.typ,
				Resource:       l.resource,
				IDs:            []string{d.id},
				Parent:         d.parent,
				Shared:         d.shared,
				ContainerIndex: &index,
				ContainerScope: l.scope,
				ContainerCount: count,
				Replace:        true,
			})
		}
	}
	if more > 0 {
		errs = append(errs, fmt.Errorf("decode %s: %d more malformed containers", key, more))
	}
	return devices, errors.Join(errs...)
}

// maxContainerErrors bounds the errors one annotation reports in detail:
// they are logged and kept in the pod's record.
const maxContainerErrors = 3

// splitContainers splits a HAMi-format value into one entry per container.
// HAMi ends every container's entry with ';', so the empty text after the
// last one is not a container; Volcano joins entries with ';' and writes
// no trailing one. An empty value covers no container.
func splitContainers(value string) []string {
	if strings.TrimSpace(value) == "" {
		return nil
	}
	entries := strings.Split(value, ";")
	if len(entries) > 1 && strings.TrimSpace(entries[len(entries)-1]) == "" {
		entries = entries[:len(entries)-1]
	}
	return entries
}

// emptyEntry reports whether a container entry lists no device: HAMi
// writes such entries for containers that got none of the vendor's devices
// (or, since recent versions, no entry at all).
func emptyEntry(entry string) bool {
	return strings.Trim(entry, ": \t\r\n") == ""
}

// hamiDevice is one device of a container entry.
type hamiDevice struct {
	id     string // the GPU UUID, a legacy MIG id's parent GPU, a MIG-<uuid>
	parent string // a MIG-<uuid>'s GPU, for its NUMA node
	typ    string
	shared bool
}

// parseHAMiContainer reads one container's devices; position is the
// container's entry in the list, migs the MIG instances known by position.
// Empty device entries (the text after the last ':', or "::") are not
// devices. Each device needs at least the four fields HAMi writes; later
// fields are ignored, as a newer HAMi may add some. Whitespace around fields
// is dropped.
//
// A device listed twice is reported once, shared: HAMi's dynamic MIG writes
// each MIG slice of a GPU under the parent's UUID, so two slices of one GPU
// in a container repeat it, and a consumer shown the same id twice would
// count the GPU twice. A slice whose MIG instance is known (HAMi's device
// plugin records it once created) is reported as that MIG-<uuid> instead,
// which DCGM exporter matches.
func parseHAMiContainer(entry string, position int, migs map[migSlot]string) ([]hamiDevice, error) {
	var out []hamiDevice
	seen := map[string]int{} // id -> its index in out: linear in the entry's length
	device := 0              // non-empty device entries before this one
	for j, raw := range strings.Split(entry, ":") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		d, err := parseHAMiDevice(raw)
		if err != nil {
			return nil, fmt.Errorf("device %d %s: %w", j, quote(raw), err)
		}
		if mig, ok := migs[migSlot{position, device, d.id}]; ok {
			d.id, d.parent, d.shared = mig, d.id, false
		}
		device++
		if k, dup := seen[d.id]; dup {
			out[k].shared = true
			continue
		}
		seen[d.id] = len(out)
		out = append(out, d)
	}
	return out, nil
}

// parseHAMiDevice reads "UUID,Type,mem,cores".
//
// Shared is cores below 100: HAMi gives a device with all its cores to no
// other container, and a device with fewer cores (0 meaning "no limit") may
// be shared, whatever the memory. A legacy MIG id "GPU-<uuid>[<profile>-<slot>]"
// (HAMi before dynamic MIG, Volcano's vGPU in MIG mode) is reported as its
// parent GPU's UUID, shared: DCGM exporter matches GPU-<uuid> or MIG-<uuid>,
// never the bracketed form, and current HAMi reports a MIG allocation by its
// parent GPU's UUID too (parseHAMiContainer replaces it with the MIG
// instance when that is known).
func parseHAMiDevice(raw string) (hamiDevice, error) {
	fields := strings.Split(raw, ",")
	if len(fields) < 4 {
		return hamiDevice{}, errors.New("want UUID,Type,memory,cores")
	}
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	d := hamiDevice{id: fields[0], typ: fields[1]}
	if d.id == "" {
		return hamiDevice{}, errors.New("no UUID")
	}
	if d.typ == "" {
		return hamiDevice{}, errors.New("no device type")
	}
	if _, err := nonNegative(fields[2], "memory"); err != nil {
		return hamiDevice{}, err
	}
	cores, err := nonNegative(fields[3], "cores")
	if err != nil {
		return hamiDevice{}, err
	}
	d.shared = cores < 100
	if strings.ContainsAny(d.id, "[]") {
		parent, ok := migParent(d.id)
		if !ok {
			return hamiDevice{}, fmt.Errorf("UUID %q: want GPU-<uuid> or a MIG id GPU-<uuid>[<profile>-<slot>]", d.id)
		}
		d.id, d.shared = parent, true
	}
	if strings.IndexFunc(d.id, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return hamiDevice{}, fmt.Errorf("UUID %q contains spaces or control characters", d.id)
	}
	return d, nil
}

// migParent returns the parent GPU of a legacy MIG id
// "<parent>[<profile>-<slot>]" (the profile may contain '-', the slot is a
// number); ok is false for anything else.
func migParent(id string) (string, bool) {
	open := strings.IndexByte(id, '[')
	if open <= 0 || !strings.HasSuffix(id, "]") {
		return "", false
	}
	parent, inside := id[:open], id[open+1:len(id)-1]
	dash := strings.LastIndexByte(inside, '-')
	if strings.ContainsAny(parent, "[]") || dash <= 0 || strings.ContainsAny(inside, "[]") || !isDigits(inside[dash+1:]) {
		return "", false
	}
	return parent, true
}

// nonNegative reads a field HAMi writes as a decimal int32.
func nonNegative(s, field string) (int64, error) {
	if strings.HasPrefix(s, "-") && isDigits(s[1:]) {
		return 0, fmt.Errorf("%s %s is negative", field, s)
	}
	if !isDigits(s) {
		return 0, fmt.Errorf("%s %q is not a number", field, s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > math.MaxInt32 {
		return 0, fmt.Errorf("%s %s is out of range", field, s)
	}
	return n, nil
}

// quantity reads a pod request: its value in whole units, or fraction=true
// when it is not a whole number; ok is false when it cannot be read or is
// not positive, which asks for nothing.
func quantity(v string) (n int64, fraction, ok bool) {
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() <= 0 {
		return 0, false, false
	}
	if n := q.Value(); q.CmpInt64(n) == 0 {
		return n, false, true
	}
	return 0, true, true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// quote quotes annotation text for an error message, shortened: annotations
// can be long and end up in logs and records.
func quote(s string) string {
	const max = 60
	if len(s) > max {
		s = s[:max] + "..."
	}
	return strconv.Quote(s)
}
