package trust_test

import (
	"io"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
	"github.com/podres-proxy/podres-proxy/trust"
)

// countingMetrics counts refusals by allocator and reason, as
// podres_proxy_allocations_refused_total does.
type countingMetrics struct {
	mu sync.Mutex
	n  map[[2]string]int
}

func (m *countingMetrics) AllocationRefused(alloc, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == nil {
		m.n = map[[2]string]int{}
	}
	m.n[[2]string{alloc, reason}]++
}

// tfFixture returns the allocation fixture of that name.
func tfFixture(t *testing.T, name string) allocfixture.Case {
	t.Helper()
	cases, err := allocfixture.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no fixture %s", name)
	return allocfixture.Case{}
}

// fixtureRecord is the fixture's pod as the store keeps it once its
// containers were created, learned at second n, with ctrAnn as its
// containers' annotations (nil: the fixture's).
func fixtureRecord(t *testing.T, set *allocator.Set, c allocfixture.Case, n int, ctrAnn map[string]map[string]string) *record.Record {
	t.Helper()
	if ctrAnn == nil {
		ctrAnn = c.ContainerAnnotations()
	}
	ref := model.PodRef{Namespace: "ns", Name: c.Name, UID: c.Name}
	devs, errs := set.Decode(ref, c.Annotations)
	devs, more := set.DecodeContainers(ref, devs, ctrAnn)
	if len(errs)+len(more) > 0 {
		t.Fatalf("decode %s: %v %v", c.Name, errs, more)
	}
	r := claimOf(c.Name, c.SchedulerName(), n, nil, devs...)
	r.Spec = c.Spec()
	r.Spec.SchedulerName = c.SchedulerName()
	r.Annotations = maps.Clone(c.Annotations)
	return r
}

// TensorFusion's device plugin carves a partitioned pod's MIG instances out
// of the GPUs its scheduler gave the pod (gpu-ids), and names them in the
// container's annotations, which the pod's owner can write where the
// runtime passes pod annotations through. An instance on another GPU is
// therefore not believed: the pod is not shown it, a later pod given that
// GPU whole gets it, and the refusal says why (what inspect shows, counted
// per reason).
func TestATensorFusionPartitionCountsOnlyOnTheGPUsItsSchedulerGave(t *testing.T) {
	const (
		given   = "GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11" // the fixture's gpu-ids
		another = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"
		mig     = "MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55"
	)
	inv := inventory.NewSnapshot([]inventory.Device{
		{Type: inventory.TypeGPU, ID: given, Healthy: true},
		{Type: inventory.TypeGPU, ID: another, Healthy: true},
	})
	fixture := tfFixture(t, "t01-mig-partition-in-container-annotations")
	onAnother := map[string]map[string]string{"main": {tensorfusion.PartitionUUIDsKey: mig + "/7/0:" + another}}
	for _, tc := range []struct {
		name    string
		ctrAnn  map[string]map[string]string
		shown   map[string][]string
		refused map[string][]string
	}{
		{
			name:  "the fixture: the instance on the pod's own GPU",
			shown: map[string][]string{fixture.Name: {mig}, "taker": {another}},
		},
		{
			name:    "the instance on a GPU the scheduler did not give the pod",
			ctrAnn:  onAnother,
			shown:   map[string][]string{"taker": {another}},
			refused: map[string][]string{fixture.Name: {trust.ReasonParentNotAllocated}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := logrus.New()
			log.SetOutput(io.Discard)
			metrics := &countingMetrics{}
			set := quietSet(t)
			gate := trust.NewGate(set, trust.GateOptions{Log: log, Metrics: metrics})
			records := []*record.Record{
				fixtureRecord(t, set, fixture, 1, tc.ctrAnn),
				claimOf("taker", "koord-scheduler", 2, gpu1, koordWholeGPU(another)),
			}
			holders := gate.Holders(records, inv)
			shown, reasons := map[string][]string{}, map[string][]string{}
			for _, r := range records {
				kept, refused, _ := gate.VetPod(r, inv, holders)
				for _, d := range kept {
					shown[r.UID] = append(shown[r.UID], d.IDs...)
				}
				for _, x := range refused {
					reasons[r.UID] = append(reasons[r.UID], x.Reason)
					if x.Class != trust.ClassForged || !strings.Contains(x.Detail, another) {
						t.Errorf("refusal %+v: want class forged and a detail naming the parent %s", x, another)
					}
				}
				gate.Report(model.PodRef{Namespace: r.Namespace, Name: r.Name, UID: r.UID}, refused)
			}
			if !mapsEqual(shown, tc.shown) || !mapsEqual(reasons, tc.refused) {
				t.Errorf("shown %v, refused %v; want shown %v, refused %v", shown, reasons, tc.shown, tc.refused)
			}
			want := map[[2]string]int{}
			if len(tc.refused) > 0 {
				want[[2]string{tensorfusion.Name, trust.ReasonParentNotAllocated}] = 1
			}
			if !maps.Equal(metrics.n, want) {
				t.Errorf("refusals counted %v, want %v", metrics.n, want)
			}
		})
	}
}
