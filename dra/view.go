package dra

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
)

// Waits of the background reads (background.go): a failed read is tried
// again after retryFirst, then twice as long after each failure up to
// retryMax, so that an API server or kubelet that is away costs a few reads
// an hour per pod, not one per List; each read has readTimeout on top of
// its source's own.
const (
	retryFirst  = 10 * time.Second
	retryMax    = 5 * time.Minute
	readTimeout = 30 * time.Second
	// getWait bounds a Get's wait for its pod's lookup (FoldPod), well
	// within a request's deadline (15 s by default): a Get answers, with
	// what is known, even while the kubelet's /pods hangs.
	getWait = 5 * time.Second
)

// ViewOptions are the sources a View folds from.
type ViewOptions struct {
	// Pods returns the extended resource claims (nil for a pod that has
	// none) of the pods keys name, from the kubelet's pod sources, leaving
	// out pods they do not know. The View calls it in the background, for
	// the pods its answers met and it has no facts of, at most one call at
	// a time for all of them, so that a List of many new pods costs one
	// read of every pod, not one per pod.
	Pods func(ctx context.Context, keys []model.PodKey) (map[model.PodKey]*model.ExtendedResourceClaim, error)
	// Facts returns the node's devices and classes (resourceapi.Source).
	// It must not wait: every answer calls it.
	Facts func() Facts
	// Allocation reads a claim's allocation, in the background; nil reads
	// none, and claims serving several containers or resources are then
	// not folded.
	Allocation func(ctx context.Context, namespace, name string) (Allocation, error)
	// DriverResources fold a pod's own claims of these drivers (the
	// operator's --dra-resource).
	DriverResources map[string]string
	// Metrics counts a device left under dynamic_resources, once per pod,
	// device and reason; nil counts nothing.
	Metrics Metrics
	// Unfolded is told of a device left under dynamic_resources, once per
	// pod, device and reason, as Metrics counts it (an Event on the pod).
	// It must not wait: answers call it. Nil: nothing is told.
	Unfolded func(pod model.PodKey, u Unfolded)
	Log      logrus.FieldLogger
}

// Metrics is what the view reports (metrics.Metrics implements it).
type Metrics interface {
	DRAUnfolded(reason string)
}

// View is the legacy view's folding for the proxy: it looks up each pod's
// facts and folds them into its answer (FoldPod). It keeps what does not
// change during a pod's life: its extended resource claim and that claim's
// allocation. It is safe for concurrent use.
//
// No answer waits on the API server: the answers fold what the View
// already knows, and Run reads what they lacked in the background (a
// hanging API server would otherwise hold every socket's List, which the
// legacy view's is built with). Run must be running for anything to be
// folded; a Get that needs a lookup waits for it to start.
type View struct {
	opts ViewOptions
	log  logrus.FieldLogger

	mu   sync.Mutex
	pods map[model.PodKey]*podEntry
	// lookups are the pods whose facts the answers lacked, for Run's next
	// call of Pods; allocations are the pods whose claim's allocation is
	// to be read.
	lookups, allocations queue
	stopped              bool // Run has returned: no Get waits for a lookup
}

// podEntry is what a View keeps of one pod. Answers read it; only Run's
// loops write its facts.
type podEntry struct {
	// claims are the names of the claims the kubelet lists for the pod:
	// a pod recreated under its name has other ones (the scheduler and
	// claim templates generate them), so its facts are looked up again.
	claims   string
	facts    PodFacts
	reported map[Unfolded]bool
}

// NewView returns a view folding from opts' sources; Run reads them.
func NewView(opts ViewOptions) *View {
	return &View{
		opts:        opts,
		log:         cmp.Or[logrus.FieldLogger](opts.Log, logrus.StandardLogger()),
		pods:        map[model.PodKey]*podEntry{},
		lookups:     newQueue(),
		allocations: newQueue(),
	}
}

