package trust_test

import (
	"slices"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/trust"
)

const (
	aliasGPU = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	aliasPF  = "0000:3b:00.0"
	aliasVF1 = "0000:3b:02.1"
	aliasVF2 = "0000:3b:02.2"
)

// aliasNode has one GPU and one NIC with two VFs, as sysfs shows them
// (physfn/virtfn links) and the inventory keeps them.
func aliasNode() *inventory.Snapshot {
	return inventory.NewSnapshot([]inventory.Device{
		{Type: inventory.TypeGPU, ID: aliasGPU, Healthy: true},
		{Type: inventory.TypeRDMA, ID: aliasPF, BusID: aliasPF, Healthy: true, VFs: []inventory.VF{{BusID: aliasVF1}, {BusID: aliasVF2}}},
	})
}

// claimOf is a running pod of scheduler, its containers asking for
// requests, whose allocation was learned at second n.
func claimOf(uid, scheduler string, n int, requests map[string]string, devs ...model.Device) *record.Record {
	at := time.Date(2026, 11, 26, 9, 0, n, 0, time.UTC)
	return &record.Record{UID: uid, Namespace: "ns", Name: uid, State: record.PhaseReady, SandboxID: "sb-" + uid,
		Spec:    &model.PodSpec{SchedulerName: scheduler, Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp, Requests: requests}}},
		Devices: devs,
		Provenance: record.Provenance{
			Annotations: &record.Seen{Origin: record.OriginNRI, At: at},
			Sandbox:     &record.Seen{Origin: record.OriginNRI, At: at},
		}}
}

func koordRDMA(ids ...string) model.Device {
	return model.Device{Allocator: koordinator.Name, Type: "rdma", Resource: "koordinator.sh/rdma", IDs: ids}
}

func koordWholeGPU(id string) model.Device {
	return model.Device{Allocator: koordinator.Name, Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{id}}
}

var (
	rdma100 = map[string]string{"koordinator.sh/rdma": "100"}
	gpu1    = map[string]string{"nvidia.com/gpu": "1"}
)

// shownAndRefused answers every record as the proxy does (ids normalised,
// Vet, then Contest against the node's holders) and returns the ids each pod is shown
// and the reasons each is refused.
func shownAndRefused(t *testing.T, inv *inventory.Snapshot, records ...*record.Record) (shown map[string][]string, reasons map[string][]string) {
	t.Helper()
	gate := trust.NewGate(quietSet(t), trust.GateOptions{})
	holders := gate.Holders(records, inv)
	shown, reasons = map[string][]string{}, map[string][]string{}
	for _, r := range records {
		kept, refused := gate.Vet(r.Spec, devids.NormalizeIDs(r.Devices), inv)
		kept, contested := gate.Contest(r, kept, holders)
		for _, d := range kept {
			shown[r.UID] = append(shown[r.UID], d.IDs...)
		}
		for _, x := range append(refused, contested...) {
			reasons[r.UID] = append(reasons[r.UID], x.Reason)
		}
	}
	return shown, reasons
}

