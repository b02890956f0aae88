package plugin

import (
	"maps"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/statetest"
)

// The allocation fixtures whose containers carry annotations (TensorFusion's
// MIG partitions, which its device plugin returns from Allocate) go through
// the runtime, as on a node: RunPodSandbox with the pod's annotations, then
// PostCreateContainer for each container with its own. The pod's devices
// are then the slices the fixture expects, never the parent GPU the pod's
// annotations name.
func TestContainerAnnotationsFromNRIGiveThePodItsSlices(t *testing.T) {
	cases, err := allocfixture.Load()
	if err != nil {
		t.Fatal(err)
	}
	formats, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set := allocator.NewSet(testLog(), nil, formats...)
	store := state.New(state.Options{Decoder: set})
	dir := shortTempDir(t)
	rt := startRuntime(t, dir, nil, nil)
	p := startPlugin(t, store, dir)
	poll.Until(t, "Synchronize to be applied", p.Synced)
	rt.waitPlugins(t, 1)

	n := 0
	for _, c := range cases {
		if c.ContainerAnnotations() == nil {
			continue
		}
		n++
		pod := &api.PodSandbox{Id: "sb-" + c.Name, Uid: "uid-" + c.Name, Namespace: c.Scheduler, Name: c.Name, Annotations: c.Annotations}
		rt.mustSend(t, "RunPodSandbox", pod, nil)
		for _, ctr := range c.Containers {
			rt.mustSend(t, "PostCreateContainer", pod, &api.Container{
				Id: pod.Id + "-" + ctr.Name, PodSandboxId: pod.Id, Name: ctr.Name,
				State:       api.ContainerState_CONTAINER_CREATED,
				Annotations: withKubeletAnnotations(ctr.Annotations),
			})
		}
		want := map[string]bool{}
		for _, e := range c.Allocated {
			want[e.Resource+" "+e.ID] = true
		}
		statetest.Wait(t, store, c.Name+": the containers' slices and nothing else", func() bool {
			r, ok := store.Get(pod.Uid)
			if !ok || len(r.Containers) != len(c.Containers) {
				return false
			}
			got := map[string]bool{}
			for _, d := range r.Devices {
				for _, id := range d.IDs {
					got[d.Resource+" "+id] = true
				}
			}
			return maps.Equal(got, want)
		})
		r, _ := store.Get(pod.Uid)
		for _, ctr := range r.Containers {
			if _, other := ctr.Annotations["io.kubernetes.container.hash"]; other {
				t.Errorf("%s: the record keeps container annotations no allocator reads: %v", c.Name, ctr.Annotations)
			}
		}
	}
	if n == 0 {
		t.Fatal("no fixture has container annotations")
	}
}

// withKubeletAnnotations adds what the kubelet writes on every container
// to a device plugin's annotations.
func withKubeletAnnotations(ann map[string]string) map[string]string {
	out := map[string]string{"io.kubernetes.container.hash": "3f2a1b", "io.kubernetes.container.restartCount": "0"}
	maps.Copy(out, ann)
	return out
}