// FoldList folds every pod of a List answer with what the view knows, and
// forgets pods it no longer lists. It never waits: every view's List is
// built in one shared call, so a wait here would hold the default socket's
// answer too.
func (v *View) FoldList(_ context.Context, pods []*v1.PodResources) {
	todo, _ := v.known(pods)
	v.fold(todo)
	seen := make(map[model.PodKey]bool, len(pods))
	for _, p := range pods {
		seen[model.PodKey{Namespace: p.GetNamespace(), Name: p.GetName()}] = true
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	maps.DeleteFunc(v.pods, func(key model.PodKey, _ *podEntry) bool { return !seen[key] })
	maps.DeleteFunc(v.lookups.items, func(key model.PodKey, _ item) bool { return !seen[key] })
	maps.DeleteFunc(v.allocations.items, func(key model.PodKey, _ item) bool { return !seen[key] })
}

// FoldPod folds one pod (a Get answer). A pod the view has no facts of
// waits, within ctx, for Run's read of the pod sources (the kubelet, not
// the API server): nri-plugins asks Get once, when the container is
// created, and takes its topology hint from that one answer. The wait is
// at most getWait, and none while its lookup backs off after a failure; a
// claim's allocation is never waited for.
func (v *View) FoldPod(ctx context.Context, pod *v1.PodResources) {
	pods := []*v1.PodResources{pod}
	todo, wait := v.known(pods)
	if wait != nil {
		bound := time.NewTimer(getWait)
		select {
		case <-wait:
			todo, _ = v.known(pods)
		case <-bound.C:
		case <-ctx.Done():
		}
		bound.Stop()
	}
	v.fold(todo)
}

// Allocatable adds the node's devices of extended-resource classes and
// mapped drivers to a GetAllocatableResources answer.
func (v *View) Allocatable(resp *v1.AllocatableResourcesResponse) {
	resp.Devices = append(resp.Devices, Allocatable(v.facts(), resp.GetDevices())...)
}

func (v *View) facts() Facts {
	f := v.opts.Facts()
	f.DriverResources = v.opts.DriverResources
	return f
}

// knownPod is a pod of an answer and what the view knows of it.
type knownPod struct {
	pod   *v1.PodResources
	key   model.PodKey
	entry *podEntry
	facts PodFacts // entry's, when it was looked at
}

// known returns the pods the view has facts of; a pod has nothing to fold
// unless the kubelet lists a claim for it. The others are handed to Run,
// and wait, when not nil, is closed once they are looked up.
func (v *View) known(pods []*v1.PodResources) (todo []knownPod, wait <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, p := range pods {
		claims := claimNames(p)
		if claims == "" {
			continue
		}
		key := model.PodKey{Namespace: p.GetNamespace(), Name: p.GetName()}
		if e := v.pods[key]; e != nil && e.claims == claims {
			todo = append(todo, knownPod{p, key, e, e.facts})
			continue
		}
		v.log.WithField("pod", key).Debug("DRA: the pod's extended resource claim is not known yet; its devices stay under dynamic_resources until it is read")
		if v.lookups.ask(key, claims) && !v.stopped {
			wait = v.lookups.done
		}
	}
	return todo, wait
}

// fold folds the known pods and reports what stayed unfolded.
func (v *View) fold(todo []knownPod) {
	if len(todo) == 0 {
		return
	}
	f := v.facts()
	for _, t := range todo {
		v.report(t.key, t.entry, FoldPod(t.pod, t.facts, f))
	}
}

// report logs and counts each unfolded device once per pod. A device in no
// slice needs no read: the slices' watch brings the slice when its driver
// publishes it.
func (v *View) report(key model.PodKey, e *podEntry, unfolded []Unfolded) {
	v.mu.Lock()
	var fresh []Unfolded
	for _, u := range unfolded {
		if !e.reported[u] {
			e.reported[u] = true
			fresh = append(fresh, u)
		}
	}
	v.mu.Unlock()
	for _, u := range fresh {
		v.log.WithFields(logrus.Fields{"pod": key, "container": u.Container, "device": u.Device.String(), "reason": u.Reason}).
			Warn("DRA: a device of an extended resource stays under dynamic_resources only")
		if v.opts.Metrics != nil {
			v.opts.Metrics.DRAUnfolded(u.Reason)
		}
		if v.opts.Unfolded != nil {
			v.opts.Unfolded(key, u)
		}
	}
}

// needsAllocation reports whether claim serves several containers, or one
// container's several resources: only then does attributing its devices
// need its allocation.
func needsAllocation(claim *model.ExtendedResourceClaim) bool {
	if claim == nil || len(claim.Requests) < 2 {
		return false
	}
	first := claim.Requests[0]
	for _, r := range claim.Requests[1:] {
		if r.Container != first.Container || r.Resource != first.Resource {
			return true
		}
	}
	return false
}

// claimNames are the names of the claims the kubelet lists for pod,
// sorted and joined; "" when it lists none.
func claimNames(pod *v1.PodResources) string {
	var names []string
	for _, c := range pod.GetContainers() {
		for _, dr := range c.GetDynamicResources() {
			names = append(names, dr.GetClaimNamespace()+"/"+dr.GetClaimName())
		}
	}
	slices.Sort(names)
	return strings.Join(slices.Compact(names), ",")
}
