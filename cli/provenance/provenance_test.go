package provenance

import (
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

func TestRecordOfAPodNamePrefersTheLiveRecordThenTheNewestCurrentOne(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := func(uid string, phase record.Phase, live bool, minutes int) *record.Record {
		r := &record.Record{UID: uid, Namespace: "ml", Name: "train-0", State: phase, UpdatedAt: at.Add(time.Duration(minutes) * time.Minute)}
		if live {
			r.SandboxID = "sb-" + uid
			r.Provenance.Sandbox = &record.Seen{Origin: record.OriginNRI, At: r.UpdatedAt}
		}
		return r
	}
	other := &record.Record{UID: "other", Namespace: "ml", Name: "other", State: record.PhaseReady, UpdatedAt: at.Add(time.Hour)}
	for _, c := range []struct {
		name    string
		records []*record.Record
		want    string
	}{
		{"the live one over a newer pending one", []*record.Record{rec("live", record.PhaseReady, true, 0), rec("pending", record.PhasePending, false, 5), other}, "live"},
		{"a pending one over a newer removed one", []*record.Record{rec("removed", record.PhaseRemoved, true, 9), rec("pending", record.PhasePending, false, 5)}, "pending"},
		{"the newest current one when two are live", []*record.Record{rec("a", record.PhaseReady, true, 1), rec("b", record.PhaseReady, true, 2)}, "b"},
		{"the newest when all are gone", []*record.Record{rec("old", record.PhaseRemoved, false, 1), rec("stopped", record.PhaseStopped, false, 3)}, "stopped"},
		{"none", []*record.Record{other}, ""},
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
	rec := &record.Record{Devices: []model.Device{
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
