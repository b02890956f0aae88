package podstest

import (
	"bytes"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestPodListJSONIsAPodListOfTheGivenPods(t *testing.T) {
	annotate := func(i int) map[string]string {
		if i == 1 {
			return map[string]string{"example.com/alloc": "x"}
		}
		return nil
	}
	var got corev1.PodList
	if err := json.Unmarshal(PodListJSON(5, annotate), &got); err != nil {
		t.Fatal(err)
	}
	if got.Kind != "PodList" || got.APIVersion != "v1" {
		t.Errorf("kind %q apiVersion %q, want PodList v1", got.Kind, got.APIVersion)
	}
	// Quantities keep a cache of their string, so compare encodings.
	again, _ := json.Marshal(&got)
	want, _ := json.Marshal(PodList(5, annotate))
	if !bytes.Equal(again, want) {
		t.Error("PodListJSON does not decode to PodList")
	}
	if got.Items[1].Annotations["example.com/alloc"] != "x" || got.Items[2].Annotations["example.com/alloc"] != "" {
		t.Error("annotate was not applied to its pod only")
	}
	seen := map[string]bool{}
	for i, p := range got.Items {
		if p.Name != Name(i) || p.Namespace != Namespace(i) || string(p.UID) != UID(i) {
			t.Errorf("pod %d is %s/%s uid %s", i, p.Namespace, p.Name, p.UID)
		}
		key := p.Namespace + "/" + p.Name
		if seen[key] || seen[string(p.UID)] {
			t.Errorf("pod %d repeats a name or uid", i)
		}
		seen[key], seen[string(p.UID)] = true, true
		if len(p.ManagedFields) == 0 {
			t.Errorf("pod %d has no managedFields", i)
		}
	}
}

// Benchmarks that use these pods are only as realistic as their size.
func TestPodsAreFiveToSevenKilobytesEach(t *testing.T) {
	for _, n := range []int{10, 110, 250} {
		per := len(PodListJSON(n, nil)) / n
		if per < 5000 || per > 7500 {
			t.Errorf("%d pods: %d bytes per pod, want 5-7 KB", n, per)
		}
	}
}

func TestPodsVaryTheWayANodesPodsDo(t *testing.T) {
	var gpu, init, sidecar, twoApps, finished int
	for _, p := range PodList(60, nil).Items {
		if _, ok := p.Spec.Containers[0].Resources.Limits[GPUResource]; ok {
			gpu++
		}
		for _, c := range p.Spec.InitContainers {
			if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				sidecar++
			} else {
				init++
			}
		}
		if len(p.Spec.Containers) == 2 {
			twoApps++
		}
		if p.Status.Phase == corev1.PodSucceeded {
			finished++
		}
	}
	if gpu != 20 || init != 15 || sidecar != 12 || twoApps != 30 || finished != 5 {
		t.Errorf("of 60 pods: %d with a GPU, %d init, %d sidecar, %d with two app containers, %d finished",
			gpu, init, sidecar, twoApps, finished)
	}
}
