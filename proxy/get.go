package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/proxy/resolve"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
	"github.com/podres-proxy/podres-proxy/proxy/upstream"
)

// Get returns the pod as the kubelet's Get would, with the devices its plan
// adds, spelled for v's view. Its errors are the kubelet's: its codes and
// messages pass through, and a pod its List does not have fails as its Get
// does ("pod %s in namespace %s not found", Unknown), before any error of
// the proxy's own. Those are Unavailable when the pod's devices are unknown
// and /pods cannot be read (resolve.Query.Plans), the view's refusal of the
// pod's devices (merge.Refusal), and the kubelet's rate-limit error for a
// call beyond the limit that no shared call answers. It never calls the
// kubelet's Get: concurrent Gets share one kubelet List (upstream.Shared),
// so that a burst of pods being created, each asking for its own (Multus,
// a Kata shim per pod), costs one or two kubelet calls and is not refused.
func (v *v1Server) Get(ctx context.Context, req *v1.GetPodResourcesRequest) (resp *v1.GetPodResourcesResponse, err error) {
	arrived := limits.Arrived(ctx)
	defer func() { v.s.counted(ctx, "v1", "Get", v.v, err) }()
	key := model.PodKey{Namespace: req.GetPodNamespace(), Name: req.GetPodName()}
	// The kubelet's codes and its "not found" win over the proxy's own
	// errors (the table's, a read's), as when it is asked first.
	q, ownErr := v.s.resolver.Query(ctx)
	var found []*plans.Plan
	if ownErr == nil && v.readFirst(ctx, q, key) {
		found, ownErr = q.Plans(ctx, []model.PodKey{key}, arrived, v.v.name)
	}
	pods, err := shared(ctx, v.s.getV1)
	if err != nil {
		return nil, err // the kubelet's codes and messages pass through
	}
	seg, ok := pods[key]
	if !ok {
		// The kubelet's own error, a plain one, which gRPC sends as
		// Unknown; it wins over a failed read, as the kubelet would say it.
		return nil, fmt.Errorf("pod %s in namespace %s not found", key.Name, key.Namespace)
	}
	if ownErr != nil {
		v.s.log.WithError(ownErr).Warn("Get answered with an error")
		return nil, ownErr
	}
	pod := &v1.PodResources{}
	if err := proto.Unmarshal(seg, pod); err != nil {
		return nil, reuse.ErrNotAPod(err)
	}
	if found == nil {
		if found, err = q.Plans(ctx, []model.PodKey{key}, arrived, v.v.name); err != nil {
			v.s.log.WithError(err).Warn("Get answered with an error")
			return nil, err
		}
	}
	if err = merge.Refusal(found[0], v.v.name, key); err != nil {
		v.s.log.WithError(err).WithFields(logrus.Fields{"pod": key.Namespace + "/" + key.Name, "view": v.v.name}).
			Warn("Get refused: the view cannot answer this pod's devices")
		return nil, err
	}
	merge.Pod(pod, found[0], q.Table().Inventory(), v.v.name)
	if v.v.name == merge.Legacy {
		v.s.p.Fold.FoldPod(ctx, pod)
	}
	return &v1.GetPodResourcesResponse{PodResources: pod}, nil
}

// readFirst reports whether a Get of key reads /pods before its kubelet
// call rather than after: for a pod q does not know, without a watch (with
// one, a pod being created is known without a read), and not for a call
// beyond the rate limit, which may only share what others pay for
// (limits.RateLimit) and so must not cost a read either. Read first, the
// Gets of a burst line up behind at most two reads, and each read's Gets
// share the kubelet call made when it ends; the other way round, the short
// kubelet calls chain, one per wave of Gets arriving during a slow read.
func (v *v1Server) readFirst(ctx context.Context, q *resolve.Query, key model.PodKey) bool {
	if v.s.resolver.Watched() || limits.OverdraftOf(ctx) != nil {
		return false
	}
	_, known := q.PlanWithoutRead(key)
	return !known
}

// kubeletPods are the pods of a kubelet List answer, by namespace and name:
// each its segment of the answer, which every Get sharing the call reads.
type kubeletPods map[model.PodKey][]byte

// getV1Answer makes one shared kubelet List for Gets. Its answer is never
// reused for the next call's storage (unlike List's, s.listV1.last): the
// callers that shared it read their pods' segments after it ends, while the
// next call may already run.
func (s *Server) getV1Answer(ctx context.Context, _ time.Time) (kubeletPods, error) {
	kubelet, err := s.up.List(ctx, upstream.V1, nil)
	if err != nil {
		return nil, err
	}
	parts, err := reuse.Split(nil, kubelet)
	if err != nil {
		return nil, err
	}
	pods := make(kubeletPods, len(parts))
	for _, p := range parts {
		if p.Pod == nil {
			continue
		}
		key, err := reuse.PodKey(p.Pod)
		if err != nil {
			return nil, err
		}
		if _, dup := pods[key]; !dup { // the kubelet's Get finds the first
			pods[key] = p.Pod
		}
	}
	return pods, nil
}
