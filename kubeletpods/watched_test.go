package kubeletpods

import (
	"slices"
	"testing"

	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/model"
)

// watchedCalls records what the store is told, in order.
type watchedCalls []string

func (c *watchedCalls) ObserveWatchedPod(p model.KubeletPod) { *c = append(*c, "observe "+p.UID) }
func (c *watchedCalls) WatchedPodDeleted(p model.PodRef) {
	*c = append(*c, "deleted "+p.Namespace+"/"+p.Name+" "+p.UID)
}
func (c *watchedCalls) WatchChanged() { *c = append(*c, "changed") }

// The store learns each pod the watch adds or changes, each it deletes,
// and each sync and drop of the watch; a refused pod changes nothing.
func TestWatchedTellsTheStoreEveryPodAndEverySync(t *testing.T) {
	var got watchedCalls
	handle := Watched(&got)
	a := model.KubeletPod{UID: "uid-a", Namespace: "ns", Name: "a"}
	for _, ev := range []podsapi.Event{
		{Type: podsapi.PodAdded, Pod: a},
		{Type: podsapi.PodRefused, Pod: model.KubeletPod{UID: "uid-big"}},
		{Type: podsapi.Synced},
		{Type: podsapi.PodModified, Pod: a},
		{Type: podsapi.PodDeleted, Pod: a, ByRelist: true},
		{Type: podsapi.Unsynced},
	} {
		handle(ev)
	}
	want := watchedCalls{"observe uid-a", "changed", "observe uid-a", "deleted ns/a uid-a", "changed"}
	if !slices.Equal(got, want) {
		t.Errorf("the store was told %q, want %q", got, want)
	}
}
