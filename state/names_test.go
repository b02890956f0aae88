package state

import (
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// A pod recreated under its name while its predecessor's sandbox runs on
// (a StatefulSet's, force-deleted): every source's word on which UID the
// name is counts, the newest winning, so that the name is never answered
// with the predecessor's devices.

func running(uid string) model.KubeletPod {
	return model.KubeletPod{UID: uid, Namespace: pod.Namespace, Name: pod.Name, Phase: "Running"}
}

func liveUID(s *Store) string {
	if r, ok := s.Snapshot().Live(pod); ok {
		return r.UID
	}
	return ""
}

func TestTheSandboxOfAPodRecreatedSinceTheLastListAnswersItsName(t *testing.T) {
	clk := newFakeClock()
	s := New(Options{Clock: clk})
	s.ObserveSandbox(record.OriginNRI, readySandbox("old", "ns", "web-0", "sb-old", nil))
	listed := clk.Advance(time.Second)
	s.ObserveKubeletPods(listed, nil, []model.KubeletPod{running("old")})
	clk.Advance(time.Second)
	s.ObserveSandbox(record.OriginNRI, readySandbox("new", "ns", "web-0", "sb-new", nil))
	if got := liveUID(s); got != "new" {
		t.Fatalf("the kubelet began the sandbox of new after listing old: Live = %q, want new", got)
	}
	// A list begun before the sandbox, arriving after it, says less.
	s.ObserveKubeletPods(listed.Add(time.Millisecond), nil, []model.KubeletPod{running("old")})
	if got := liveUID(s); got != "new" {
		t.Fatalf("after a list begun before new's sandbox: Live = %q, want new", got)
	}
	// A list begun after it says what the name is now.
	s.ObserveKubeletPods(clk.Advance(time.Second), nil, []model.KubeletPod{running("old")})
	if got := liveUID(s); got != "old" {
		t.Fatalf("after a list begun since: Live = %q, want old", got)
	}
}

func TestASandboxOfANameTheKubeletNoLongerHasAnswersNothing(t *testing.T) {
	clk := newFakeClock()
	s := New(Options{Clock: clk})
	s.ObserveSandbox(record.OriginNRI, readySandbox("old", "ns", "web-0", "sb-old", nil))
	s.ObserveKubeletPods(clk.Advance(time.Second), nil, []model.KubeletPod{running("old")})
	// Force-deleted: gone from the kubelet, its sandbox torn down later.
	s.ObserveKubeletPods(clk.Advance(time.Second), nil, nil)
	if got := liveUID(s); got != "" {
		t.Fatalf("the kubelet lists no pod of the name: Live = %q, want none", got)
	}
}

func TestASandboxOfANameTheWatchDeletedAnswersNothing(t *testing.T) {
	clk := newFakeClock()
	s := New(Options{Clock: clk})
	s.ObserveSandbox(record.OriginNRI, readySandbox("old", "ns", "web-0", "sb-old", nil))
	s.ObserveWatchedPod(running("old"))
	clk.Advance(time.Second)
	s.WatchedPodDeleted(model.PodRef{UID: "old", Namespace: pod.Namespace, Name: pod.Name})
	if got := liveUID(s); got != "" {
		t.Fatalf("the watch deleted the name's pod: Live = %q, want none", got)
	}
	s.ObserveWatchedPod(running("new"))
	s.ObserveSandbox(record.OriginNRI, readySandbox("new", "ns", "web-0", "sb-new", nil))
	if got := liveUID(s); got != "new" {
		t.Fatalf("the watch added new: Live = %q, want new", got)
	}
}

// A force-deleted pod's teardown goes on being reported by the watch after
// its successor of the same name was created.

func TestALateEventOfAPodDoesNotMoveWhenItsNameWasSaid(t *testing.T) {
	clk := newFakeClock()
	s := New(Options{Clock: clk})
	s.ObserveWatchedPod(running("old"))
	s.ObserveSandbox(record.OriginNRI, readySandbox("old", "ns", "web-0", "sb-old", nil))
	said := s.Snapshot().NamedAt(pod)
	clk.Advance(time.Second) // new is created, its log directory made
	s.ObserveWatchedPod(model.KubeletPod{UID: "old", Namespace: pod.Namespace, Name: pod.Name, Phase: "Running", Annotations: map[string]string{"terminating": "yes"}})
	if got := s.Snapshot().NamedAt(pod); !got.Equal(said) {
		t.Fatalf("a status event of the name's pod moved when the name was said: %v, want %v (it would hide its successor's log directory)", got, said)
	}
}

func TestALateEventOfAForceDeletedPodDoesNotTakeItsSuccessorsName(t *testing.T) {
	clk := newFakeClock()
	s := New(Options{Clock: clk})
	s.ObserveWatchedPod(running("old"))
	s.ObserveSandbox(record.OriginNRI, readySandbox("old", "ns", "web-0", "sb-old", nil))
	clk.Advance(time.Second)
	s.ObserveWatchedPod(running("new"))
	clk.Advance(time.Second)
	s.ObserveWatchedPod(model.KubeletPod{UID: "old", Namespace: pod.Namespace, Name: pod.Name, Phase: "Running", Annotations: map[string]string{"terminating": "yes"}})
	if got := liveUID(s); got != "" {
		t.Fatalf("the name is new's, which has no sandbox yet: Live = %q, want none", got)
	}
	if r, ok := s.Snapshot().KubeletNamed(pod); !ok || r.UID != "new" {
		t.Fatalf("Named = %v, %v; want new", r, ok)
	}
}
