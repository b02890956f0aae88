package podsapi

import (
	"context"

	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/model"
)

// Source names, as Or tells onRead.
const (
	SourcePodsAPI = "pods-api"
	SourcePods    = "pods"
)

// Or returns a kubeletpods.Fetch that reads the kubelet's pods with
// ListPods while the watch is synced, and with fallback (the kubelet's
// /pods) while it is not (the kubelet's PodsAPI gate is off, or the kubelet
// is restarting) or when ListPods fails. The Pods API costs no token, TLS
// or JSON, and no tenant's annotations can fail it for everyone; /pods
// stays the way to learn pods on kubelets without it. onRead, when set, is
// told which source gave each successful read, for a metric.
func (s *Source) Or(fallback kubeletpods.Fetch, onRead func(source string)) kubeletpods.Fetch {
	return func(ctx context.Context) ([]model.KubeletPod, error) {
		if s.Synced() {
			pods, err := s.Pods(ctx)
			if err == nil {
				if onRead != nil {
					onRead(SourcePodsAPI)
				}
				return pods, nil
			}
			if ctx.Err() != nil {
				return nil, err
			}
			s.log.WithError(err).Debug("Kubelet Pods API: ListPods failed; reading /pods instead")
		}
		pods, err := fallback(ctx)
		if err == nil && onRead != nil {
			onRead(SourcePods)
		}
		return pods, err
	}
}
