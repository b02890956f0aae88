package reuse

import (
	"bytes"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// containersField is containers in both PodResources messages, and
// devicesField devices in both ContainerResources messages.
const (
	containersField protowire.Number = 3
	devicesField    protowire.Number = 2
)

// appendCanonical appends seg's canonical form, the pod segment with each
// container's device fields in byte order, to dst and reports true, or
// returns dst as it was and false when seg already is canonical or does not
// parse (it is then keyed by its own bytes, and its rebuild reports it).
// Lookups append to a scratch buffer, so a steady List allocates nothing
// for it.
//
// The kubelet lists a container's devices from its device manager's maps
// (containerDevicesFromResourceDeviceInstances: one entry per device id,
// resources and ids in map order), so a pod holding two or more devices of
// the kubelet's own is listed in a new order on almost every call. Keying
// its cached output by this canonical form lets it be reused whatever the
// order; the output keeps the order of the answer it was built from, which
// clients cannot tell from another (the order carries no meaning). The
// canonical form is a permutation of the segment's fields, so it has the
// segment's length.
func appendCanonical(dst, seg []byte) ([]byte, bool) {
	start, changed := len(dst), false
	for rest := seg; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return dst[:start], false
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return dst[:start], false
		}
		field := rest[:n+m]
		rest = rest[n+m:]
		if num == containersField && typ == protowire.BytesType {
			c, _ := protowire.ConsumeBytes(field[n:])
			if !devicesSorted(c) {
				if !changed {
					changed = true
					dst = append(dst, seg[:len(seg)-len(rest)-len(field)]...)
				}
				dst = append(dst, field[:len(field)-len(c)]...) // tag and length
				dst = appendSorted(dst, c)
				continue
			}
		}
		if changed {
			dst = append(dst, field...)
		}
	}
	return dst, changed
}

// nextField splits the first field off b; ok is false when b does not parse.
func nextField(b []byte) (num protowire.Number, typ protowire.Type, field []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, 0, nil, false
	}
	m := protowire.ConsumeFieldValue(num, typ, b[n:])
	if m < 0 {
		return 0, 0, nil, false
	}
	return num, typ, b[:n+m], true
}

// devicesSorted reports whether a container's device fields are in byte
// order. A container that does not parse whole counts as sorted: it is
// left as it is (appendSorted relies on this).
func devicesSorted(c []byte) bool {
	var prev []byte
	sorted := true
	for len(c) > 0 {
		num, typ, f, ok := nextField(c)
		if !ok {
			return true
		}
		c = c[len(f):]
		if num != devicesField || typ != protowire.BytesType {
			continue
		}
		if prev != nil && bytes.Compare(prev, f) > 0 {
			sorted = false
		}
		prev = f
	}
	return sorted
}

// appendSorted appends a container's fields, its device fields sorted
// among the places they held. devicesSorted has parsed c whole.
func appendSorted(out, c []byte) []byte {
	var arr [8][]byte // most containers hold a few devices
	devs := arr[:0]
	for b := c; len(b) > 0; {
		num, typ, f, _ := nextField(b)
		b = b[len(f):]
		if num == devicesField && typ == protowire.BytesType {
			devs = append(devs, f)
		}
	}
	slices.SortFunc(devs, bytes.Compare)
	for b := c; len(b) > 0; {
		num, typ, f, _ := nextField(b)
		b = b[len(f):]
		if num == devicesField && typ == protowire.BytesType {
			f, devs = devs[0], devs[1:]
		}
		out = append(out, f...)
	}
	return out
}
