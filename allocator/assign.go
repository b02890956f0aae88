package allocator

import (
	"math"
	"slices"

	"github.com/podres-proxy/podres-proxy/model"
)

// Assignment is the devices each container is reported with: container name
// -> its devices, in the order of the devices given to Assign. Containers
// without devices are absent. The devices share their IDs and Minor with
// the input; treat them as read-only.
type Assignment map[string][]model.Device

// Assign attributes devices to the containers of spec by the policy in the
// package doc. ok is false when spec is nil (the pod spec was never seen)
// or has no app container (it cannot be a complete spec, and the policy's
// default container does not exist); the caller then uses its fallback.
func (s *Set) Assign(spec *model.PodSpec, devices []model.Device) (a Assignment, ok bool) {
	if spec == nil {
		return nil, false
	}
	firstApp := slices.IndexFunc(spec.Containers, func(c model.ContainerSpec) bool { return c.Kind == model.KindApp })
	if firstApp < 0 {
		return nil, false
	}

	given := make([][]int, len(spec.Containers)) // container position -> device indices
	type kind struct {
		allocator, typ, resource string
		counts                   bool
	}
	var kinds []kind // in order of first appearance, for a deterministic walk
	byKind := map[kind][]int{}
	for i, dev := range devices {
		if pos, ok := s.indexed(spec, dev); ok {
			if spec.Containers[pos].Kind != model.KindInit {
				given[pos] = append(given[pos], i)
			}
			continue
		}
		k := kind{dev.Allocator, dev.Type, dev.Resource, dev.CountsRequests}
		if _, seen := byKind[k]; !seen {
			kinds = append(kinds, k)
		}
		byKind[k] = append(byKind[k], i)
	}
	for _, k := range kinds {
		s.assignKind(spec, devices, byKind[k], firstApp, given)
	}

	byName := map[string][]int{}
	for pos, idxs := range given {
		if len(idxs) == 0 {
			continue
		}
		name := spec.Containers[pos].Name
		byName[name] = append(byName[name], idxs...)
	}
	a = Assignment{}
	for name, idxs := range byName {
		slices.Sort(idxs)
		idxs = slices.Compact(idxs) // only if a spec repeats a container name
		out := make([]model.Device, len(idxs))
		for j, i := range idxs {
			out[j] = devices[i]
		}
		a[name] = out
	}
	return a, true
}

// assignKind attributes the pod-level devices of one kind (idxs, in input
// order) and appends their indices to given.
func (s *Set) assignKind(spec *model.PodSpec, devices []model.Device, idxs []int, firstApp int, given [][]int) {
	type request struct {
		pos   int
		whole int64
		share bool
	}
	var requests []request
	if dec := s.byName[devices[idxs[0]].Allocator]; dec != nil {
		for pos, c := range spec.Containers {
			if c.Kind != model.KindSidecar && c.Kind != model.KindApp {
				continue // plain init containers are never reported by the kubelet
			}
			if whole, share := dec.Wants(devices[idxs[0]], c.Requests); whole > 0 || share {
				requests = append(requests, request{pos, whole, share})
			}
		}
	}
	switch len(requests) {
	case 0:
		given[firstApp] = append(given[firstApp], idxs...)
		return
	case 1:
		given[requests[0].pos] = append(given[requests[0].pos], idxs...)
		return
	}

	var sharers []int
	for _, r := range requests {
		if r.share {
			sharers = append(sharers, r.pos)
		}
	}
	toAll := func(positions []int, i int) {
		for _, pos := range positions {
			given[pos] = append(given[pos], i)
		}
	}
	var whole []int // devices handed out one container each
	for _, i := range idxs {
		if devices[i].Shared && len(sharers) > 0 {
			toAll(sharers, i)
			continue
		}
		whole = append(whole, i)
	}
	next := 0
	for _, r := range requests {
		for n := int64(0); n < r.whole && next < len(whole); n++ {
			given[r.pos] = append(given[r.pos], whole[next])
			next++
		}
	}
	for _, i := range whole[next:] {
		if len(sharers) > 0 {
			toAll(sharers, i)
		} else {
			given[requests[len(requests)-1].pos] = append(given[requests[len(requests)-1].pos], i)
		}
	}
}

