package proxy

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
)

// These test what a List's build decides, without a server: which pods it
// looks up, what it counts, and what each rebuilt pod's output is made of.
// answers_test.go tests the same through a server and a fake kubelet.

// podSegment is a kubelet pod segment of namespace/name with one container.
func podSegment(t *testing.T, namespace, name string) []byte {
	t.Helper()
	b, err := proto.Marshal(&v1.PodResources{Namespace: namespace, Name: name,
		Containers: []*v1.ContainerResources{{Name: "app"}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestOnlyPodsWithoutAReusedOutputAreLookedUpInTheirOrder(t *testing.T) {
	web := model.PodKey{Namespace: "default", Name: "web"}
	db := model.PodKey{Namespace: "prod", Name: "db"}
	for _, tc := range []struct {
		name     string
		parts    []reuse.Part
		wantNeed []int
		wantKeys []model.PodKey
		wantErr  bool
	}{{
		name:  "every pod reused: none",
		parts: []reuse.Part{{Pod: podSegment(t, "default", "web"), Key: web}, {Field: []byte{0x10, 1}}},
	}, {
		name: "a field that is not a pod is never looked up",
		parts: []reuse.Part{{Field: []byte{0x10, 1}},
			{Pod: podSegment(t, "default", "web"), Need: true}},
		wantNeed: []int{1}, wantKeys: []model.PodKey{web},
	}, {
		name: "a key the cache knew is kept, an unknown one read from the segment",
		parts: []reuse.Part{{Pod: podSegment(t, "other", "x"), Need: true, Key: db},
			{Pod: podSegment(t, "default", "web"), Key: web},
			{Pod: podSegment(t, "default", "web"), Need: true}},
		wantNeed: []int{0, 2}, wantKeys: []model.PodKey{db, web},
	}, {
		name:    "a pod segment that does not parse fails the answer",
		parts:   []reuse.Part{{Pod: []byte{0x0a, 0x05, 'w'}, Need: true}},
		wantErr: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			need, keys, err := toLookUp(tc.parts)
			if (err != nil) != tc.wantErr {
				t.Fatalf("toLookUp error %v, want an error: %v", err, tc.wantErr)
			}
			if !slices.Equal(need, tc.wantNeed) || !slices.Equal(keys, tc.wantKeys) {
				t.Errorf("toLookUp gave %v %v, want %v %v", need, keys, tc.wantNeed, tc.wantKeys)
			}
		})
	}
}

func TestEachPodOfAnAnswerIsCountedOnceAsReusedOrRebuilt(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		pods, reused, lookedUp  int
		wantReused, wantRebuilt int
		wantCounted             bool
	}{
		{name: "no pod: nothing counted"},
		{name: "steady: every pod reused", pods: 3, reused: 3, wantReused: 3, wantCounted: true},
		{name: "one of three looked up", pods: 3, reused: 2, lookedUp: 1, wantReused: 2, wantRebuilt: 1, wantCounted: true},
		{name: "every pod looked up", pods: 2, lookedUp: 2, wantRebuilt: 2, wantCounted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reused, rebuilt, ok := listPodsCounted(tc.pods, tc.reused, tc.lookedUp)
			if reused != tc.wantReused || rebuilt != tc.wantRebuilt || ok != tc.wantCounted {
				t.Errorf("listPodsCounted(%d, %d, %d) = %d, %d, %v, want %d, %d, %v", tc.pods, tc.reused, tc.lookedUp,
					reused, rebuilt, ok, tc.wantReused, tc.wantRebuilt, tc.wantCounted)
			}
		})
	}
}

func TestCachesCheckAgainstTheTableOnlyWhileTheDirectorySaysNoMore(t *testing.T) {
	table := &plans.Table{}
	if got := cacheTable(table, true); got != table {
		t.Errorf("fresh: the caches check against %p, want the query's table %p", got, table)
	}
	if got := cacheTable(table, false); got != nil {
		t.Errorf("not fresh: the caches check against %p, want no table (every pod looked up)", got)
	}
	if got := topology(table, true); got != nil {
		t.Errorf("v1alpha1: rebuilt with the inventory %p, want none (no topology)", got)
	}
}

func TestARebuiltPodIsTheKubeletsSegmentUnlessItsPlanAddsDevices(t *testing.T) {
	seg := podSegment(t, "default", "web")
	gpu := &plans.Plan{Containers: allocator.Assignment{"app": {{
		Allocator: "koordinator", Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{"GPU-1"}}}}}
	parts := []reuse.Part{
		{Pod: seg, Need: true},
		{Field: []byte{0x10, 1}},
		{Pod: seg, Need: true},
		{Pod: []byte{0x0a, 0x05, 'w'}, Need: true},
	}
	if err := rebuildAll(parts[:3], []int{0, 2}, []*plans.Plan{nil, gpu}, nil, merge.Plain); err != nil {
		t.Fatal(err)
	}
	if p := parts[0]; !p.Same || string(p.Out) != string(seg) || p.Plan != nil {
		t.Errorf("a pod without a plan: Same %v, Out changed %v, plan %v; want the kubelet's segment", p.Same, string(p.Out) != string(seg), p.Plan)
	}
	if parts[1].Out != nil {
		t.Errorf("a field that is not a pod got an output")
	}
	var pod v1.PodResources
	if err := proto.Unmarshal(parts[2].Out, &pod); err != nil {
		t.Fatal(err)
	}
	if p := parts[2]; p.Same || p.Plan != gpu || len(pod.GetContainers()[0].GetDevices()) != 1 ||
		!slices.Equal(pod.GetContainers()[0].GetDevices()[0].GetDeviceIds(), []string{"GPU-1"}) {
		t.Errorf("a pod with a GPU plan: Same %v, plan %p, devices %v; want its GPU-1 added", p.Same, p.Plan, pod.GetContainers()[0].GetDevices())
	}
	if err := rebuildAll(parts, []int{3}, []*plans.Plan{gpu}, nil, merge.Plain); err == nil {
		t.Errorf("a pod segment that does not parse was rebuilt without an error")
	}
}
