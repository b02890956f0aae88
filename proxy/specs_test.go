package proxy_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// awaitStore waits until cond holds, checking it whenever the store changes.
func awaitStore(t *testing.T, s *state.Store, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		changed := s.Changed()
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestRunningPodsLearnedFromNRIKeepTheirDevicesWhenPodsGoesDownBeforeAnyQuery(t *testing.T) {
	// A real NRI runtime synchronizes two running pods and then starts a
	// third; nobody queries the proxy; then /pods starts failing (503).
	// Every running pod must still be answered with its devices: their
	// specs were read when the runtime reported them, not left for the
	// first List that includes them.
	h := newHarness(t, withNode())
	koord := fk.WithSchedulerName("koord-scheduler")
	rdma := `{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"100"},"id":"` + pfAddr + `","extension":{"vfs":[{"minor":-1,"busID":"` + vfAddr + `"}]}}]}`
	a := fk.NewPod("ml", "a", "uid-a", koord, fk.WithAnnotation(koordKey, oneGPU),
		fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
	b := fk.NewPod("ml", "b", "uid-b", koord, fk.WithAnnotation(koordKey, strings.ReplaceAll(oneGPU, gpuUUID, gpuUUID2)),
		fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
	c := fk.NewPod("net", "c", "uid-c", koord, fk.WithAnnotation(koordKey, rdma),
		fk.WithContainer("app", map[string]string{"koordinator.sh/rdma": "100"}))
	h.k.SetPods(a, b, c)

	sandbox := func(p fk.Pod, id string) model.Sandbox {
		return model.Sandbox{ID: id, UID: string(p.UID), Namespace: p.Namespace, Name: p.Name, Annotations: p.Annotations, Ready: true}
	}
	h.store.Reconcile(record.OriginNRI, time.Now(), []model.Sandbox{sandbox(a, "sb-a"), sandbox(b, "sb-b")}, nil, false)
	h.store.ObserveSandbox(record.OriginNRI, sandbox(c, "sb-c"))
	awaitStore(t, h.store, "the running pods' specs to be read (without them they are answered without devices once /pods fails)", func() bool {
		for _, uid := range []string{"uid-a", "uid-b", "uid-c"} {
			if r, ok := h.store.Get(uid); !ok || r.Spec == nil {
				return false
			}
		}
		return true
	})

	h.k.SetPodsDown(true)
	resp := h.list()
	for _, w := range []struct {
		pod, container, resource, id string
	}{
		{"a", "train", "nvidia.com/gpu", gpuUUID},
		{"b", "train", "nvidia.com/gpu", gpuUUID2},
		{"c", "app", "koordinator.sh/rdma", vfAddr},
	} {
		pod := findPod(resp, map[string]string{"a": "ml", "b": "ml", "c": "net"}[w.pod], w.pod)
		if got := devicesOf(pod, w.container)[w.resource]; !slices.Equal(got, []string{w.id}) {
			t.Errorf("with /pods down, pod %s's %s shows %s %v, want [%s]", w.pod, w.container, w.resource, got, w.id)
		}
	}
}
