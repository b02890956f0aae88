package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/test/binder"
)

// eventsWithin is how soon after its pod is Ready the daemon's Event must
// be there (issue 41).
const eventsWithin = 15 * time.Second

// TestDecisionsAreWarningEventsOnThePodOnceEach is issue 41's check of the
// Events, on the real kubelet and API server: a pod placed by the device
// scheduler with an allocation of a VF none of its containers requests, and
// a pod with an allocation annotation that is not JSON, each show the
// daemon's Warning Event (events.k8s.io, and kubectl describe pod) within
// 15 s, naming the device or the annotation's key; 300 List calls afterwards
// add no Event object; a pod the binder allocated a VF to, correctly, gets
// none.
func TestDecisionsAreWarningEventsOnThePodOnceEach(t *testing.T) {
	requireCluster(t)
	ensureDaemon(t)
	ctx := context.Background()
	grace := int64(2)

	// Right: the binder allocates its VF.
	right := createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "events-right"}, Spec: podSpec()})

	// Refused: placed by the device scheduler (the binder), with an
	// allocation of a VF, but no container requests one (rule no-request).
	const vf = "0000:3b:1f.7"
	alloc, err := json.Marshal(map[string]any{"rdma": []map[string]any{{
		"minor": 0, "id": binder.PF, "resources": map[string]string{binder.RDMAResource: "1"},
		"extension": map[string]any{"vfs": []map[string]any{{"minor": 253, "busID": vf}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	refused := createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "events-refused", Annotations: map[string]string{binder.Annotation: string(alloc)}},
		Spec: corev1.PodSpec{
			SchedulerName: schedulerName, TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: h.env["PAUSE_IMAGE"], ImagePullPolicy: corev1.PullNever}},
		},
	})

	// Malformed: an allocation annotation that is not JSON.
	malformed := createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "events-malformed", Annotations: map[string]string{binder.Annotation: "{not json"}},
		Spec: corev1.PodSpec{
			NodeName: h.env["NODE_NAME"], TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{Name: "app", Image: h.env["PAUSE_IMAGE"], ImagePullPolicy: corev1.PullNever}},
		},
	})
	t.Cleanup(func() {
		for _, p := range []*corev1.Pod{right, refused, malformed} {
			_ = h.client.CoreV1().Pods(testNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
		}
	})

	waitEvent := func(pod *corev1.Pod, reason, names string) eventsv1.Event {
		t.Helper()
		ready := waitReady(t, pod.Name)
		readyAt := time.Now()
		var got eventsv1.Event
		poll(t, eventsWithin, fmt.Sprintf("a %s Event on %s naming %s", reason, pod.Name, names), func() error {
			evs, err := podEvents(ready.UID)
			if err != nil {
				return err
			}
			for _, e := range evs {
				if e.Reason == reason && strings.Contains(e.Note, names) {
					got = e
					return nil
				}
			}
			return fmt.Errorf("%d Events of podres-proxy on the pod, none %s naming %s", len(evs), reason, names)
		})
		t.Logf("%s: %s Event %s after the pod was Ready (%s after it was created): %q",
			pod.Name, reason, time.Since(readyAt).Round(100*time.Millisecond), time.Since(pod.CreationTimestamp.Time).Round(100*time.Millisecond), got.Note)
		if got.Type != corev1.EventTypeWarning || got.ReportingController != "podres-proxy" || got.ReportingInstance != h.env["NODE_NAME"] ||
			got.Regarding.Kind != "Pod" || got.Regarding.UID != ready.UID || got.Regarding.Name != pod.Name {
			t.Errorf("%s: Event %s: type %q, reporting %q instance %q, regarding %+v; want Warning from podres-proxy on node %q regarding the pod's UID %s",
				pod.Name, got.Name, got.Type, got.ReportingController, got.ReportingInstance, got.Regarding, h.env["NODE_NAME"], ready.UID)
		}
		return got
	}
	waitEvent(refused, "AllocationRefused", vf)
	waitEvent(malformed, "AnnotationUndecodable", binder.Annotation)

	// What an operator runs: kubectl describe pod shows it (through the
	// core Events API, which serves events.k8s.io's objects too).
	if out, err := kubectl("-n", testNamespace, "describe", "pod", refused.Name); err != nil {
		t.Errorf("kubectl describe pod: %v", err)
	} else if !strings.Contains(out, "AllocationRefused") || !strings.Contains(out, "podres-proxy") {
		t.Errorf("kubectl describe pod %s shows no AllocationRefused Event from podres-proxy:\n%s", refused.Name, out)
	} else {
		for l := range strings.Lines(out) {
			if strings.Contains(l, "AllocationRefused") {
				t.Logf("kubectl describe pod %s: %s", refused.Name, strings.TrimSpace(l))
			}
		}
	}

	// Right gets its VF, and no Event.
	rightReady := waitReady(t, right.Name)
	checkOwnVFs(t, rightReady, "app")

	// 300 List calls add no Event object, to any pod of the namespace.
	before, err := namespaceEvents()
	if err != nil {
		t.Fatal(err)
	}
	emitted, err := metric("podres_proxy_events_emitted_total")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Within the rate limit (100 calls/s, burst 10), as a monitoring agent
	// calls.
	pace := time.NewTicker(20 * time.Millisecond)
	defer pace.Stop()
	for i := range 300 {
		<-pace.C
		if err := callProxy(func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) error {
			_, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
			return err
		}); err != nil {
			t.Fatalf("List %d: %v", i, err)
		}
	}
	t.Logf("300 List calls in %s", time.Since(start).Round(time.Millisecond))
	// Absence cannot be awaited: give a late Event the time the first ones
	// took at most.
	time.Sleep(5 * time.Second)
	after, err := namespaceEvents()
	if err != nil {
		t.Fatal(err)
	}
	emittedAfter, err := metric("podres_proxy_events_emitted_total")
	if err != nil {
		t.Fatal(err)
	}
	if emittedAfter != emitted {
		t.Errorf("podres_proxy_events_emitted_total went from %v to %v during 300 List calls", emitted, emittedAfter)
	}
	for name, e := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("a new Event during 300 List calls: %s %s on %s/%s: %q", e.Reason, name, e.Regarding.Kind, e.Regarding.Name, e.Note)
		}
	}
	t.Logf("podres-proxy's Events in %s: %d before the 300 List calls, %d after; emitted_total %v", testNamespace, len(before), len(after), emittedAfter)

	if evs, err := podEvents(rightReady.UID); err != nil {
		t.Error(err)
	} else if len(evs) > 0 {
		t.Errorf("the correctly allocated pod %s has %d Events of podres-proxy, first %s: %q", right.Name, len(evs), evs[0].Reason, evs[0].Note)
	}
}

