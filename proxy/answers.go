package proxy

import (
	"context"
	"time"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
)

// listAnswer is the List path: the kubelet's answer, split into pods
// (package reuse explains how answers are reused per pod), each pod reused
// or rebuilt with the devices its plan gives it.

// rebuildFunc decodes one pod segment, adds the plan's devices and encodes it.
type rebuildFunc func(seg []byte, p merge.Plan) ([]byte, error)

// listAnswer builds the proxy's List answer from the kubelet's Encoded one
// (package reuse explains the reuse). arrived is when the query
// arrived: pods unknown to the store wait for a /pods read started after it.
func (s *Server) listAnswer(ctx context.Context, cache *reuse.Cache, kubelet reuse.Encoded, arrived time.Time, inv *inventory.Snapshot, rebuild rebuildFunc) ([]byte, error) {
	// Read before looking up records, so that a change made meanwhile
	// leaves entries that are checked again next time.
	version := s.p.Store.Version()

	// Nothing changed: one pass.
	if out, pods, ok := cache.Steady(kubelet, inv, version, s.p.Store.Current); ok {
		if pods > 0 {
			s.p.Metrics.ListPods(pods, 0)
		}
		return out, nil
	}

	buf := reuse.PartsPool.Get().(*[]reuse.Part)
	defer func() {
		clear(*buf) // keep no answer alive through the pool
		reuse.PartsPool.Put(buf)
	}()
	parts, err := reuse.Split((*buf)[:0], kubelet)
	*buf = parts
	if err != nil {
		return nil, err
	}

	// Reuse what can be reused.
	gen, pods, reused := cache.Reuse(parts, inv, version, s.p.Store.Current)

	// Rebuild the others, each pod alone.
	var read []int // pods whose devices need a /pods read
	for i := range parts {
		p := &parts[i]
		if !p.Need {
			continue
		}
		if p.Key.Name == "" {
			if p.Key, err = reuse.PodKey(p.Pod); err != nil {
				return nil, err
			}
		}
		rec, ok := s.p.Store.Current(p.Key)
		if !ok || (len(rec.Devices) > 0 && !s.resolver.Vettable(rec)) {
			read = append(read, i)
			continue
		}
		p.Rec = rec
		if err := rebuildPart(p, rebuild, s.resolver.PlanFor(rec, inv)); err != nil {
			return nil, err
		}
	}
	if len(read) > 0 {
		keys := make([]model.PodKey, len(read))
		for j, i := range read {
			keys[j] = parts[i].Key
		}
		plans, _, err := s.resolver.Plans(ctx, keys, arrived, inv)
		if err != nil {
			return nil, err
		}
		for j, i := range read {
			if err := rebuildPart(&parts[i], rebuild, plans[j]); err != nil {
				return nil, err
			}
		}
	}
	if rebuilt := pods - reused; rebuilt > 0 || reused > 0 {
		s.p.Metrics.ListPods(reused, rebuilt)
	}

	out := reuse.Splice(parts)
	if pods > reused {
		cache.Store(parts, inv, version, gen, s.resolver.DependsOnOthers)
	}
	cache.Drop(gen, pods)
	return out, nil
}

// rebuildPart sets a pod's output: the kubelet's segment itself when there is
// nothing to add, so a pod without devices is never decoded.
func rebuildPart(p *reuse.Part, rebuild rebuildFunc, pl merge.Plan) (err error) {
	if pl.Empty() {
		p.Out, p.Same = p.Pod, true
		return nil
	}
	p.Out, err = rebuild(p.Pod, pl)
	return err
}