// indexed returns the spec position of a per-container device: the
// ContainerIndex-th container of its ContainerScope. ok is false for a
// pod-level device and for an index outside the scope, which then follows
// the pod-level policy.
func (s *Set) indexed(spec *model.PodSpec, dev model.Device) (pos int, ok bool) {
	if dev.Container != "" {
		// Named by the allocator; a name the spec lacks falls through to
		// the pod-level policy, like an index out of range.
		pos = slices.IndexFunc(spec.Containers, func(c model.ContainerSpec) bool { return c.Name == dev.Container })
		return pos, pos >= 0
	}
	if dev.ContainerIndex == nil || *dev.ContainerIndex < 0 {
		return 0, false
	}
	positions := s.scope(spec, dev)
	if *dev.ContainerIndex >= len(positions) {
		return 0, false
	}
	return positions[*dev.ContainerIndex], true
}

// scope returns the spec positions of the containers dev's ContainerScope
// covers, in spec order. A device without a scope, or with one this build
// does not know (a record written by a newer daemon), covers nothing, so it
// follows the pod-level policy.
func (s *Set) scope(spec *model.PodSpec, dev model.Device) []int {
	var positions []int
	for pos, c := range spec.Containers {
		switch dev.ContainerScope {
		case model.ScopeRequesting:
			if c.Kind != model.KindApp || !s.Requests(dev, c.Requests) {
				continue
			}
		case model.ScopeRequestingAll:
			if !s.Requests(dev, c.Requests) {
				continue
			}
		default:
			return nil
		}
		positions = append(positions, pos)
	}
	return positions
}

// Requests reports whether a container with these requests asks for some of
// dev, as dev's allocator judges it; false for an allocator the set does not
// know.
func (s *Set) Requests(dev model.Device, requests map[string]string) bool {
	dec := s.byName[dev.Allocator]
	if dec == nil {
		return false
	}
	whole, share := dec.Wants(dev, requests)
	return whole > 0 || share
}

// Asker is implemented by formats whose requests can ask for shares of
// several devices, which Wants cannot say: Koordinator's
// koordinator.sh/gpu.shared: 2 asks a share of each of two GPUs.
type Asker interface {
	// Asks returns how many devices of dev's kind a container with these
	// requests asks for, whole or a share of each; 0 for none.
	Asks(dev model.Device, requests map[string]string) int64
}

// Asks returns how many devices of dev's kind the pod's containers ask for
// in all, the number ResourceQuota and the scheduler counted: each sidecar
// and app container the whole devices it asks for, or one for a share of a
// device (a share is part of one device) unless its format is an Asker;
// when none of them asks, the most
// any one plain init container asks, since init containers run one after
// another and hand their devices on. 0 when no container asks for dev or
// its allocator is not in the set. It counts devices as Assign hands them
// out (one model.Device each), not ids: one Koordinator RDMA allocation of
// a NIC can name several VFs.
func (s *Set) Asks(spec *model.PodSpec, dev model.Device) int64 {
	dec := s.byName[dev.Allocator]
	if dec == nil || spec == nil {
		return 0
	}
	asks := func(requests map[string]string) int64 {
		whole, share := dec.Wants(dev, requests)
		if share {
			whole = max(whole, 1)
		}
		return whole
	}
	if a, ok := dec.(Asker); ok {
		asks = func(requests map[string]string) int64 { return a.Asks(dev, requests) }
	}
	var running, init int64
	for _, c := range spec.Containers {
		n := asks(c.Requests)
		if c.Kind == model.KindInit {
			init = max(init, n)
		} else {
			running = addCapped(running, n)
		}
	}
	if running > 0 {
		return running
	}
	return init
}

// addCapped returns a+b for non-negative counts, math.MaxInt64 where the sum
// would not fit: each request may be as large as an int64 (parse.Quantity),
// and a sum that wrapped would turn a pod asking for everything into one
// asking for nothing, or for a few.
func addCapped(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}
