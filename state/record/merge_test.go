package record

import (
	"maps"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
)

// What the instance that takes a state directory over keeps of a pod both
// instances recorded during a rolling update: every fact from whichever
// learned it last.
func TestMergeTakesEachFactFromTheRecordThatLearnedItLast(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 17, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	seen := func(o Origin, s int) *Seen { return &Seen{Origin: o, At: at(s)} }
	spec := func(gpus string) *model.PodSpec {
		return &model.PodSpec{Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp, Requests: map[string]string{"nvidia.com/gpu": gpus}}}}
	}
	running := []Container{{Name: "app", ID: "c1", State: model.ContainerRunning}}
	stopped := []Container{{Name: "app", ID: "c1", State: model.ContainerStopped}}
	ann := func(v string) map[string]string { return map[string]string{"alloc": v} }
	removedAt := at(5)
	for _, tc := range []struct {
		name         string
		ours, theirs Record
		check        func(t *testing.T, m *Record)
	}{{
		// The sandbox started while the old instance had left NRI; the old
		// one then read /pods and wrote the pod as pending, later.
		name: "a sandbox only ours saw outlives their later /pods read",
		ours: Record{SandboxID: "sb", State: PhaseReady, Containers: running, UpdatedAt: at(1),
			Provenance: Provenance{Sandbox: seen(OriginNRI, 1), Containers: seen(OriginNRI, 1)}},
		theirs: Record{State: PhasePending, KubeletPhase: "Pending", Spec: spec("1"), UpdatedAt: at(2),
			Provenance: Provenance{Spec: seen(OriginKubelet, 2)}},
		check: func(t *testing.T, m *Record) {
			if m.SandboxID != "sb" || m.State != PhaseReady || !m.Live() || len(m.Containers) != 1 {
				t.Errorf("sandbox %q state %q containers %v, want our running sandbox", m.SandboxID, m.State, m.Containers)
			}
			if m.Spec == nil || m.KubeletPhase != "Pending" {
				t.Errorf("spec %v phase %q, want theirs", m.Spec, m.KubeletPhase)
			}
			if !m.UpdatedAt.Equal(at(2)) {
				t.Errorf("updatedAt %v, want the later", m.UpdatedAt)
			}
		},
	}, {
		name: "their later removal wins, with its containers",
		ours: Record{SandboxID: "sb", State: PhaseReady, Containers: running, UpdatedAt: at(1),
			Provenance: Provenance{Sandbox: seen(OriginNRI, 1), Containers: seen(OriginNRI, 1)}},
		theirs: Record{SandboxID: "sb", State: PhaseRemoved, RemovedAt: &removedAt, Containers: stopped, UpdatedAt: at(5),
			Provenance: Provenance{Sandbox: seen(OriginNRI, 5), Containers: seen(OriginNRI, 5)}},
		check: func(t *testing.T, m *Record) {
			if m.State != PhaseRemoved || m.RemovedAt == nil || m.Containers[0].State != model.ContainerStopped {
				t.Errorf("state %q removedAt %v containers %v, want their removal", m.State, m.RemovedAt, m.Containers)
			}
		},
	}, {
		name: "containers of another sandbox are not taken",
		ours: Record{SandboxID: "sb-new", State: PhaseReady, UpdatedAt: at(3),
			Provenance: Provenance{Sandbox: seen(OriginNRI, 3)}},
		theirs: Record{SandboxID: "sb-old", State: PhaseReady, Containers: running, UpdatedAt: at(4),
			Provenance: Provenance{Sandbox: seen(OriginNRI, 1), Containers: seen(OriginNRI, 4)}},
		check: func(t *testing.T, m *Record) {
			if m.SandboxID != "sb-new" || len(m.Containers) != 0 {
				t.Errorf("sandbox %q containers %v, want our new sandbox without the old one's containers", m.SandboxID, m.Containers)
			}
		},
	}, {
		name: "the runtime's annotations stay over a later /pods read",
		ours: Record{Annotations: ann("runtime"), Devices: []model.Device{{Resource: "gpu", IDs: []string{"a"}}}, UpdatedAt: at(1),
			Provenance: Provenance{Annotations: seen(OriginNRI, 1)}},
		theirs: Record{Annotations: ann("edited"), Edited: []string{"alloc"}, UpdatedAt: at(2),
			Provenance: Provenance{Annotations: seen(OriginKubelet, 2)}},
		check: func(t *testing.T, m *Record) {
			if m.Annotations["alloc"] != "runtime" || len(m.Devices) != 1 || m.Edited != nil {
				t.Errorf("annotations %v devices %v edited %v, want ours, the runtime's", m.Annotations, m.Devices, m.Edited)
			}
		},
	}, {
		name: "their runtime annotations replace our /pods read",
		ours: Record{Annotations: ann("api"), UpdatedAt: at(3),
			Provenance: Provenance{Annotations: seen(OriginKubelet, 3)}},
		theirs: Record{Annotations: ann("runtime"), UpdatedAt: at(1),
			Provenance: Provenance{Annotations: seen(OriginCRI, 1)}},
		check: func(t *testing.T, m *Record) {
			if m.Annotations["alloc"] != "runtime" {
				t.Errorf("annotations %v, want theirs, the runtime's", m.Annotations)
			}
		},
	}, {
		name: "a finished phase is final; slots stay with a pod",
		ours: Record{KubeletPhase: "Running", Spec: spec("1"), GPUSlots: map[string]int{"gpu-a": 1}, UpdatedAt: at(3),
			Provenance: Provenance{Spec: seen(OriginKubelet, 3)}},
		theirs: Record{KubeletPhase: "Succeeded", Spec: spec("1"), Refused: []model.Refused{{Reason: "r"}}, UpdatedAt: at(4),
			Provenance: Provenance{Spec: seen(OriginKubelet, 1)}},
		check: func(t *testing.T, m *Record) {
			if m.KubeletPhase != "Succeeded" {
				t.Errorf("kubelet phase %q, want their final Succeeded", m.KubeletPhase)
			}
			if !maps.Equal(m.GPUSlots, map[string]int{"gpu-a": 1}) || len(m.Refused) != 1 {
				t.Errorf("slots %v refused %v, want our slots and their later refusal", m.GPUSlots, m.Refused)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ours, theirs := tc.ours, tc.theirs
			m := Merge(&ours, &theirs)
			tc.check(t, m)
			if back := Merge(m, &theirs); back.SandboxID != m.SandboxID || back.State != m.State || len(back.Containers) != len(m.Containers) {
				t.Errorf("merging theirs again changed the result: %+v, then %+v", m, back)
			}
		})
	}
}
