package trust_test

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
	"github.com/podres-proxy/podres-proxy/trust"
)

func quietSet(t testing.TB) *allocator.Set {
	t.Helper()
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	return allocator.NewSet(log, nil, decoders...)
}

// TestTheGateBelievesEverySchedulersOwnAllocation runs every fixture, an
// allocation its scheduler's own code wrote, through the gate on the pod its
// scheduler placed: nothing is refused. The same annotation on a pod of
// default-scheduler (a copy) gives nothing.
func TestTheGateBelievesEverySchedulersOwnAllocation(t *testing.T) {
	cases, err := allocfixture.Load()
	if err != nil {
		t.Fatal(err)
	}
	set := quietSet(t)
	gate := trust.NewGate(set, trust.GateOptions{Log: logrus.New()})
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ref := model.PodRef{Namespace: "fixtures", Name: c.Name, UID: c.Name}
			devices, _ := set.Decode(ref, c.Annotations)
			devices, _ = set.DecodeContainers(ref, devices, c.ContainerAnnotations())
			inv := c.Snapshot()
			devices, _ = allocator.Translate(devices, inv)
			spec := c.Spec()
			spec.SchedulerName = c.SchedulerName()
			kept, refused := gate.Vet(spec, devices, inv)
			if len(refused) > 0 || len(kept) != len(devices) {
				t.Errorf("%s: the scheduler's own allocation refused: %+v", c.File, refused)
			}
			spec.SchedulerName = "default-scheduler"
			kept, refused = gate.Vet(spec, devices, inv)
			if len(kept) != 0 || len(refused) != len(devices) {
				t.Errorf("%s: a default-scheduler pod with the annotation keeps %+v", c.File, kept)
			}
			for _, r := range refused {
				if r.Reason != trust.ReasonWrongScheduler || r.Class != trust.ClassForged {
					t.Errorf("%s: refused as %s (%s), want %s (forged)", c.File, r.Reason, r.Class, trust.ReasonWrongScheduler)
				}
			}
		})
	}
}

// Volcano's vNPU support writes HAMi's Ascend keys on Volcano's pods, so
// they are believed there; it writes no other HAMi key, so a Volcano pod's
// HAMi NVIDIA annotation is still a forgery, whatever type its entries
// claim. --volcano-scheduler-names decides which pods are Volcano's.
func TestHAMiAscendKeysAreBelievedOnVolcanosPodsOnly(t *testing.T) {
	const npu = "68496E64-20E05477-92C31323-6E78030A-BD003019"
	const gpu = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	ascend := map[string]string{"hami.io/Ascend310P-devices-allocated": npu + ",Ascend310P,6144,0:;"}
	nvidia := map[string]string{hami.NVIDIAAnnotation: gpu + ",Ascend310P,500,5:;"}
	npuPod := []model.ContainerSpec{{Name: "main", Kind: model.KindApp, Requests: map[string]string{"huawei.com/Ascend310P": "1", "huawei.com/Ascend310P-memory": "4096"}}}
	gpuPod := []model.ContainerSpec{{Name: "main", Kind: model.KindApp, Requests: map[string]string{"nvidia.com/gpu": "1"}}}
	for _, tt := range []struct {
		name       string
		schedulers map[string][]string
		scheduler  string
		ann        map[string]string
		containers []model.ContainerSpec
		want       string // "" believed, else the reason
	}{
		{"Ascend on Volcano's pod", nil, "volcano", ascend, npuPod, ""},
		{"Ascend on HAMi's pod", nil, "hami-scheduler", ascend, npuPod, ""},
		{"Ascend on default-scheduler's pod", nil, "default-scheduler", ascend, npuPod, trust.ReasonWrongScheduler},
		{"NVIDIA claiming an Ascend type on Volcano's pod", nil, "volcano", nvidia, gpuPod, trust.ReasonWrongScheduler},
		{"NVIDIA on HAMi's pod", nil, "hami-scheduler", nvidia, gpuPod, ""},
		{"Ascend on a renamed Volcano's pod", map[string][]string{volcano.VGPUName: {"volcano-ai"}}, "volcano-ai", ascend, npuPod, ""},
		{"Ascend on Volcano's old name once renamed", map[string][]string{volcano.VGPUName: {"volcano-ai"}}, "volcano", ascend, npuPod, trust.ReasonWrongScheduler},
		{"Ascend on Volcano's pod that asks no NPU", nil, "volcano", ascend, gpuPod, trust.ReasonNoRequest},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set := quietSet(t)
			gate := trust.NewGate(set, trust.GateOptions{SchedulerNames: tt.schedulers, Log: logrus.New()})
			devices, errs := set.Decode(model.PodRef{Namespace: "ns", Name: "p", UID: "u"}, tt.ann)
			if len(errs) > 0 || len(devices) != 1 {
				t.Fatalf("decoded %+v, %v; want one device", devices, errs)
			}
			spec := &model.PodSpec{SchedulerName: tt.scheduler, Containers: tt.containers}
			kept, refused := gate.Vet(spec, devices, nil)
			switch {
			case tt.want == "" && (len(kept) != 1 || len(refused) != 0):
				t.Errorf("refused %+v; want it believed", refused)
			case tt.want != "" && (len(kept) != 0 || len(refused) != 1 || refused[0].Reason != tt.want):
				t.Errorf("kept %+v, refused %+v; want it refused as %s", kept, refused, tt.want)
			}
		})
	}
}

