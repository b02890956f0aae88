package dra

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
)

// retryClaim is how long a claim whose allocation could not be read waits
// before the next read, so that an API server that is away costs one
// failed read per pod and interval, not one per List.
const retryClaim = 10 * time.Second

// ViewOptions are the sources a View folds from.
type ViewOptions struct {
	// Pods returns the extended resource claims (nil for a pod that has
	// none) of the pods keys name, from the kubelet's pod sources, leaving
	// out pods they do not know. A View calls it once per answer, for the
	// pods it has no facts of, so that a List of many new pods costs one
	// read of every pod, not one per pod.
	Pods func(ctx context.Context, keys []model.PodKey) (map[model.PodKey]*model.ExtendedResourceClaim, error)
	// Facts returns the node's devices and classes (resourceapi.Source).
	Facts func() Facts
	// Allocation reads a claim's allocation; nil reads none, and claims
	// serving several containers or resources are then not folded.
	Allocation func(ctx context.Context, namespace, name string) (Allocation, error)
	// Refresh asks Facts' source to read the slices again: a device the
	// kubelet reported is in none. Nil: never.
	Refresh func()
	// DriverResources fold a pod's own claims of these drivers (the
	// operator's --dra-resource).
	DriverResources map[string]string
	// Metrics counts a device left under dynamic_resources, once per pod,
	// device and reason; nil counts nothing.
	Metrics Metrics
	Log     logrus.FieldLogger
}

// Metrics is what the view reports (metrics.Metrics implements it).
type Metrics interface {
	DRAUnfolded(reason string)
}

// View is the legacy view's folding for the proxy: it looks up each pod's
// facts and folds them into its answer (FoldPod). It keeps what does not
// change during a pod's life: its extended resource claim and that claim's
// allocation. It is safe for concurrent use.
type View struct {
	opts ViewOptions
	log  logrus.FieldLogger

	mu   sync.Mutex
	pods map[model.PodKey]*podEntry
}

// podEntry is what a View keeps of one pod.
type podEntry struct {
	// claims are the names of the claims the kubelet lists for the pod:
	// a pod recreated under its name has other ones (the scheduler and
	// claim templates generate them), so its facts are looked up again.
	claims   string
	facts    PodFacts
	readAt   time.Time // last failed allocation read
	reported map[Unfolded]bool
}

// NewView returns a view folding from opts' sources.
func NewView(opts ViewOptions) *View {
	return &View{
		opts: opts,
		log:  cmp.Or[logrus.FieldLogger](opts.Log, logrus.StandardLogger()),
		pods: map[model.PodKey]*podEntry{},
	}
}

// FoldList folds every pod of a List answer, and forgets pods it no
// longer lists.
func (v *View) FoldList(ctx context.Context, pods []*v1.PodResources) {
	v.fold(ctx, pods)
	seen := make(map[model.PodKey]bool, len(pods))
	for _, p := range pods {
		seen[model.PodKey{Namespace: p.GetNamespace(), Name: p.GetName()}] = true
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for key := range v.pods {
		if !seen[key] {
			delete(v.pods, key)
		}
	}
}

// FoldPod folds one pod (a Get answer).
func (v *View) FoldPod(ctx context.Context, pod *v1.PodResources) {
	v.fold(ctx, []*v1.PodResources{pod})
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

// fold folds pods; a pod has nothing to fold unless the kubelet lists a
// claim for it.
func (v *View) fold(ctx context.Context, pods []*v1.PodResources) {
	type pending struct {
		pod    *v1.PodResources
		key    model.PodKey
		claims string
		entry  *podEntry // nil: not known, or its claims changed
	}
	var todo []pending
	var lookup []model.PodKey
	v.mu.Lock()
	for _, p := range pods {
		claims := claimNames(p)
		if claims == "" {
			continue
		}
		key := model.PodKey{Namespace: p.GetNamespace(), Name: p.GetName()}
		e := v.pods[key]
		if e != nil && e.claims != claims {
			e = nil
		}
		if e == nil {
			lookup = append(lookup, key)
		}
		todo = append(todo, pending{p, key, claims, e})
	}
	v.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	var found map[model.PodKey]*model.ExtendedResourceClaim
	if len(lookup) > 0 {
		var err error
		if found, err = v.opts.Pods(ctx, lookup); err != nil {
			v.log.WithError(err).WithField("pods", len(lookup)).Warn("DRA: reading the pods' extended resource claims failed; their devices stay under dynamic_resources")
		}
	}
	f := v.facts()
	for _, t := range todo {
		var e podEntry // a copy: Gets and Lists fold at once
		if t.entry != nil {
			e = *t.entry
		} else {
			claim, ok := found[t.key]
			if !ok {
				v.log.WithField("pod", t.key).Debug("DRA: the pod's extended resource claim is not known yet; its devices stay under dynamic_resources")
				continue
			}
			e = podEntry{claims: t.claims, facts: PodFacts{Claim: claim}, reported: map[Unfolded]bool{}}
		}
		v.allocation(ctx, t.key, &e)
		v.mu.Lock()
		v.pods[t.key] = &e
		v.mu.Unlock()
		v.report(t.key, e, FoldPod(t.pod, e.facts, f))
	}
}

// allocation reads the claim's allocation into e when it is needed and not
// known, at most once per retryClaim after a failure.
func (v *View) allocation(ctx context.Context, key model.PodKey, e *podEntry) {
	if e.facts.Allocation != nil || !needsAllocation(e.facts.Claim) || v.opts.Allocation == nil || time.Since(e.readAt) < retryClaim {
		return
	}
	alloc, err := v.opts.Allocation(ctx, key.Namespace, e.facts.Claim.ClaimName)
	if err != nil {
		v.log.WithError(err).WithField("pod", key).Warn("DRA: reading the pod's extended resource claim failed; its devices stay under dynamic_resources until it is read")
		e.readAt = time.Now()
		return
	}
	e.facts.Allocation = alloc
}

// report logs and counts each unfolded device once per pod, and asks for
// the slices again when one is missing.
func (v *View) report(key model.PodKey, e podEntry, unfolded []Unfolded) {
	refresh := false
	v.mu.Lock()
	var fresh []Unfolded
	for _, u := range unfolded {
		if !e.reported[u] {
			e.reported[u] = true
			fresh = append(fresh, u)
		}
		refresh = refresh || u.Reason == ReasonNoSlice
	}
	v.mu.Unlock()
	for _, u := range fresh {
		v.log.WithFields(logrus.Fields{"pod": key, "container": u.Container, "device": u.Device.String(), "reason": u.Reason}).
			Warn("DRA: a device of an extended resource stays under dynamic_resources only")
		if v.opts.Metrics != nil {
			v.opts.Metrics.DRAUnfolded(u.Reason)
		}
	}
	if refresh && v.opts.Refresh != nil {
		v.opts.Refresh()
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
