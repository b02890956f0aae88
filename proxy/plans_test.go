package proxy_test

import (
	"slices"
	"testing"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/trust"
)

// What a pod adds to answers is decided when the pod changes, in the
// background: an operator's `inspect` shows a forged allocation refused as
// soon as the pod runs, whether or not any agent asks, and the answers
// themselves only look plans up, never writing the store.
func TestAllocationsAreDecidedWhenPodsChangeAndQueriesWriteNothing(t *testing.T) {
	h := newHarness(t, withNode())
	gpu := fk.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})
	victim := fk.NewPod("ml", "victim", "uid-victim", fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, oneGPU), gpu)
	copycat := fk.NewPod("tenant", "copycat", "uid-copycat", fk.WithAnnotation(koordKey, oneGPU), gpu)
	h.k.SetPods(victim, copycat)
	h.markLive(victim, "sandbox-victim")
	h.markLive(copycat, "sandbox-copycat")

	awaitStore(t, h.store, "the copycat's allocation to be refused without any query", func() bool {
		return slices.Equal(refusedReasons(h, "uid-copycat"), []string{trust.ReasonWrongScheduler})
	})
	if n := h.k.GRPCCalls(); n != 0 {
		t.Fatalf("the kubelet's PodResources was called %d times; nobody asked the proxy", n)
	}

	version := h.store.Version()
	resp := h.list()
	if got := devicesOf(findPod(resp, "ml", "victim"), "train")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID}) {
		t.Errorf("the victim shows GPUs %v, want [%s]", got, gpuUUID)
	}
	if got := devicesOf(findPod(resp, "tenant", "copycat"), "train")["nvidia.com/gpu"]; len(got) != 0 {
		t.Errorf("the copycat shows GPUs %v, want none", got)
	}
	h.get("ml", "victim")
	h.get("tenant", "copycat")
	if _, err := h.v1alpha1().List(ctx(t), &v1alpha1.ListPodResourcesRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.v1().GetAllocatableResources(ctx(t), &v1.AllocatableResourcesRequest{}); err != nil {
		t.Fatal(err)
	}
	if got := h.store.Version(); got != version {
		t.Errorf("answering changed the store (version %d to %d): a read must never write", version, got)
	}
}