func TestGateIDShapes(t *testing.T) {
	gate := trust.NewGate(quietSet(t), trust.GateOptions{})
	spec := &model.PodSpec{SchedulerName: "koord-scheduler", Containers: []model.ContainerSpec{{
		Name: "app", Kind: model.KindApp,
		Requests: map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "100", "koordinator.sh/fpga": "100"},
	}}}
	for _, tc := range []struct {
		typ, resource, id string
		ok                bool
	}{
		{"gpu", "nvidia.com/gpu", "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", true},
		{"gpu", "nvidia.com/gpu", "gpu-8c25ea37-2909-6e62-b7bf-e2fcadebea8d", true},
		{"gpu", "nvidia.com/gpu", "MIG-5c4b8f1e-3a2d-4c7e-8f90-1a2b3c4d5e6f", true},
		{"gpu", "nvidia.com/gpu", "MIG-GPU-5c4b8f1e-3a2d-4c7e-8f90-1a2b3c4d5e6f/1/0", true},
		{"gpu", "nvidia.com/gpu", "all", false},
		{"gpu", "nvidia.com/gpu", "ALL", false},
		{"gpu", "nvidia.com/gpu", "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a\n", false},
		{"gpu", "nvidia.com/gpu", "0", false}, // an index: CDI's nvidia.com/gpu=0 is another GPU
		{"gpu", "nvidia.com/gpu", "../../dev/mem", false},
		{"rdma", "koordinator.sh/rdma", "0000:1f:00.2", true},
		{"rdma", "koordinator.sh/rdma", "0000:1F:00.0", true},
		{"rdma", "koordinator.sh/rdma", "10000:01:00.1", true},
		{"rdma", "koordinator.sh/rdma", "mlx5_0", false},
		{"rdma", "koordinator.sh/rdma", "all", false},
		{"fpga", "koordinator.sh/fpga", "0000:3b:00.0", true},
		{"fpga", "koordinator.sh/fpga", "fpga-0", true},
		{"fpga", "koordinator.sh/fpga", "all", false},
		{"fpga", "koordinator.sh/fpga", "a b", false},
		{"fpga", "koordinator.sh/fpga", "x\x00", false},
		{"fpga", "koordinator.sh/fpga", "a=b", false},
		{"fpga", "koordinator.sh/fpga", strings.Repeat("a", 129), false},
	} {
		dev := model.Device{Allocator: koordinator.Name, Type: tc.typ, Resource: tc.resource, IDs: []string{tc.id}}
		kept, refused := gate.Vet(spec, []model.Device{dev}, nil)
		if got := len(kept) == 1; got != tc.ok {
			t.Errorf("%s %q: believed %v, want %v (refused %+v)", tc.resource, tc.id, got, tc.ok, refused)
		}
		if !tc.ok && (len(refused) != 1 || refused[0].Reason != trust.ReasonUnsafeID || refused[0].Class != trust.ClassMalformed) {
			t.Errorf("%s %q: refused %+v, want unsafe-id (malformed)", tc.resource, tc.id, refused)
		}
	}
}

