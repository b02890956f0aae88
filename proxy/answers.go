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
// pod needed a kubelet read.
func (s *Server) splice(ctx context.Context, l *lister, v *view, kubelet upstream.Encoded, arrived time.Time, q *resolve.Query) ([]byte, error) {
	cache := &v.caches[l.index]
	tablePlan := q.TablePlan
	// The caches skip looking a pod up again in the table they last checked
	// it in, unless the pod logs directory says more than that table.
	t := q.Table()
	if !q.Fresh() {
		t = nil
	}

	// Nothing changed: one pass.
	if out, pods, ok := cache.Steady(kubelet, t, tablePlan); ok {
		if pods > 0 {
			s.p.Metrics.ListPods(pods, 0)
		}
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

	// The plans of the others, from t or after a /pods read.
	var need []int
	for i := range parts {
		if p := &parts[i]; p.Need {
			if p.Key.Name == "" {
				if p.Key, err = reuse.PodKey(p.Pod); err != nil {
					return nil, err
				}
			}
			need = append(need, i)
		}
	}
	if len(need) > 0 {
		keys := make([]model.PodKey, len(need))
		for j, i := range need {
			keys[j] = parts[i].Key
		}
		found, err := q.Plans(ctx, keys, arrived, v.name)
		if err != nil {
			return nil, err
		}
		inv := q.Table().Inventory()
		if l.alpha {
			inv = nil // v1alpha1 has no topology
		}
		for j, i := range need {
			if err := rebuild(&parts[i], found[j], inv, v.name); err != nil {
				return nil, err
			}
		}
		s.p.Metrics.ListPods(reused, pods-reused)
		cache.Store(parts, gen)
	} else if pods > 0 {
		s.p.Metrics.ListPods(reused, 0)
	}
	out := reuse.Splice(parts)
	cache.Drop(gen, pods)
	return out, nil
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
