package plans_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/report"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/trust"
)

// reported records what a builder reports.
type reported struct {
	mu     sync.Mutex
	events []string // "uid reason action: note"
}

func (r *reported) Pod(pod model.PodRef, reason, action, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, pod.UID+" "+reason+" "+action+": "+note)
}

func (r *reported) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func startReporting(t *testing.T, r plans.Reporter) (*state.Store, *plans.Builder) {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.PanicLevel)
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	set := allocator.NewSet(log, nil, decoders...)
	store := state.New(state.Options{Decoder: set})
	b := plans.New(plans.Options{Store: store, Allocators: set, Gate: trust.NewGate(set, trust.GateOptions{Log: log}), Report: r, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return store, b
}

// observe has the kubelet list pods, and returns once every build that
// began before has reported: builds run one after the other, so once the
// table of a later change (a pod without devices, which changes no
// decision) is there, they have.
func observe(t *testing.T, store *state.Store, b *plans.Builder, pods []model.KubeletPod) {
	t.Helper()
	store.ObserveKubeletPods(time.Now(), nil, pods)
	tableAt(t, store, b)
	barriers++
	idle := model.KubeletPod{UID: fmt.Sprintf("uid-barrier-%d", barriers), Namespace: "ml", Name: fmt.Sprintf("barrier-%d", barriers), Phase: "Running",
		Spec: model.PodSpec{SchedulerName: "default-scheduler", Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}}
	store.ObserveKubeletPods(time.Now(), nil, append(slices.Clip(pods), idle))
	tableAt(t, store, b)
}

var barriers int

// A refused allocation and an annotation no allocator decodes are each
// reported once, on their pod, naming the device and its rule or the
// annotation's key: the builds that follow other pods' changes, and the
// kubelet's reads of the same pods, report nothing more; a right pod is
// never reported.
func TestARefusalAndAnUndecodableAnnotationAreReportedOnceOnTheirPod(t *testing.T) {
	r := &reported{}
	store, b := startReporting(t, r)
	right := koordPod("uid-right", "right", gpuA)
	forged := koordPod("uid-forged", "forged", gpuB)
	forged.Spec.SchedulerName = "default-scheduler"
	broken := koordPod("uid-broken", "broken", gpuC)
	broken.Annotations = map[string]string{koordKey: "{not json"}
	pods := []model.KubeletPod{right, forged, broken}
	observe(t, store, b, pods)

	got := r.all()
	if len(got) != 2 {
		t.Fatalf("reported %d Events, want 2: %q", len(got), got)
	}
	var refused, undecodable string
	for _, e := range got {
		switch {
		case strings.HasPrefix(e, "uid-forged "+report.ReasonAllocationRefused+" "):
			refused = e
		case strings.HasPrefix(e, "uid-broken "+report.ReasonAnnotationUndecodable+" "):
			undecodable = e
		}
	}
	if !strings.Contains(refused, gpuB) || !strings.Contains(refused, trust.ReasonWrongScheduler) {
		t.Errorf("the refusal reported as %q, want it on uid-forged naming %s and the rule %s", refused, gpuB, trust.ReasonWrongScheduler)
	}
	if !strings.Contains(undecodable, "Decode "+koordKey+": annotation "+koordKey+" could not be decoded") {
		t.Errorf("the undecodable annotation reported as %q, want it on uid-broken naming %s", undecodable, koordKey)
	}

	// The kubelet reads the same pods again and again, another pod comes:
	// builds follow, nothing is reported again.
	for range 5 {
		observe(t, store, b, pods)
	}
	idle := model.KubeletPod{UID: "uid-idle", Namespace: "ml", Name: "idle", Phase: "Running",
		Spec: model.PodSpec{SchedulerName: "default-scheduler", Containers: []model.ContainerSpec{{Name: "app", Kind: model.KindApp}}}}
	pods = append(pods, idle)
	observe(t, store, b, pods)
	if again := r.all(); len(again) != len(got) {
		t.Errorf("reported %d Events after rebuilds that changed no decision, want %d: %q", len(again), len(got), again[len(got):])
	}

	// The broken annotation changes into another broken one: news.
	broken.Annotations = map[string]string{koordKey: `{"gpu": 7}`}
	pods[2] = broken
	observe(t, store, b, pods)
	if again := r.all(); len(again) != len(got)+1 || !strings.HasPrefix(again[len(got)], "uid-broken "+report.ReasonAnnotationUndecodable) {
		t.Errorf("after the annotation changed, reported %q, want one more AnnotationUndecodable on uid-broken", again[len(got):])
	}
}
