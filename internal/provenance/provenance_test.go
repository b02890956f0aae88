package provenance

import (
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
)

func TestRecordOfAPodNamePrefersTheLiveRecordThenTheNewestCurrentOne(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := func(uid string, phase state.Phase, live bool, minutes int) *state.Record {
		r := &state.Record{UID: uid, Namespace: "ml", Name: "train-0", State: phase, UpdatedAt: at.Add(time.Duration(minutes) * time.Minute)}
		if live {
			r.SandboxID = "sb-" + uid
			r.Provenance.Sandbox = &state.Seen{Origin: state.OriginNRI, At: r.UpdatedAt}
		}
		return r
	}
	other := &state.Record{UID: "other", Namespace: "ml", Name: "other", State: state.PhaseReady, UpdatedAt: at.Add(time.Hour)}
	for _, c := range []struct {
		name    string
		records []*state.Record
		want    string
	}{
		{"the live one over a newer pending one", []*state.Record{rec("live", state.PhaseReady, true, 0), rec("pending", state.PhasePending, false, 5), other}, "live"},
		{"a pending one over a newer removed one", []*state.Record{rec("removed", state.PhaseRemoved, true, 9), rec("pending", state.PhasePending, false, 5)}, "pending"},
		{"the newest current one when two are live", []*state.Record{rec("a", state.PhaseReady, true, 1), rec("b", state.PhaseReady, true, 2)}, "b"},
		{"the newest when all are gone", []*state.Record{rec("old", state.PhaseRemoved, false, 1), rec("stopped", state.PhaseStopped, false, 3)}, "stopped"},
		{"none", []*state.Record{other}, ""},
	} {
		got := recordOf(c.records, model.PodKey{Namespace: "ml", Name: "train-0"})
		uid := ""
		if got != nil {
			uid = got.UID
		}
		if uid != c.want {
			t.Errorf("%s: got %q, want %q", c.name, uid, c.want)
		}
	}
}

// query --sources names the allocator of an id as the proxy answers it:
// spelt as consumers match it, a shared GPU's slot id, a MIG instance under
// its own resource.
func TestAllocatorOfAnAnsweredID(t *testing.T) {
	rec := &state.Record{Devices: []model.Device{
		{Allocator: "tensorfusion", Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{"gpu-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11"}, Shared: true},
		{Allocator: "hami", Type: "NVIDIA", Resource: "nvidia.com/gpu", IDs: []string{"MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55"}},
	}}
	for _, c := range []struct{ resource, id, want string }{
		{"nvidia.com/gpu", "GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11", "tensorfusion"},
		{"nvidia.com/gpu", "GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11::2", "tensorfusion"},
		{"nvidia.com/mig-1g.10gb", "MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55", "hami"},
		{"example.com/dev", "GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11", ""},
	} {
		if got := allocatorOf(rec, nil, c.resource, c.id); got != c.want {
			t.Errorf("allocatorOf(%s, %s) = %q, want %q", c.resource, c.id, got, c.want)
		}
	}
}
