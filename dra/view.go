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
	// Pod returns a pod's extended resource claim (nil when it has none)
	// from the kubelet's pod sources; ok false when the pod is not known.
	Pod func(ctx context.Context, key model.PodKey) (claim *model.ExtendedResourceClaim, ok bool, err error)
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
	// OnUnfolded counts a device left under dynamic_resources, once per
	// pod, device and reason.
	OnUnfolded func(reason string)
	Log        logrus.FieldLogger
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
	facts := v.facts()
	seen := make(map[model.PodKey]bool, len(pods))
	for _, p := range pods {
		seen[model.PodKey{Namespace: p.GetNamespace(), Name: p.GetName()}] = true
		v.fold(ctx, p, facts)
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
	v.fold(ctx, pod, v.facts())
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

// fold folds pod, which has nothing to fold unless the kubelet lists a
// claim for it.
func (v *View) fold(ctx context.Context, pod *v1.PodResources, f Facts) {
	claims := claimNames(pod)
	if claims == "" {
		return
	}
	key := model.PodKey{Namespace: pod.GetNamespace(), Name: pod.GetName()}
	e, ok := v.entry(ctx, key, claims)
	if !ok {
		return
	}
	unfolded := FoldPod(pod, e.facts, f)
	v.report(key, e, unfolded)
}

// entry returns the pod's facts, looking them up when the pod is new or
// its claims changed, and reading its claim's allocation when it is
// needed and not known.
func (v *View) entry(ctx context.Context, key model.PodKey, claims string) (podEntry, bool) {
	v.mu.Lock()
	cur := v.pods[key]
	v.mu.Unlock()
	var e podEntry // a copy: Gets and Lists fold at once
	if cur != nil && cur.claims == claims {
		e = *cur
	} else {
		claim, ok, err := v.opts.Pod(ctx, key)
		if err != nil || !ok {
			v.log.WithError(err).WithField("pod", key).Debug("DRA: the pod's extended resource claim is not known yet; its devices stay under dynamic_resources")
			return podEntry{}, false
		}
		e = podEntry{claims: claims, facts: PodFacts{Claim: claim}, reported: map[Unfolded]bool{}}
	}
	if e.facts.Allocation == nil && needsAllocation(e.facts.Claim) && v.opts.Allocation != nil && time.Since(e.readAt) >= retryClaim {
		alloc, err := v.opts.Allocation(ctx, key.Namespace, e.facts.Claim.ClaimName)
		if err != nil {
			v.log.WithError(err).WithField("pod", key).Warn("DRA: reading the pod's extended resource claim failed; its devices stay under dynamic_resources until it is read")
			e.readAt = time.Now()
		}
		e.facts.Allocation = alloc
	}
	v.mu.Lock()
	v.pods[key] = &e
	v.mu.Unlock()
	return e, true
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
		if v.opts.OnUnfolded != nil {
			v.opts.OnUnfolded(u.Reason)
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