// ensureDaemon installs deploy/base, when no test has installed a daemon
// yet, and waits for it to be ready.
func ensureDaemon(t *testing.T) {
	t.Helper()
	if h.source != noSource {
		return
	}
	if out, err := kubectl("apply", "-k", "deploy/base"); err != nil {
		t.Fatal(err)
	} else {
		t.Log(out)
	}
	if _, err := kubectl("-n", "podres-proxy", "rollout", "status", "daemonset/podres-proxy", "--timeout=180s"); err != nil {
		desc, _ := kubectl("-n", "podres-proxy", "describe", "pods")
		t.Fatalf("%v\n%s", err, desc)
	}
	useSource(t, "podres-proxy", viaPodsAPI)
}

// podEvents returns podres-proxy's Events (events.k8s.io) regarding the pod
// with uid.
func podEvents(uid types.UID) ([]eventsv1.Event, error) {
	all, err := namespaceEvents()
	if err != nil {
		return nil, err
	}
	var out []eventsv1.Event
	for _, e := range all {
		if e.Regarding.UID == uid {
			out = append(out, e)
		}
	}
	return out, nil
}

// namespaceEvents returns podres-proxy's Events in the test namespace, by
// name.
func namespaceEvents() (map[string]eventsv1.Event, error) {
	list, err := h.client.EventsV1().Events(testNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Events: %w", err)
	}
	out := map[string]eventsv1.Event{}
	for _, e := range list.Items {
		if e.ReportingController == "podres-proxy" {
			out[e.Name] = e
		}
	}
	return out, nil
}
