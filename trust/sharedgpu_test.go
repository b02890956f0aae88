package trust

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// sharerRecord is a running pod holding a share of gpu since at, with the
// slots its record kept.
func sharerRecord(uid, gpu string, at time.Time, slots map[string]int) *record.Record {
	return &record.Record{
		UID: uid, State: record.PhaseReady, SandboxID: "s-" + uid,
		Provenance: record.Provenance{Sandbox: &record.Seen{Origin: record.OriginNRI, At: at}, Annotations: &record.Seen{Origin: record.OriginNRI, At: at}},
		Devices:    []model.Device{{Allocator: hami.Name, Type: "NVIDIA", Resource: parse.DefaultGPUResource, IDs: []string{gpu}, Shared: true}},
		GPUSlots:   slots,
		// hami-scheduler's pod asking for the GPU, as the gate believes it.
		Spec: &model.PodSpec{SchedulerName: "hami-scheduler", Containers: []model.ContainerSpec{
			{Name: "app", Kind: model.KindApp, Requests: map[string]string{parse.DefaultGPUResource: "1"}},
		}},
	}
}

// A restarted daemon (no previous table) gives each sharer the slot its
// record kept, not the next free one in claim order.
func TestSharedGPUsKeepTheRecordedSlotsAcrossARestart(t *testing.T) {
	const gpu = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := strings.ToLower(gpu)
	records := []*record.Record{
		sharerRecord("a", gpu, t0, nil),
		sharerRecord("c", gpu, t0.Add(2*time.Second), map[string]int{key: 2}),
		sharerRecord("d", gpu, t0.Add(3*time.Second), map[string]int{key: 1}),
		sharerRecord("e", gpu, t0.Add(4*time.Second), nil),
	}
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	g := NewGate(allocator.NewSet(log, nil, decoders...), GateOptions{Log: log})
	table := g.SharedGPUs(nil, records, nil)
	for uid, want := range map[string]Share{"a": {Anchor: true}, "c": {Slot: 2}, "d": {Slot: 1}, "e": {Slot: 3}} {
		if got, ok := table.ShareOf(uid, gpu); !ok || got != want {
			t.Errorf("%s has share %+v (%v), want %+v", uid, got, ok, want)
		}
	}
	if s := table.Slots("c"); len(s) != 1 || s[key] != 2 {
		t.Errorf("Slots(c) = %v, want its slot 2 to record", s)
	}
	if s := table.Slots("a"); s != nil {
		t.Errorf("Slots(a) = %v, want none: the first sharer has the plain UUID", s)
	}
}
