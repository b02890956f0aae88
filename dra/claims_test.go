package dra

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
)

// watchOf is a synced Pods API watch of pods.
type watchOf map[model.PodKey]model.KubeletPod

func (watchOf) Synced() bool { return true }
func (w watchOf) Lookup(namespace, name string) (model.KubeletPod, bool) {
	p, ok := w[model.PodKey{Namespace: namespace, Name: name}]
	return p, ok
}

// The kubelet's Pods API sends pods with its own status, which lacks
// status.extendedResourceClaimStatus (kubelet v1.36.3): a pod the watch has
// without a claim is read from /pods, which has it, and a pod the watch has
// with one is not.
func TestPodClaimsFindsExtendedResourceClaimsTheWatchLacksInPods(t *testing.T) {
	claimOf := func(name string) *model.ExtendedResourceClaim {
		return &model.ExtendedResourceClaim{ClaimName: name, Requests: []model.ExtendedResourceRequest{{Container: "app", Resource: "example.com/gpu", Request: "container-1-request-0"}}}
	}
	gpuPod, watched, plain := model.PodKey{Namespace: "ml", Name: "gpu"}, model.PodKey{Namespace: "ml", Name: "watched"}, model.PodKey{Namespace: "ml", Name: "plain"}
	watch := watchOf{
		gpuPod:  {Namespace: "ml", Name: "gpu", UID: "u1"}, // as the Pods API sends it: no claim
		watched: {Namespace: "ml", Name: "watched", UID: "u2", ExtendedResourceClaim: claimOf("watched-claim")},
		plain:   {Namespace: "ml", Name: "plain", UID: "u3"},
	}
	reads := 0
	fromPods := func(context.Context) ([]model.KubeletPod, error) {
		reads++
		return []model.KubeletPod{
			{Namespace: "ml", Name: "gpu", UID: "u1", ExtendedResourceClaim: claimOf("gpu-claim")},
			{Namespace: "ml", Name: "plain", UID: "u3"},
		}, nil
	}
	claims := PodClaims(watch, fromPods)

	got, err := claims(context.Background(), []model.PodKey{gpuPod, watched, plain})
	if err != nil {
		t.Fatal(err)
	}
	want := map[model.PodKey]*model.ExtendedResourceClaim{gpuPod: claimOf("gpu-claim"), watched: claimOf("watched-claim"), plain: nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("claims = %v, want %v", got, want)
	}
	if reads != 1 {
		t.Errorf("%d /pods reads for one lookup of three pods, want 1", reads)
	}

	reads = 0
	if _, err := claims(context.Background(), []model.PodKey{watched}); err != nil || reads != 0 {
		t.Errorf("a pod whose claim the watch has: %d /pods reads (%v), want none", reads, err)
	}

	// /pods down: the pods it should have told are left out (the view
	// asks again at its next answer), the error says why.
	down := PodClaims(watch, func(context.Context) ([]model.KubeletPod, error) { return nil, errors.New("503") })
	got, err = down(context.Background(), []model.PodKey{gpuPod, watched})
	if err == nil || !reflect.DeepEqual(got, map[model.PodKey]*model.ExtendedResourceClaim{watched: claimOf("watched-claim")}) {
		t.Errorf("with /pods down: %v, %v; want the watched pod's claim and an error", got, err)
	}
}
