package hami

import (
	"errors"
	"fmt"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/model"
)

// maxContainerErrors bounds the errors one annotation reports in detail:
// they are logged and kept in the pod's record.
const maxContainerErrors = 3

// List says how devices of one HAMi-format annotation are reported.
type List struct {
	Allocator string
	Resource  string
	// scope is the containers the list's entries stand for. With
	// model.ScopeRequestingAll the devices' ContainerIndex counts non-empty
	// entries only; otherwise every entry, empty or not.
	Scope model.ContainerScope
	// migs are the MIG instances known for (entry, device) positions.
	migs map[migSlot]string
}

// DecodeList decodes one annotation in HAMi's format (HAMi's
// hami.io/<vendor>-devices-allocated and Volcano's volcano.sh/vgpu-ids-new):
// containers separated by ';', each a list of devices "UUID,Type,mem,cores"
// each followed by ':'. Every device gets its container's index and the
// list's length as l.Scope counts them (every entry, or only non-empty ones
// for model.ScopeRequestingAll), and Replace: the per-container device
// plugins of both allocators give the kubelet ids that name no real device.
//
// A container entry that cannot be read loses its devices and is reported;
// the other containers keep theirs. That is safe because ';' alone decides
// positions, so one container's damage cannot move another's devices.
func DecodeList(key, value string, l List) ([]model.Device, error) {
	containers := splitContainers(value)
	count := len(containers)
	byOrdinal := l.Scope == model.ScopeRequestingAll
	if byOrdinal {
		count = 0
		for _, entry := range containers {
			if !emptyEntry(entry) {
				count++
			}
		}
	}
	var devices []model.Device
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
				errs = append(errs, fmt.Errorf("decode %s: container %d %s: %w", key, i, parse.Quote(entry), err))
			} else {
				more++
			}
			continue
		}
		for _, d := range parsed {
			devices = append(devices, model.Device{
				Allocator:      l.Allocator,
				Type:           d.typ,
				Resource:       l.Resource,
				IDs:            []string{d.id},
				Parent:         d.parent,
				Shared:         d.shared,
				ContainerIndex: &index,
				ContainerScope: l.Scope,
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
			return nil, fmt.Errorf("device %d %s: %w", j, parse.Quote(raw), err)
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
	if _, err := parse.Int32(fields[2], "memory"); err != nil {
		return hamiDevice{}, err
	}
	cores, err := parse.Int32(fields[3], "cores")
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
	if parse.HasSpaceOrControl(d.id) {
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
	if strings.ContainsAny(parent, "[]") || dash <= 0 || strings.ContainsAny(inside, "[]") || !parse.IsDigits(inside[dash+1:]) {
		return "", false
	}
	return parent, true
}
