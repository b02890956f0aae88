package merge

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/trust"
)

const (
	sharedGPU    = "GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"
	exclusiveGPU = "GPU-2c1b5e0f-0000-4a4a-9b9b-123456789abc"
)

// anchorPlan is the plan of a pod whose containers infer and embed share
// sharedGPU, whose anchor the pod is, and whose infer has exclusiveGPU too.
func anchorPlan(anchor bool, slot int) *plans.Plan {
	share := model.Device{Allocator: "koordinator", Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{sharedGPU}, Shared: true}
	whole := model.Device{Allocator: "koordinator", Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{exclusiveGPU}}
	return &plans.Plan{
		Containers: allocator.Assignment{"infer": {share, whole}, "embed": {share}},
		Shares:     map[string]plans.Share{inventory.IDKey(sharedGPU): {Share: trust.Share{Anchor: anchor, Slot: slot}, First: "infer"}},
	}
}

// renderedV1 returns what Pod gives each container: "id@numa" per entry.
func renderedV1(p *plans.Plan, v View) map[string][]string {
	one := int64(1)
	inv := inventory.NewSnapshot([]inventory.Device{
		{Type: inventory.TypeGPU, ID: sharedGPU, NUMANode: &one, Healthy: true},
		{Type: inventory.TypeGPU, ID: exclusiveGPU, NUMANode: &one, Healthy: true},
	})
	pod := &v1.PodResources{Name: "a", Namespace: "ml", Containers: []*v1.ContainerResources{{Name: "infer"}, {Name: "embed"}}}
	Pod(pod, p, inv, v)
	out := map[string][]string{}
	for _, c := range pod.Containers {
		for _, d := range c.Devices {
			out[c.Name] = append(out[c.Name], fmt.Sprintf("%s@%v", d.DeviceIds[0], d.GetTopology().GetNodes()))
		}
		slices.Sort(out[c.Name])
	}
	return out
}

// Each view spells the anchor's shared GPU its own way, on both of its
// containers, and leaves the exclusive GPU as it is.
func TestEachViewSpellsASharedGPUItsWay(t *testing.T) {
	whole := exclusiveGPU + "@[ID:1]"
	for _, tc := range []struct {
		view   View
		anchor bool
		slot   int
		want   map[string][]string
	}{
		{Topology, true, 0, map[string][]string{"infer": {whole, sharedGPU + "@[ID:1]"}, "embed": {sharedGPU + "::0@[]"}}},
		{Topology, false, 2, map[string][]string{"infer": {whole, sharedGPU + "::2@[]"}, "embed": {sharedGPU + "::2@[]"}}},
		{DCGM, true, 0, map[string][]string{"infer": {whole, sharedGPU + "::0@[]"}, "embed": {sharedGPU + "::0@[]"}}},
		{DCGM, false, 2, map[string][]string{"infer": {whole, sharedGPU + "::2@[]"}, "embed": {sharedGPU + "::2@[]"}}},
		{Plain, false, 2, map[string][]string{"infer": {whole, sharedGPU + "@[ID:1]"}, "embed": {sharedGPU + "@[ID:1]"}}},
		{Kata, true, 0, map[string][]string{"infer": {whole}}},
	} {
		t.Run(fmt.Sprintf("%s/anchor=%v", tc.view, tc.anchor), func(t *testing.T) {
			got := renderedV1(anchorPlan(tc.anchor, tc.slot), tc.view)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("Pod gives %v, want %v", got, tc.want)
			}
		})
	}
}

// v1alpha1 (a pod without an inventory) spells them as v1 does.
func TestV1alpha1SpellsSharedGPUsAsV1(t *testing.T) {
	pod := &v1.PodResources{Name: "a", Namespace: "ml", Containers: []*v1.ContainerResources{{Name: "infer"}, {Name: "embed"}}}
	Pod(pod, anchorPlan(true, 0), nil, DCGM)
	var got []string
	for _, c := range pod.Containers {
		for _, d := range c.Devices {
			got = append(got, c.Name+"="+d.DeviceIds[0])
		}
	}
	slices.Sort(got)
	if want := []string{"embed=" + sharedGPU + "::0", "infer=" + exclusiveGPU, "infer=" + sharedGPU + "::0"}; !slices.Equal(got, want) {
		t.Errorf("v1alpha1 gives %q, want %q", got, want)
	}
}

// Only the kata view refuses, and only a pod sharing a GPU; its reason
// names the GPU.
func TestOnlyTheKataViewRefusesAPodSharingAGPU(t *testing.T) {
	key := model.PodKey{Namespace: "ml", Name: "a"}
	for _, v := range Views {
		err := Refusal(anchorPlan(true, 0), v, key)
		if (err != nil) != (v == Kata) {
			t.Errorf("view %s refuses with %v", v, err)
		}
	}
	if err := Refusal(anchorPlan(true, 0), Kata, key); err == nil || !strings.Contains(err.Error(), "pod a in namespace ml shares GPU "+sharedGPU) {
		t.Errorf("the kata view's reason is %v", err)
	}
	exclusive := &plans.Plan{Containers: allocator.Assignment{"infer": {{Allocator: "koordinator", Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{exclusiveGPU}}}}}
	if err := Refusal(exclusive, Kata, key); err != nil {
		t.Errorf("the kata view refuses a pod with a whole GPU: %v", err)
	}
}