func TestAPFAndItsVFsContestEachOther(t *testing.T) {
	inv := aliasNode()
	for _, tc := range []struct {
		name    string
		records []*record.Record
		shown   map[string][]string
		refused map[string][]string
	}{
		{
			name: "a VF held, then its PF claimed",
			records: []*record.Record{
				claimOf("vf-holder", "koord-scheduler", 1, rdma100, koordRDMA(aliasVF1)),
				claimOf("pf-taker", "koord-scheduler", 2, rdma100, koordRDMA(aliasPF)),
			},
			shown:   map[string][]string{"vf-holder": {aliasVF1}},
			refused: map[string][]string{"pf-taker": {trust.ReasonContested}},
		},
		{
			name: "the PF held, then one of its VFs claimed (spelt without its domain)",
			records: []*record.Record{
				claimOf("vf-taker", "koord-scheduler", 2, rdma100, koordRDMA("3b:02.1")),
				claimOf("pf-holder", "koord-scheduler", 1, rdma100, koordRDMA(aliasPF)),
			},
			shown:   map[string][]string{"pf-holder": {aliasPF}},
			refused: map[string][]string{"vf-taker": {trust.ReasonContested}},
		},
		{
			name: "two VFs of one PF on two pods stand together",
			records: []*record.Record{
				claimOf("a", "koord-scheduler", 1, rdma100, koordRDMA(aliasVF1)),
				claimOf("b", "koord-scheduler", 2, rdma100, koordRDMA(aliasVF2)),
			},
			shown: map[string][]string{"a": {aliasVF1}, "b": {aliasVF2}},
		},
		{
			// b is refused (its VF1 is a's); it holds nothing, so c's
			// later claim on VF2 stands.
			name: "a refused claim keeps nobody from a device",
			records: []*record.Record{
				claimOf("a", "koord-scheduler", 1, rdma100, koordRDMA(aliasVF1)),
				claimOf("b", "koord-scheduler", 2, rdma100, koordRDMA(aliasVF1, aliasVF2)),
				claimOf("c", "koord-scheduler", 3, rdma100, koordRDMA(aliasVF2)),
			},
			shown:   map[string][]string{"a": {aliasVF1}, "c": {aliasVF2}},
			refused: map[string][]string{"b": {trust.ReasonContested}},
		},
		{
			name: "a share of the PF (rdma: 50, no VFs) while another pod holds a VF",
			records: []*record.Record{
				claimOf("vf-holder", "koord-scheduler", 1, rdma100, koordRDMA(aliasVF1)),
				claimOf("sharer", "koord-scheduler", 2, map[string]string{"koordinator.sh/rdma": "50"},
					model.Device{Allocator: koordinator.Name, Type: "rdma", Resource: "koordinator.sh/rdma", IDs: []string{aliasPF}, Shared: true}),
			},
			shown:   map[string][]string{"vf-holder": {aliasVF1}},
			refused: map[string][]string{"sharer": {trust.ReasonContested}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shown, reasons := shownAndRefused(t, inv, tc.records...)
			if !mapsEqual(shown, tc.shown) || !mapsEqual(reasons, tc.refused) {
				t.Errorf("shown %v, refused %v; want shown %v, refused %v", shown, reasons, tc.shown, tc.refused)
			}
		})
	}
}

