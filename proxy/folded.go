package proxy

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Folder edits the answers of the legacy view (merge.Legacy): package dra
// folds DRA devices of extended resources into `devices` for consumers
// that read nothing else. Its methods edit the
// decoded answer in place and never fail it: what cannot be folded stays
// as the default socket answers it.
type Folder interface {
	// FoldList edits the pods of one List answer.
	FoldList(ctx context.Context, pods []*v1.PodResources)
	// FoldPod edits the pod of one Get answer.
	FoldPod(ctx context.Context, pod *v1.PodResources)
	// Allocatable edits one GetAllocatableResources answer.
	Allocatable(resp *v1.AllocatableResourcesResponse)
}

// foldList folds a legacy view's List answer: the topology view's answer,
// decoded, folded and encoded again. Only the legacy view pays for it.
func (s *Server) foldList(ctx context.Context, out []byte) ([]byte, error) {
	resp := &v1.ListPodResourcesResponse{}
	if err := proto.Unmarshal(out, resp); err != nil {
		return nil, fmt.Errorf("decoding the List answer to fold it: %w", err)
	}
	s.p.Fold.FoldList(ctx, resp.GetPodResources())
	return proto.Marshal(resp)
}
