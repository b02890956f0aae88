package dra

import (
	"context"
	"time"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/model"
)

// PodWatch is the kubelet's Pods API watch as the View reads it.
type PodWatch interface {
	Synced() bool
	Lookup(namespace, name string) (model.KubeletPod, bool)
}

// PodClaims returns the View's source of pods' extended resource claims
// (ViewOptions.Pods): the watch's pod when it is synced and has the claim,
// else a read of /pods (readPods). watch may be nil.
//
// The kubelet's Pods API sends each pod with the status its status manager
// keeps, and that status never holds status.extendedResourceClaimStatus:
// the scheduler writes it, and the kubelet merges it back only into what it
// patches to the API server (kubelet v1.36.3, pkg/kubelet/status: "not
// owned and not modified by kubelet"). /pods sends the API server's pod,
// which has it. The View asks only for pods the kubelet lists DRA claims
// for and keeps what it was told, so this costs one /pods read per such
// pod's first answer, shared by the pods the answers met meanwhile, never
// one per call, and made in the background (View.Run).
func PodClaims(watch PodWatch, readPods kubeletpods.Fetch) func(context.Context, []model.PodKey) (map[model.PodKey]*model.ExtendedResourceClaim, error) {
	return func(ctx context.Context, keys []model.PodKey) (map[model.PodKey]*model.ExtendedResourceClaim, error) {
		out := make(map[model.PodKey]*model.ExtendedResourceClaim, len(keys))
		var missing []model.PodKey
		synced := watch != nil && watch.Synced()
		for _, k := range keys {
			if synced {
				if p, ok := watch.Lookup(k.Namespace, k.Name); ok && p.ExtendedResourceClaim != nil {
					out[k] = p.ExtendedResourceClaim
					continue
				}
			}
			missing = append(missing, k)
		}
		if len(missing) == 0 {
			return out, nil
		}
		started := time.Now()
		all, err := readPods(ctx)
		if err != nil {
			return out, err
		}
		list := kubeletpods.NewPodList(started, all)
		for _, k := range missing {
			if p, ok := list.Lookup(k); ok {
				out[k] = p.ExtendedResourceClaim
			}
		}
		return out, nil
	}
}