func TestAMIGInstanceContestsItsParentGPU(t *testing.T) {
	inv := aliasNode()
	migOld := "MIG-GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a/1/0"
	const migUUID = "MIG-5c4b8f1e-3a2d-4c7e-8f90-1a2b3c4d5e6f"
	const migUUID2 = "MIG-6d5c9f2f-4b3e-4d8f-9fa1-2b3c4d5e6f70"
	hamiMIG := func(id string) model.Device {
		return model.Device{Allocator: hami.Name, Type: "NVIDIA", Resource: "nvidia.com/gpu", IDs: []string{id}, Parent: aliasGPU}
	}
	tfMIG := func(id string) model.Device {
		return model.Device{Allocator: tensorfusion.Name, Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{id}, Parent: aliasGPU}
	}
	tfRequest := map[string]string{"tensor-fusion.ai/index_0": "1"}
	for _, tc := range []struct {
		name    string
		records []*record.Record
		shown   map[string][]string
		refused map[string][]string
	}{
		{
			name: "the GPU held whole, then a MIG instance of it named in the old form",
			records: []*record.Record{
				claimOf("holder", "koord-scheduler", 1, gpu1, koordWholeGPU(aliasGPU)),
				claimOf("slicer", "koord-scheduler", 2, gpu1, koordWholeGPU(migOld)),
			},
			shown:   map[string][]string{"holder": {aliasGPU}},
			refused: map[string][]string{"slicer": {trust.ReasonContested}},
		},
		{
			name: "a HAMi MIG instance first, then the GPU whole",
			records: []*record.Record{
				claimOf("hami-pod", "hami-scheduler", 1, gpu1, hamiMIG(migUUID)),
				claimOf("taker", "koord-scheduler", 2, gpu1, koordWholeGPU(aliasGPU)),
			},
			shown:   map[string][]string{"hami-pod": {migUUID}},
			refused: map[string][]string{"taker": {trust.ReasonContested}},
		},
		{
			name: "the GPU held whole, then a TensorFusion partition of it",
			records: []*record.Record{
				claimOf("holder", "koord-scheduler", 1, gpu1, koordWholeGPU(aliasGPU)),
				claimOf("tf-pod", "tensor-fusion-scheduler", 2, tfRequest, tfMIG(migUUID)),
			},
			shown:   map[string][]string{"holder": {aliasGPU}},
			refused: map[string][]string{"tf-pod": {trust.ReasonContested}},
		},
		{
			name: "two MIG instances of one GPU on two pods stand together",
			records: []*record.Record{
				claimOf("a", "hami-scheduler", 1, gpu1, hamiMIG(migUUID)),
				claimOf("b", "hami-scheduler", 2, gpu1, hamiMIG(migUUID2)),
			},
			shown: map[string][]string{"a": {migUUID}, "b": {migUUID2}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			shown, reasons := shownAndRefused(t, inv, tc.records...)
			if !mapsEqual(shown, tc.shown) || !mapsEqual(reasons, tc.refused) {
				t.Errorf("shown %v, refused %v; want shown %v, refused %v", shown, reasons, tc.shown, tc.refused)
			}
		})
	}
}

func TestAMIGInstanceIsOnTheNodeWhenItsParentIs(t *testing.T) {
	gate := trust.NewGate(quietSet(t), trust.GateOptions{})
	spec := &model.PodSpec{SchedulerName: "koord-scheduler", Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp, Requests: gpu1}}}
	const stranger = "GPU-0f0f0f0f-1111-4222-8333-444455556666"
	for _, tc := range []struct {
		name string
		dev  model.Device
		inv  *inventory.Snapshot
		ok   bool
	}{
		{"old form, parent on the node", koordWholeGPU("MIG-GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a/1/0"), aliasNode(), true},
		{"old form, parent not on the node", koordWholeGPU("MIG-" + stranger + "/1/0"), aliasNode(), false},
		{"MIG-<uuid> with its parent on the node", model.Device{Allocator: koordinator.Name, Type: "gpu", Resource: "nvidia.com/gpu",
			IDs: []string{"MIG-5c4b8f1e-3a2d-4c7e-8f90-1a2b3c4d5e6f"}, Parent: aliasGPU}, aliasNode(), true},
		{"MIG-<uuid> with its parent not on the node", model.Device{Allocator: koordinator.Name, Type: "gpu", Resource: "nvidia.com/gpu",
			IDs: []string{"MIG-5c4b8f1e-3a2d-4c7e-8f90-1a2b3c4d5e6f"}, Parent: stranger}, aliasNode(), false},
		{"MIG-<uuid> naming no parent, on a node whose GPUs are known", koordWholeGPU("MIG-5c4b8f1e-3a2d-4c7e-8f90-1a2b3c4d5e6f"), aliasNode(), false},
		{"any MIG instance where the inventory knows no GPU", koordWholeGPU("MIG-" + stranger + "/1/0"), nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kept, refused := gate.Vet(spec, []model.Device{tc.dev}, tc.inv)
			if got := len(kept) == 1; got != tc.ok {
				t.Fatalf("believed %v, want %v (refused %+v)", got, tc.ok, refused)
			}
			if !tc.ok && (len(refused) != 1 || refused[0].Reason != trust.ReasonNotOnNode) {
				t.Errorf("refused %+v, want not-on-node", refused)
			}
		})
	}
}

func mapsEqual(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
