package binder

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func podRequesting(uid types.UID, limits corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: string(uid), UID: uid},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "sidecar"}},
			Containers:     []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{Limits: limits}}},
		},
	}
}

// vfsOf decodes the VF addresses of an annotation the binder wrote, as
// podres-proxy's Koordinator decoder reads them.
func vfsOf(t *testing.T, ann string) []string {
	t.Helper()
	var a map[string][]struct {
		ID        string `json:"id"`
		Extension struct {
			VFs []struct {
				BusID string `json:"busID"`
			} `json:"vfs"`
		} `json:"extension"`
	}
	if err := json.Unmarshal([]byte(ann), &a); err != nil {
		t.Fatalf("annotation %q: %v", ann, err)
	}
	var out []string
	for _, d := range a["rdma"] {
		if d.ID != PF {
			t.Errorf("rdma device id %q, want the PF %s", d.ID, PF)
		}
		for _, vf := range d.Extension.VFs {
			out = append(out, vf.BusID)
		}
	}
	return out
}

func TestEveryPodGetsNewVFsAndTheSameOnesAgain(t *testing.T) {
	b := &Binder{}
	two := corev1.ResourceList{RDMAResource: resource.MustParse("2")}
	seen := map[string]types.UID{}
	for _, uid := range []types.UID{"a", "b", "c", "d"} {
		ann, err := b.allocate(podRequesting(uid, two))
		if err != nil {
			t.Fatal(err)
		}
		vfs := vfsOf(t, ann)
		if len(vfs) != 2 {
			t.Fatalf("pod %s got VFs %v, want 2", uid, vfs)
		}
		for _, vf := range vfs {
			if other, dup := seen[vf]; dup {
				t.Errorf("VF %s given to pods %s and %s", vf, other, uid)
			}
			seen[vf] = uid
		}
		again, _ := b.allocate(podRequesting(uid, two))
		if again != ann {
			t.Errorf("pod %s: second allocation %q differs from the first %q", uid, again, ann)
		}
		if got, _ := b.Allocation(uid); got != ann {
			t.Errorf("Allocation(%s) = %q, want %q", uid, got, ann)
		}
	}
}

func TestPodsWithoutDeviceRequestsGetNoAnnotation(t *testing.T) {
	b := &Binder{}
	ann, err := b.allocate(podRequesting("plain", corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}))
	if err != nil || ann != "" {
		t.Errorf("a pod without device requests got %q (%v), want no annotation", ann, err)
	}
}

func TestVFAddressesArePCIFunctionsOfTheNIC(t *testing.T) {
	for n, want := range map[int]string{0: "0000:3b:00.2", 5: "0000:3b:00.7", 6: "0000:3b:01.0", 13: "0000:3b:01.7", 14: "0000:3b:02.0"} {
		if got := vfAddress(n); got != want {
			t.Errorf("vfAddress(%d) = %s, want %s", n, got, want)
		}
	}
}
