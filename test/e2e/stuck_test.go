package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A pod the kubelet admitted but cannot start (here a hostPath volume whose
// directory does not exist, as a static pod's stand-in for a missing
// Secret) is in every List and has no sandbox. Polling consumers must not
// cost a /pods read per List for it; and when a pod recreated under its
// name starts, its CNI ADD must see its own VF, not the one a read gave the
// name before (docs/pod-sources.md).

// stuckVFPod is a VF pod whose app container mounts dir, which must exist.
func stuckVFPod(vf, dir string) testPod {
	p := newVFPod("stuck", vf)
	directory := corev1.HostPathDirectory
	p.pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &directory}}}}
	p.pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	return p
}

// listedVF lists the proxy and returns what it gives p's app container.
func listedVF(p testPod) ([]string, error) {
	resp, err := list(h.proxySocket, multus)
	if err != nil {
		return nil, err
	}
	pod := findPod(resp, podNamespace, p.fullName())
	if pod == nil {
		return nil, fmt.Errorf("%s is not listed", p.fullName())
	}
	return devicesOf(pod)["app"][rdmaResource], nil
}

// kubeletUID is the UID the kubelet's /pods gives p, "" when it has none.
func kubeletUID(p testPod) (string, error) {
	list, err := kubeletPods()
	if err != nil {
		return "", err
	}
	if pod := findKubeletPod(list, podNamespace, p.fullName()); pod != nil {
		return string(pod.UID), nil
	}
	return "", nil
}

func TestAPodStuckBeforeItsSandboxCostsNoReadPerListAndStartsWithItsOwnVF(t *testing.T) {
	requireProxy(t)
	ensurePods(t)
	dir := filepath.Join(h.root, "stuck-volume")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	first := stuckVFPod("0000:3b:02.7", dir)
	if err := first.create(); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(first.manifestPath())
	poll(t, time.Minute, "the proxy lists the stuck pod with its VF", func() error {
		got, err := listedVF(first)
		if err == nil && !slices.Equal(got, first.want["app"][rdmaResource]) {
			err = fmt.Errorf("%s shows %v, want %v", first.fullName(), got, first.want["app"][rdmaResource])
		}
		return err
	})
	// Once a read began podlogs.Settle after the last sandbox the node
	// began, Lists answer the stuck pod from it.
	poll(t, 30*time.Second, "a List of the stuck pod costs no /pods read", func() error {
		before, err := h.readCounts()
		if err != nil {
			return err
		}
		if _, err := listedVF(first); err != nil {
			return err
		}
		after, err := h.readCounts()
		if n := after.since(before).shared; err == nil && n != 0 {
			err = fmt.Errorf("a List read the kubelet's pods %v times", n)
		}
		return err
	})
	before := countReads(t)
	const lists = 20
	for i := range lists {
		got, err := listedVF(first)
		if err != nil {
			t.Fatalf("List %d: %v", i, err)
		}
		if !slices.Equal(got, first.want["app"][rdmaResource]) {
			t.Fatalf("List %d: the stuck pod shows %v, want %v", i, got, first.want["app"][rdmaResource])
		}
	}
	reads := countReads(t).since(before)
	t.Logf("%d Lists with a pod stuck before its sandbox: %s", lists, reads)
	// The kubelet's log garbage collection may remove a log directory
	// meanwhile, which costs one read.
	if reads.shared > 1 {
		t.Errorf("%d Lists with a pod stuck before its sandbox read the kubelet's pods %v times, want at most 1", lists, reads.shared)
	}

	// The pod is deleted and recreated under its name with another VF,
	// still stuck; then its directory appears and the kubelet starts it.
	firstUID, err := kubeletUID(first)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.remove(); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the kubelet drops the first stuck pod", func() error {
		uid, err := kubeletUID(first)
		if err == nil && uid != "" {
			err = fmt.Errorf("/pods still has %s as %s", first.fullName(), uid)
		}
		return err
	})
	second := stuckVFPod("0000:3b:03.0", dir)
	if err := second.create(); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(second.manifestPath())
	poll(t, time.Minute, "the kubelet admits the recreated pod", func() error {
		uid, err := kubeletUID(second)
		if err == nil && (uid == "" || uid == firstUID) {
			err = fmt.Errorf("/pods has %s as %q, want a new UID", second.fullName(), uid)
		}
		return err
	})
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := waitRunning(2*time.Minute, second.fullName()); err != nil {
		t.Fatalf("the recreated pod did not start once its directory existed: %v", err)
	}
	checkVFAdds(t, []testPod{second})
	if got, err := listedVF(second); err != nil || !slices.Equal(got, second.want["app"][rdmaResource]) {
		t.Errorf("the started pod shows %v (%v), want %v", got, err, second.want["app"][rdmaResource])
	}
	if err := second.remove(); err != nil {
		t.Error(err)
	}
}
