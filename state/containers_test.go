package state

import (
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/decode"
	"github.com/podres-proxy/podres-proxy/state/record"
)

const (
	tfParent = "GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11"
	tfMIG    = "MIG-2ce7a541-c516-5dbc-a76e-26cc100d9b55"
)

// allocators is the daemon's real decoder set, which reads container
// annotations too.
func allocators(t *testing.T) *allocator.Set {
	t.Helper()
	formats, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return allocator.NewSet(quietLog(), nil, formats...)
}

// tfPod is a TensorFusion pod of partitioned mode, as its sandbox starts:
// the parent GPU on the pod, no slice known yet.
func tfPod(uid, sandbox string) model.Sandbox {
	return readySandbox(uid, "ml", "train-0", sandbox, map[string]string{
		tensorfusion.IsolationKey: "partitioned",
		tensorfusion.GPUIDsKey:    strings.ToLower(tfParent),
	})
}

// tfContainer is a container TensorFusion's device plugin served: its
// partition is among the annotations the runtime created it with, beside
// the kubelet's own.
func tfContainer(sandbox, id string) model.RuntimeContainer {
	return model.RuntimeContainer{ID: id, SandboxID: sandbox, Name: "main", State: model.ContainerCreated, Annotations: map[string]string{
		tensorfusion.PartitionUUIDsKey: tfMIG + "/7/0:" + tfParent,
		"io.kubernetes.container.hash": "3f2a1b",
	}}
}

func migOf(r *record.Record) []string {
	var out []string
	for _, d := range r.Devices {
		out = append(out, d.Container+" "+strings.Join(d.IDs, ","))
	}
	return out
}

// A container's annotations (a device plugin's AllocateResponse, which the
// runtime has and the pod's metadata never does) are kept in the record,
// only the allocators' keys, and what they say is in the pod's devices:
// TensorFusion's MIG slice for that container, never its parent GPU. The
// record file keeps them, so a restarted daemon decodes the same.
func TestContainerAnnotationsReachThePodsDevicesAndSurviveARestart(t *testing.T) {
	dir := t.TempDir()
	s := openTest(t, dir, Options{Decoder: allocators(t)})
	s.ObserveSandbox(record.OriginNRI, tfPod("u1", "sb1"))
	if r := mustGet(t, s, "u1"); len(r.Devices) != 0 {
		t.Fatalf("a partitioned pod whose slices are unknown shows %v", migOf(r))
	}
	s.ObserveContainer(record.OriginNRI, tfContainer("sb1", "c1"))
	r := mustGet(t, s, "u1")
	if got := migOf(r); len(got) != 1 || got[0] != "main "+tfMIG {
		t.Errorf("devices once the container exists: %q; want its MIG slice only", got)
	}
	if ann := r.Containers[0].Annotations; len(ann) != 1 || ann[tensorfusion.PartitionUUIDsKey] == "" {
		t.Errorf("kept container annotations %v; want the partitions only", ann)
	}
	// Later events of the container change nothing of it.
	s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c1", SandboxID: "sb1", Name: "main", State: model.ContainerRunning})
	if got := migOf(mustGet(t, s, "u1")); len(got) != 1 || got[0] != "main "+tfMIG {
		t.Errorf("devices once running: %q", got)
	}
	flush(t, s)
	if ann := readRecordFile(t, dir, "u1").Containers[0].Annotations; ann[tensorfusion.PartitionUUIDsKey] == "" {
		t.Errorf("the record file lacks the container's annotations: %v", ann)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openTest(t, dir, Options{Decoder: allocators(t)})
	if got := migOf(mustGet(t, s2, "u1")); len(got) != 1 || got[0] != "main "+tfMIG {
		t.Errorf("devices after a restart: %q", got)
	}
}

// A new sandbox of the pod has new containers: the old ones' slices are
// no longer the pod's.
func TestANewSandboxForgetsTheOldContainersAnnotations(t *testing.T) {
	s := New(Options{Decoder: allocators(t)})
	s.ObserveSandbox(record.OriginNRI, tfPod("u1", "sb1"))
	s.ObserveContainer(record.OriginNRI, tfContainer("sb1", "c1"))
	s.ObserveSandbox(record.OriginNRI, tfPod("u1", "sb2"))
	if r := mustGet(t, s, "u1"); len(r.Devices) != 0 {
		t.Errorf("the new sandbox shows the old container's %v", migOf(r))
	}
}

// The CRI reconciler's lists carry container annotations too: a container
// learned there (NRI missed its creation) gives the pod its slice.
func TestReconciledContainersBringTheirAnnotations(t *testing.T) {
	s := New(Options{Decoder: allocators(t)})
	sb := tfPod("u1", "sb1")
	s.Reconcile(record.OriginCRI, s.now(), []model.Sandbox{sb}, []model.RuntimeContainer{tfContainer("sb1", "c1")}, true)
	if got := migOf(mustGet(t, s, "u1")); len(got) != 1 || got[0] != "main "+tfMIG {
		t.Errorf("devices after a reconcile: %q", got)
	}
}

// A container annotation over the bound is not kept, and so not believed:
// a broken device plugin cannot grow the records.
func TestAnOversizedContainerAnnotationIsNotKept(t *testing.T) {
	s := New(Options{Decoder: allocators(t)})
	s.ObserveSandbox(record.OriginNRI, tfPod("u1", "sb1"))
	c := tfContainer("sb1", "c1")
	c.Annotations[tensorfusion.PartitionUUIDsKey] += strings.Repeat(",", decode.MaxContainerAnnotation)
	s.ObserveContainer(record.OriginNRI, c)
	r := mustGet(t, s, "u1")
	if len(r.Containers) != 1 || r.Containers[0].Annotations != nil || len(r.Devices) != 0 {
		t.Errorf("an oversized annotation was kept: %v, devices %v", r.Containers, migOf(r))
	}
}
