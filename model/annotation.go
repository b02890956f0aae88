package model

import "strings"

// oversizedPrefix starts every value OversizedAnnotation makes. No
// allocator writes a value like it; a tenant who does refuses only its own
// pod's allocation.
const oversizedPrefix = "podres-proxy: not read: "

// OversizedAnnotation is the value a pod source records in place of an
// allocator annotation it did not read because the value was over its
// bound; detail says by how much. The allocators then refuse that
// annotation as malformed, on that pod only, and the record and `inspect`
// show why. Putting the refusal in the value, rather than dropping the
// key, keeps a pod whose allocation was too large apart from a pod
// without one.
func OversizedAnnotation(detail string) string { return oversizedPrefix + detail }

// Oversized reports whether value was made by OversizedAnnotation, and
// with what detail.
func Oversized(value string) (detail string, ok bool) {
	return strings.CutPrefix(value, oversizedPrefix)
}
