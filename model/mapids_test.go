package model

import (
	"slices"
	"strings"
	"testing"
)

// Records are shared between readers: rewriting the ids a pod is answered
// with must never change the record's own devices.
func TestMapIDsNeverModifiesItsInputAndCopiesOnlyOnChange(t *testing.T) {
	devs := []Device{
		{Resource: "nvidia.com/gpu", IDs: []string{"gpu-a", "GPU-B"}},
		{Resource: "rdma/vf", IDs: []string{"0000:3b:00.2"}},
	}
	upper := func(_ Device, id string) string { return strings.ToUpper(id) }

	out := MapIDs(devs, upper)
	if got := out[0].IDs; !slices.Equal(got, []string{"GPU-A", "GPU-B"}) {
		t.Errorf("rewritten ids %v, want GPU-A GPU-B", got)
	}
	if got := devs[0].IDs; !slices.Equal(got, []string{"gpu-a", "GPU-B"}) {
		t.Errorf("the input's ids became %v: MapIDs wrote into a shared record", got)
	}

	same := MapIDs(out, upper)
	if &same[0] != &out[0] {
		t.Error("nothing changed, yet MapIDs returned a copy")
	}
}
