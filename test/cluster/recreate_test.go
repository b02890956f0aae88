package cluster

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// forceRecreate is a pod recreated under its name while its predecessor is
// still being torn down, as force deletion, pod GC after a partition or a
// StatefulSet with local volumes cause: the kubelet starts a non-static pod
// without waiting for an earlier pod of the same name to finish terminating,
// so the successor's CNI ADD comes while the predecessor's sandbox still runs
// and PodResources, which has no UID, names both the same. A pod holding a
// VF, whose container ignores SIGTERM (30 s grace), is force-deleted (grace
// period 0), and a pod of the same name is created at once, which the binder
// gives another VF. The CNI probe must record the successor's own VF in every
// ADD that received a device, never the predecessor's, and one ADD must
// succeed (an ADD that failed Unavailable is retried by the kubelet).
func forceRecreate(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	spec := podSpec()
	grace := int64(30)
	spec.TerminationGracePeriodSeconds = &grace
	spec.Containers[0].Args = []string{"-ignore-sigterm"}
	createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec})
	old := waitReady(t, name)
	oldVFs := allocatedVFs(t, old.UID)

	zero := int64(0)
	if err := h.client.CoreV1().Pods(testNamespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("force-delete pod %s: %v", name, err)
	}
	deleted := time.Now()
	createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: podSpec()})
	successor := waitReady(t, name, old.UID)
	defer func() {
		if err := h.client.CoreV1().Pods(testNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete pod %s: %v", name, err)
		}
	}()
	for _, vf := range allocatedVFs(t, successor.UID) {
		if slices.Contains(oldVFs, vf) {
			t.Fatalf("the binder gave the successor its predecessor's VF %s: the test proves nothing", vf)
		}
	}
	checkOwnVFsAfterFailures(t, successor, "app", true)

	// Whether the window was there: the predecessor's CNI DEL (its sandbox
	// torn down) after the successor's first ADD.
	adds, err := probeAdds(successor.UID)
	if err != nil || len(adds) == 0 {
		t.Fatalf("the successor's CNI ADDs: %v (%d)", err, len(adds))
	}
	failed := 0
	for _, a := range adds {
		if a.Error != "" {
			failed++
		}
	}
	del, ok := firstDel(t, old.UID)
	switch {
	case !ok:
		t.Logf("pod %s: successor's first ADD %v after the force deletion (%d of %d ADDs failed); the predecessor's sandbox was still not torn down at the end",
			name, adds[0].Time.Sub(deleted).Round(time.Millisecond), failed, len(adds))
	default:
		t.Logf("pod %s: successor's first ADD %v after the force deletion, the predecessor's DEL %v after it (%d of %d ADDs failed)",
			name, adds[0].Time.Sub(deleted).Round(time.Millisecond), del.Sub(adds[0].Time).Round(time.Millisecond), failed, len(adds))
	}
}

// firstDel returns the time of the CNI probe's first DEL of the pod with uid.
func firstDel(t *testing.T, uid types.UID) (time.Time, bool) {
	t.Helper()
	recs, err := probeRecords()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Command == "DEL" && r.UID == string(uid) {
			return r.Time, true
		}
	}
	return time.Time{}, false
}
