package proxy

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/proxy/resolve"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
	"github.com/podres-proxy/podres-proxy/proxy/upstream"
)

// lister is one List method (v1 or v1alpha1): its kubelet calls, shared by
// concurrent callers, each answering every view (views.go).
type lister struct {
	api upstream.API
	// index is the method's cache in each view (view.caches).
	index int
	// alpha: the answer is v1alpha1's, whose pods decode as v1 pods and
	// are given their devices without topology, as the kubelet derives
	// them.
	alpha bool
	// last is the last kubelet answer, whose storage the next one reuses:
	// the shared calls run one at a time (upstream.Shared), and nothing
	// of an answer is kept once the proxy's are built.
	last   upstream.Encoded
	shared *upstream.Shared[viewAnswers]
}

// answer makes one shared List: the kubelet's answer, then the proxy's
// built from it for every view.
func (s *Server) answer(l *lister) func(ctx context.Context, started time.Time) (viewAnswers, error) {
	return func(ctx context.Context, started time.Time) (viewAnswers, error) {
		kubelet, err := s.up.List(ctx, l.api, l.last)
		if err != nil {
			return nil, err // the kubelet's codes and messages pass through
		}
		l.last = kubelet
		return s.eachView(func(v *view) ([]byte, error) {
			out, err := s.build(ctx, l, v, kubelet, started)
			if err != nil {
				s.log.WithError(err).WithFields(logrus.Fields{"method": l.api.Name, "view": v.name}).Warn("List answered with an error")
			}
			return out, err
		}), nil
	}
}

// build makes a view's List answer from the kubelet's: each pod's segment
// as the kubelet sent it, or rebuilt with its plan, reusing what it can per
// pod (package reuse). arrived is when the query arrived: pods the plans
// cannot answer wait for a /pods read started after it.
func (s *Server) build(ctx context.Context, l *lister, v *view, kubelet upstream.Encoded, arrived time.Time) ([]byte, error) {
	q, err := s.resolver.Query(ctx)
	if err != nil {
		return nil, err
	}
	out, err := s.splice(ctx, l, v, kubelet, arrived, q)
	t := q.Table()
	switch {
	case err != nil:
		return nil, err
	case v.name == merge.DCGM:
		return merge.OrderForDCGM(out, t)
	case v.name == merge.Legacy && !l.alpha: // v1alpha1 has no dynamic_resources
		return s.foldList(ctx, out)
	}
	return out, nil
}

// splice builds the answer from q, whose table becomes a newer one when a
// pod needed a kubelet read. It holds the I/O of a List's build (the plans
// of the pods not reused, which may wait for a /pods read, and the
// metrics); what it decides is decided by the functions below it.
func (s *Server) splice(ctx context.Context, l *lister, v *view, kubelet upstream.Encoded, arrived time.Time, q *resolve.Query) ([]byte, error) {
	cache := &v.caches[l.index]
	t := cacheTable(q.Table(), q.Fresh())
	tablePlan := q.TablePlan

	// Nothing changed: one pass.
	if out, pods, ok := cache.Steady(kubelet, t, tablePlan); ok {
		s.countListPods(pods, pods, 0)
		if t == nil {
			q.Checked() // every pod was looked up with the directory's names
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
	gen, pods, reused := cache.Reuse(parts, t, tablePlan)
	need, keys, err := toLookUp(parts)
	if err != nil {
		return nil, err
	}
	if len(need) > 0 {
		found, err := q.Plans(ctx, keys, arrived, v.name)
		if err != nil {
			return nil, err
		}
		if err := rebuildAll(parts, need, found, topology(q.Table(), l.alpha), v.name); err != nil {
			return nil, err
		}
		cache.Store(parts, gen)
	}
	s.countListPods(pods, reused, len(need))
	out := reuse.Splice(parts)
	cache.Drop(gen, pods)
	return out, nil
}

// countListPods counts an answer's pods in podres_proxy_list_pods_total
// (listPodsCounted).
func (s *Server) countListPods(pods, reused, lookedUp int) {
	if reused, rebuilt, ok := listPodsCounted(pods, reused, lookedUp); ok {
		s.p.Metrics.ListPods(reused, rebuilt)
	}
}

// cacheTable returns the table the answers' caches check a pod's output
// against: q's table while the pod logs directory says no more than it
// (resolve.Query.Fresh), and nil otherwise, so that every pod is looked up
// again, with the directory's names. A cache skips looking a pod up again
// in the table it last checked it in.
func cacheTable(t *plans.Table, fresh bool) *plans.Table {
	if !fresh {
		return nil
	}
	return t
}

// toLookUp returns the pods of parts that have no reused output (marked
// Need by reuse.Cache.Reuse), by their index in parts, and their keys, in
// the same order: those whose plans the answer must look up, with a /pods
// read when the table cannot say. A pod's key is read from its segment
// when the cache did not know it; an error is a segment that does not
// parse.
func toLookUp(parts []reuse.Part) (need []int, keys []model.PodKey, err error) {
	for i := range parts {
		p := &parts[i]
		if !p.Need {
			continue
		}
		if p.Key.Name == "" {
			if p.Key, err = reuse.PodKey(p.Pod); err != nil {
				return nil, nil, err
			}
		}
		need = append(need, i)
		keys = append(keys, p.Key)
	}
	return need, keys, nil
}

// topology returns the inventory whose NUMA nodes the rebuilt pods'
// devices are given: t's, or none for a v1alpha1 answer, which has no
// topology.
func topology(t *plans.Table, alpha bool) *inventory.Snapshot {
	if alpha {
		return nil
	}
	return t.Inventory()
}

// listPodsCounted returns what an answer of this many pods, of which
// reused were reused and lookedUp looked up again, adds to
// podres_proxy_list_pods_total: reused as reused, and the rest as rebuilt
// when any was looked up; false when it adds nothing (no pod).
func listPodsCounted(pods, reused, lookedUp int) (countReused, countRebuilt int, ok bool) {
	switch {
	case lookedUp > 0:
		return reused, pods - reused, true
	case pods > 0:
		return reused, 0, true
	}
	return 0, 0, false
}

// rebuildAll sets the output of each pod of parts at need to its segment
// rebuilt with its plan (found, in need's order), its devices given inv's
// topology, for view v.
func rebuildAll(parts []reuse.Part, need []int, found []*plans.Plan, inv *inventory.Snapshot, v merge.View) error {
	for j, i := range need {
		if err := rebuild(&parts[i], found[j], inv, v); err != nil {
			return err
		}
	}
	return nil
}

// rebuild sets a pod's output: the kubelet's segment itself when there is
// nothing to add, so a pod without devices is never decoded.
func rebuild(p *reuse.Part, pl *plans.Plan, inv *inventory.Snapshot, v merge.View) error {
	p.Plan = pl
	if pl == nil {
		p.Out, p.Same = p.Pod, true
		return nil
	}
	var pod v1.PodResources
	if err := proto.Unmarshal(p.Pod, &pod); err != nil {
		return reuse.ErrNotAPod(err)
	}
	merge.Pod(&pod, pl, inv, v)
	out, err := proto.Marshal(&pod)
	p.Out = out
	return err
}
