package dra

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
)

// fakeSources are a View's sources: the pods' claims as the pod sources
// know them, the node's facts, and claims' allocations; each counts its
// reads.
type fakeSources struct {
	claims      map[model.PodKey]*model.ExtendedResourceClaim
	allocations map[string]Allocation
	allocErr    error
	podReads    int
	allocReads  int
	refreshes   int
	unfolded    []string
}

// DRAUnfolded records what the view counts (Metrics).
func (s *fakeSources) DRAUnfolded(reason string) { s.unfolded = append(s.unfolded, reason) }

func (s *fakeSources) view() *View {
	return NewView(ViewOptions{
		Pods: func(_ context.Context, keys []model.PodKey) (map[model.PodKey]*model.ExtendedResourceClaim, error) {
			s.podReads++
			out := map[model.PodKey]*model.ExtendedResourceClaim{}
			for _, k := range keys {
				if c, ok := s.claims[k]; ok {
					out[k] = c
				}
			}
			return out, nil
		},
		Facts: func() Facts { return node },
		Allocation: func(_ context.Context, ns, name string) (Allocation, error) {
			s.allocReads++
			if s.allocErr != nil {
				return nil, s.allocErr
			}
			return s.allocations[ns+"/"+name], nil
		},
		Refresh: func() { s.refreshes++ },
		Metrics: s,
	})
}

func twoContainerPod() *v1.PodResources {
	all := []DeviceRef{ref(gpuDriver, "gpu-0"), ref(gpuDriver, "gpu-1")}
	return pod("trainer", container("main", claimed(claim, all...)), container("helper", claimed(claim, all...)))
}

var twoContainerClaim = &model.ExtendedResourceClaim{ClaimName: claim, Requests: []model.ExtendedResourceRequest{
	mapping("main", gpu, "r0"), mapping("helper", gpu, "r1"),
}}

// A claim serving two containers is split by its allocation, read once
// for the pod's life; the pods' facts are read once too, in one read for
// all the new pods of a List, and again only for a pod recreated under the
// same name (other claim names).
func TestTheViewReadsEachPodsFactsOnce(t *testing.T) {
	s := &fakeSources{
		claims:      map[model.PodKey]*model.ExtendedResourceClaim{{Namespace: "ml", Name: "trainer"}: twoContainerClaim},
		allocations: map[string]Allocation{"ml/" + claim: {"r0": {ref(gpuDriver, "gpu-0")}, "r1": {ref(gpuDriver, "gpu-1")}}},
	}
	v := s.view()
	want := pod("trainer",
		&v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)}},
		&v1.ContainerResources{Name: "helper", Devices: []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)}},
	)
	s.claims[model.PodKey{Namespace: "ml", Name: "other"}] = &model.ExtendedResourceClaim{ClaimName: "other-claim", Requests: []model.ExtendedResourceRequest{mapping("main", nic, "r")}}
	for range 3 {
		p := twoContainerPod()
		other := pod("other", container("main", claimed("other-claim", ref(nicDriver, "vf-1"))))
		v.FoldList(t.Context(), []*v1.PodResources{p, pod("plain", container("main")), other})
		wantPod(t, p, want)
		wantPod(t, other, pod("other", &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(nic, "0000:3b:02.1")}}))
	}
	if s.podReads != 1 || s.allocReads != 1 {
		t.Errorf("3 Lists read the pod %d times and its claim %d times, want once each", s.podReads, s.allocReads)
	}

	// Recreated: the scheduler made it a new claim, with another device.
	const newClaim = "trainer-extended-resources-zz9"
	s.claims[model.PodKey{Namespace: "ml", Name: "trainer"}] = &model.ExtendedResourceClaim{ClaimName: newClaim, Requests: []model.ExtendedResourceRequest{mapping("main", nic, "r0")}}
	p := pod("trainer", container("main", claimed(newClaim, ref(nicDriver, "vf-0"))))
	v.FoldPod(t.Context(), p)
	wantPod(t, p, pod("trainer", &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(nic, "0000:3b:02.0", 1)}}))
	if s.podReads != 2 {
		t.Errorf("the recreated pod's facts were read %d times in all, want 2", s.podReads)
	}
}

// When the claim cannot be read (the API server is away, RBAC missing)
// the devices stay under dynamic_resources, counted once, not per List.
func TestAnUnreadableClaimLeavesTheKubeletsAnswer(t *testing.T) {
	s := &fakeSources{
		claims:   map[model.PodKey]*model.ExtendedResourceClaim{{Namespace: "ml", Name: "trainer"}: twoContainerClaim},
		allocErr: errors.New("503 Service Unavailable"),
	}
	v := s.view()
	for range 2 {
		p := twoContainerPod()
		v.FoldList(t.Context(), []*v1.PodResources{p})
		wantPod(t, p, twoContainerPod())
	}
	if s.allocReads != 1 {
		t.Errorf("the claim was read %d times in 2 Lists, want 1 (retried after a while, not per List)", s.allocReads)
	}
	if len(s.unfolded) != 4 || s.unfolded[0] != ReasonUnattributed {
		t.Errorf("unfolded counted %v, want each of the 2 containers' 2 devices once", s.unfolded)
	}
}

// A pod the pod sources do not know yet is answered as the kubelet
// answers it; a device in no slice asks for the slices again.
func TestUnknownPodsAndDevicesAreAnsweredAsTheKubeletDoes(t *testing.T) {
	s := &fakeSources{claims: map[model.PodKey]*model.ExtendedResourceClaim{
		{Namespace: "ml", Name: "known"}: {ClaimName: claim, Requests: []model.ExtendedResourceRequest{mapping("main", gpu, "r")}},
	}}
	v := s.view()
	unknown := pod("unknown", container("main", claimed(claim, ref(gpuDriver, "gpu-0"))))
	known := pod("known", container("main", claimed(claim, ref(gpuDriver, "gpu-new"))))
	before := []*v1.PodResources{proto.Clone(unknown).(*v1.PodResources), proto.Clone(known).(*v1.PodResources)}
	v.FoldList(t.Context(), []*v1.PodResources{unknown, known})
	wantPod(t, unknown, before[0])
	wantPod(t, known, before[1])
	if s.refreshes != 1 || len(s.unfolded) != 1 || s.unfolded[0] != ReasonNoSlice {
		t.Errorf("refreshes %d, unfolded %v; want the slices read again for the missing device", s.refreshes, s.unfolded)
	}
}