// FuzzGateVet vets arbitrary devices (an allocator, a type, a resource and
// ids, as an annotation could make the decoders produce) on arbitrary pods
// (a scheduler name, one container's request) against an inventory that
// knows GPUs or not: it never panics, every device is either kept or
// refused, and a kept device has a scheduler that writes its allocator's
// annotation, a request, and only ids a consumer can take safely.
func FuzzGateVet(f *testing.F) {
	f.Add("koord-scheduler", "koordinator.sh/gpu-core", "100", koordinator.Name, "gpu", "nvidia.com/gpu", "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", true)
	f.Add("default-scheduler", "koordinator.sh/gpu-core", "100", koordinator.Name, "gpu", "nvidia.com/gpu", "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", true)
	f.Add("koord-scheduler", "", "", koordinator.Name, "rdma", "koordinator.sh/rdma", "0000:01:00.2", false)
	f.Add("hami-scheduler", "nvidia.com/gpu", "1", hami.Name, "NVIDIA", "nvidia.com/gpu", "all", true)
	f.Add("volcano", "volcano.sh/vgpu-number", "1", volcano.VGPUName, "NVIDIA", "nvidia.com/gpu", "GPU-\x1b[2J", false)
	f.Add("koord-scheduler", "koordinator.sh/fpga", "100", koordinator.Name, "fpga", "koordinator.sh/fpga", "0000:3b:00.0,fpga-1", false)
	f.Add("", "", "", "unknown", "", "", "", false)
	f.Add("volcano", "huawei.com/Ascend310P", "1", hami.Name, "Ascend310P", "huawei.com/Ascend310P", "68496E64-20E05477-92C31323-6E78030A-BD003019", false)
	f.Add("volcano", "nvidia.com/gpu", "1", hami.Name, "Ascend310P", "nvidia.com/gpu", "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", true)
	gpu := "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	nodeWithGPU := inventory.NewSnapshot([]inventory.Device{{Type: inventory.TypeGPU, ID: gpu, Healthy: true}})
	gate := trust.NewGate(quietSet(f), trust.GateOptions{})
	f.Fuzz(func(t *testing.T, scheduler, reqKey, reqValue, alloc, typ, resource, ids string, withInventory bool) {
		spec := &model.PodSpec{SchedulerName: scheduler, Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}
		if reqKey != "" {
			spec.Containers[0].Requests = map[string]string{reqKey: reqValue}
		}
		var devices []model.Device
		for _, group := range strings.Split(ids, ";") {
			devices = append(devices, model.Device{Allocator: alloc, Type: typ, Resource: resource, IDs: strings.Split(group, ",")})
		}
		var inv *inventory.Snapshot
		if withInventory {
			inv = nodeWithGPU
		}
		kept, refused := gate.Vet(spec, devices, inv)
		if len(kept)+len(refused) != len(devices) {
			t.Fatalf("%d devices became %d kept and %d refused", len(devices), len(kept), len(refused))
		}
		for _, r := range refused {
			if r.Class != trust.ReasonClass(r.Reason) || r.Reason == "" {
				t.Errorf("refusal without a reason or with the wrong class: %+v", r)
			}
		}
		// Volcano writes HAMi's Ascend keys (hami.io/<chip>-devices-allocated,
		// reported as huawei.com/<chip>) too.
		volcanoAscend := alloc == hami.Name && strings.HasPrefix(typ, "Ascend") && resource == "huawei.com/"+typ &&
			slices.Contains(gate.SchedulerNames(volcano.VGPUName), scheduler)
		if len(kept) > 0 && !slices.Contains(gate.SchedulerNames(alloc), scheduler) && !volcanoAscend {
			t.Errorf("kept %+v on a pod of %q, not a scheduler of %s", kept, scheduler, alloc)
		}
		for _, d := range kept {
			for _, id := range d.IDs {
				if strings.EqualFold(id, "all") || id == "" || strings.IndexFunc(id, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0 || len(id) > 128 {
					t.Errorf("kept an unsafe id %q", id)
				}
				if withInventory && strings.HasPrefix(resource, "nvidia.com/") && !strings.HasPrefix(strings.ToUpper(id), "MIG-") && !strings.EqualFold(id, gpu) {
					t.Errorf("kept GPU %q, not on the node", id)
				}
			}
		}
	})
}

// koordPod is a record of a koord-scheduler pod requesting a whole GPU (or
// half of one) with its allocation annotation, as the store keeps it.
func koordGPU(id string, core string) map[string]string {
	return map[string]string{koordinator.Annotation: `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"` + core + `"},"id":"` + id + `"}]}`}
}

func koordSpec(core string) *model.PodSpec {
	return &model.PodSpec{SchedulerName: "koord-scheduler", Containers: []model.ContainerSpec{{
		Name: "app", Kind: model.KindApp, Requests: map[string]string{"koordinator.sh/gpu-core": core}}}}
}

// TestTheFirstHolderKeepsAWholeGPUAcrossARestart: two running pods name
// one whole GPU (one edited its annotation); the pod whose allocation was
// learned first keeps it, before and after the daemon restarts on its state
// directory, whatever order the records come in.
func TestTheFirstHolderKeepsAWholeGPUAcrossARestart(t *testing.T) {
	const gpu = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	dir := t.TempDir()
	set := quietSet(t)
	gate := trust.NewGate(set, trust.GateOptions{})
	clock := testingclock.NewFakeClock(time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC))
	opts := state.Options{Decoder: set, Clock: clock, Log: logrus.New()}
	store, err := state.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	// "zz-first" sorts last by UID, so that only the time can make it the
	// holder.
	for _, p := range []struct{ uid, name string }{{"zz-first", "first"}, {"aa-second", "second"}} {
		store.ObserveKubeletPods(time.Now(), nil, []model.KubeletPod{{UID: p.uid, Namespace: "ml", Name: p.name, Phase: "Running", Annotations: koordGPU(gpu, "100"), Spec: *koordSpec("100")}})
		store.ObserveSandbox(record.OriginNRI, model.Sandbox{ID: "sb-" + p.uid, UID: p.uid, Namespace: "ml", Name: p.name, Annotations: koordGPU(gpu, "100"), Ready: true})
		clock.Step(time.Second)
	}
	check := func(when string, records []*record.Record) {
		t.Helper()
		holders := gate.Holders(records, nil)
		shown := map[string][]string{}
		for _, r := range records {
			kept, _ := gate.Vet(r.Spec, r.Devices, nil)
			kept, refused := gate.Contest(r, kept, holders)
			for _, d := range kept {
				shown[r.Name] = append(shown[r.Name], d.IDs...)
			}
			if r.Name == "second" && (len(refused) != 1 || refused[0].Reason != trust.ReasonContested || refused[0].Class != trust.ClassForged) {
				t.Errorf("%s: the later claimant's refusal is %+v, want contested (forged)", when, refused)
			}
		}
		if !slices.Equal(shown["first"], []string{gpu}) || len(shown["second"]) != 0 {
			t.Errorf("%s: shown %v, want the GPU on the first holder only", when, shown)
		}
	}
	records := store.Records()
	check("running", records)
	slices.Reverse(records)
	check("records in the other order", records)
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}

	clock.Step(time.Hour)
	store, err = state.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	check("after a restart", store.Records())
}

// TestASharedGPUStaysShared: two pods each given half of one GPU both
// show it; a whole-GPU claim is contested, a share is not.
func TestASharedGPUStaysShared(t *testing.T) {
	const gpu = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	set := quietSet(t)
	gate := trust.NewGate(set, trust.GateOptions{})
	at := time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)
	var records []*record.Record
	for i, uid := range []string{"uid-a", "uid-b"} {
		devs, errs := set.Decode(model.PodRef{UID: uid}, koordGPU(gpu, "50"))
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		records = append(records, &record.Record{UID: uid, Name: uid, State: record.PhaseReady, Spec: koordSpec("50"), Devices: devs,
			Provenance: record.Provenance{Annotations: &record.Seen{Origin: record.OriginNRI, At: at.Add(time.Duration(i) * time.Second)}}})
	}
	holders := gate.Holders(records, nil)
	for _, r := range records {
		kept, refused := gate.Contest(r, r.Devices, holders)
		if len(kept) != 1 || len(refused) != 0 {
			t.Errorf("%s: sharer of a GPU keeps %+v, refused %+v; want its share", r.UID, kept, refused)
		}
	}
}

// FuzzNoExclusiveDeviceTwice builds a node of pods (scheduler, requests,
// whole or shared claims on a few devices, lifecycle, when each was
// learned) from the fuzzer's bytes and answers every pod as the proxy does:
// it never panics, no exclusive id is shown on two pods, and no device is
// shown on one pod while another is shown whole what it is part of or a
// part of it (a PF and its VF, a GPU and its MIG instance), unless both
// are shares.
func FuzzNoExclusiveDeviceTwice(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11})
	f.Add([]byte{0xff, 0x00, 0xff, 0x00, 0x80, 0x40, 0x20, 0x10, 0x08})
	f.Add([]byte{0x10, 0x02, 0x28, 0x06}) // a VF, then its PF
	f.Add([]byte{0x00, 0x02, 0x30, 0x06}) // a GPU, then a MIG instance of it
	ids := []string{"GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", "GPU-2c1b5e0f-0000-4a4a-9b9b-123456789abc", "0000:01:00.2", "0000:01:00.3", "all",
		"0000:01:00.0", "MIG-GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a/1/0"}
	// family maps an id to the device it is part of.
	family := map[string]string{"0000:01:00.2": "0000:01:00.0", "MIG-GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a/1/0": ids[0]}
	set := quietSet(f)
	gate := trust.NewGate(set, trust.GateOptions{})
	node := inventory.NewSnapshot([]inventory.Device{
		{Type: inventory.TypeGPU, ID: ids[0], Healthy: true},
		{Type: inventory.TypeRDMA, ID: "0000:01:00.0", BusID: "0000:01:00.0", Healthy: true, VFs: []inventory.VF{{BusID: ids[2]}}},
	})
	at := time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, b []byte) {
		var records []*record.Record
		for i := 0; i+1 < len(b) && len(records) < 16; i += 2 {
			x, y := b[i], b[i+1]
			uid := fmt.Sprintf("uid-%02d", len(records))
			scheduler := "koord-scheduler"
			if x&1 != 0 {
				scheduler = "default-scheduler"
			}
			phase := []record.Phase{record.PhaseReady, record.PhasePending, record.PhaseStopped, record.PhaseReady}[x>>1&3]
			id := ids[int(x>>3)%len(ids)]
			shared := y&1 != 0
			typ, resource, request := "gpu", "nvidia.com/gpu", "koordinator.sh/gpu-core"
			if strings.HasPrefix(id, "0000:") {
				typ, resource, request = "rdma", "koordinator.sh/rdma", "koordinator.sh/rdma"
			}
			spec := &model.PodSpec{SchedulerName: scheduler, Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}
			if y&2 != 0 {
				spec.Containers[0].Requests = map[string]string{request: "100"}
			}
			dev := model.Device{Allocator: koordinator.Name, Type: typ, Resource: resource, IDs: []string{id}, Shared: shared}
			r := &record.Record{UID: uid, Namespace: "ns", Name: uid, State: phase, Spec: spec, Devices: []model.Device{dev},
				Provenance: record.Provenance{Annotations: &record.Seen{Origin: record.OriginKubelet, At: at.Add(time.Duration(y>>2%4) * time.Second)}}}
			if phase == record.PhaseReady {
				r.SandboxID = "sb-" + uid
				r.Provenance.Sandbox = &record.Seen{Origin: record.OriginNRI, At: at}
			}
			records = append(records, r)
		}
		holders := gate.Holders(records, node)
		type shown struct {
			uid       string
			exclusive bool
		}
		shownOn := map[string][]shown{} // id -> the pods shown it
		for _, r := range records {
			kept, _ := gate.Vet(r.Spec, r.Devices, node)
			kept, _ = gate.Contest(r, kept, holders)
			if r.State == record.PhaseStopped {
				continue // never answered: a stopped pod is read again
			}
			for _, d := range kept {
				for _, id := range d.IDs {
					shownOn[strings.ToLower(id)] = append(shownOn[strings.ToLower(id)], shown{r.UID, set.Exclusive(d)})
				}
			}
		}
		conflict := func(a, b string) {
			for _, x := range shownOn[strings.ToLower(a)] {
				for _, y := range shownOn[strings.ToLower(b)] {
					if x.uid != y.uid && (x.exclusive || y.exclusive) {
						t.Fatalf("%s shown on %s and %s on %s, one of them whole", a, x.uid, b, y.uid)
					}
				}
			}
		}
		for _, id := range ids {
			conflict(id, id)
			if parent, ok := family[id]; ok {
				conflict(id, parent)
			}
		}
	})
}

// Only Koordinator's devices are capped at what the pod asks for: a GPU
// that Volcano's gpushare gave the same pod, of the same type and resource,
// is not counted against Koordinator's count, and neither is refused.
func TestTheOverRequestCapCountsEachAllocatorApart(t *testing.T) {
	gate := trust.NewGate(quietSet(t), trust.GateOptions{SchedulerNames: map[string][]string{volcano.GPUShareName: {"koord-scheduler"}}})
	spec := &model.PodSpec{SchedulerName: "koord-scheduler", Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp,
		Requests: map[string]string{"nvidia.com/gpu": "1", volcano.DefaultGPUNumberResource: "1"}}}}
	devices := []model.Device{
		{Allocator: koordinator.Name, Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{"GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"}},
		{Allocator: volcano.GPUShareName, Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{"GPU-2c1b5e0f-0000-4a4a-9b9b-123456789abc"}},
	}
	if kept, refused := gate.Vet(spec, devices, nil); len(kept) != 2 {
		t.Errorf("kept %d of 2 devices, refused %+v", len(kept), refused)
	}
}
