package dra

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// fakeSources are a View's sources: the pods' claims as the pod sources
// know them, the node's facts, and claims' allocations; each counts its
// reads. The view reads them in the background, hence the lock.
type fakeSources struct {
	mu          sync.Mutex
	claims      map[model.PodKey]*model.ExtendedResourceClaim
	allocations map[string]Allocation
	allocErr    error
	// hang, when not nil, holds every allocation read until it is closed
	// or the read's context ends: an API server that accepts and never
	// answers.
	hang       chan struct{}
	podReads   [][]model.PodKey // the keys of each read
	allocReads int
	unfolded   []string
	told       []string // "namespace/name container device reason" (ViewOptions.Unfolded)
}

// DRAUnfolded records what the view counts (Metrics).
func (s *fakeSources) DRAUnfolded(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unfolded = append(s.unfolded, reason)
}

// counts returns the reads and what was counted so far.
func (s *fakeSources) counts() (podReads, allocReads int, unfolded []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.podReads), s.allocReads, slices.Clone(s.unfolded)
}

// view returns a view of s whose background reads run until the test
// ends, and have stopped when it has.
func (s *fakeSources) view(t *testing.T) *View {
	v := NewView(ViewOptions{
		Pods: func(_ context.Context, keys []model.PodKey) (map[model.PodKey]*model.ExtendedResourceClaim, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.podReads = append(s.podReads, slices.Clone(keys))
			out := map[model.PodKey]*model.ExtendedResourceClaim{}
			for _, k := range keys {
				if c, ok := s.claims[k]; ok {
					out[k] = c
				}
			}
			return out, nil
		},
		Facts: func() Facts { return node },
		Allocation: func(ctx context.Context, ns, name string) (Allocation, error) {
			s.mu.Lock()
			s.allocReads++
			hang := s.hang
			s.mu.Unlock()
			if hang != nil {
				select {
				case <-hang:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.allocErr != nil {
				return nil, s.allocErr
			}
			return s.allocations[ns+"/"+name], nil
		},
		Metrics: s,
		Unfolded: func(key model.PodKey, u Unfolded) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.told = append(s.told, key.Namespace+"/"+key.Name+" "+u.Container+" "+u.Device.String()+" "+u.Reason)
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = v.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-stopped // no read outlives Run
	})
	return v
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
	v := s.view(t)
	want := pod("trainer",
		&v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)}},
		&v1.ContainerResources{Name: "helper", Devices: []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)}},
	)
	wantOther := pod("other", &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(nic, "0000:3b:02.1")}})
	s.claims[model.PodKey{Namespace: "ml", Name: "other"}] = &model.ExtendedResourceClaim{ClaimName: "other-claim", Requests: []model.ExtendedResourceRequest{mapping("main", nic, "r")}}
	list := func() (trainer, other *v1.PodResources) {
		trainer = twoContainerPod()
		other = pod("other", container("main", claimed("other-claim", ref(nicDriver, "vf-1"))))
		v.FoldList(t.Context(), []*v1.PodResources{trainer, pod("plain", container("main")), other})
		return trainer, other
	}
	// The first List answers with what the view knows; the reads it
	// asked for fold the later ones.
	poll.Until(t, "a List folding both pods", func() bool {
		p, o := list()
		return proto.Equal(p, want) && proto.Equal(o, wantOther)
	})
	s.mu.Lock()
	first := s.podReads[0]
	s.mu.Unlock()
	if len(first) != 2 {
		t.Errorf("the first read of the pods asked for %v, want both new pods of the List", first)
	}
	podReads, _, _ := s.counts()
	for range 3 {
		p, o := list()
		wantPod(t, p, want)
		wantPod(t, o, wantOther)
	}
	if n, allocReads, _ := s.counts(); n != podReads || allocReads != 1 {
		t.Errorf("3 more Lists read the pods %d more times, and the claim was read %d times; want no more, and once", n-podReads, allocReads)
	}

	// Recreated: the scheduler made it a new claim, with another device.
	// A Get waits for the pod's facts (not for a claim's allocation).
	const newClaim = "trainer-extended-resources-zz9"
	s.mu.Lock()
	s.claims[model.PodKey{Namespace: "ml", Name: "trainer"}] = &model.ExtendedResourceClaim{ClaimName: newClaim, Requests: []model.ExtendedResourceRequest{mapping("main", nic, "r0")}}
	s.mu.Unlock()
	p := pod("trainer", container("main", claimed(newClaim, ref(nicDriver, "vf-0"))))
	v.FoldPod(t.Context(), p)
	wantPod(t, p, pod("trainer", &v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(nic, "0000:3b:02.0", 1)}}))
	if n, _, _ := s.counts(); n != podReads+1 {
		t.Errorf("the recreated pod's facts were read %d times, want once", n-podReads)
	}
}

// When the claim cannot be read (the API server is away, RBAC missing)
// the devices stay under dynamic_resources, counted once, not per List,
// and the claim is not read again on every List.
func TestAnUnreadableClaimLeavesTheKubeletsAnswer(t *testing.T) {
	s := &fakeSources{
		claims:   map[model.PodKey]*model.ExtendedResourceClaim{{Namespace: "ml", Name: "trainer"}: twoContainerClaim},
		allocErr: errors.New("503 Service Unavailable"),
	}
	v := s.view(t)
	p := twoContainerPod()
	v.FoldPod(t.Context(), p)
	wantPod(t, p, twoContainerPod())
	poll.Until(t, "the claim's read", func() bool { _, n, _ := s.counts(); return n == 1 })
	for range 2 {
		p := twoContainerPod()
		v.FoldList(t.Context(), []*v1.PodResources{p})
		wantPod(t, p, twoContainerPod())
	}
	_, allocReads, unfolded := s.counts()
	if allocReads != 1 {
		t.Errorf("the claim was read %d times with 2 Lists, want 1 (retried after a while, not per List)", allocReads)
	}
	if len(unfolded) != 4 || unfolded[0] != ReasonUnattributed {
		t.Errorf("unfolded counted %v, want each of the 2 containers' 2 devices once", unfolded)
	}
}

// A claim whose read hangs (an API server that accepts and never answers)
// holds no answer: List and Get answer with the device under
// dynamic_resources, counted; once the read answers, a later List folds
// it.
func TestAHangingClaimReadHoldsNoAnswer(t *testing.T) {
	s := &fakeSources{
		claims:      map[model.PodKey]*model.ExtendedResourceClaim{{Namespace: "ml", Name: "trainer"}: twoContainerClaim},
		allocations: map[string]Allocation{"ml/" + claim: {"r0": {ref(gpuDriver, "gpu-0")}, "r1": {ref(gpuDriver, "gpu-1")}}},
		hang:        make(chan struct{}),
	}
	v := s.view(t)
	p := twoContainerPod()
	within(t, "a Get", func() { v.FoldPod(t.Context(), p) })
	wantPod(t, p, twoContainerPod())
	poll.Until(t, "the claim's read to start", func() bool { _, n, _ := s.counts(); return n == 1 })
	p = twoContainerPod()
	within(t, "a List", func() { v.FoldList(t.Context(), []*v1.PodResources{p}) })
	wantPod(t, p, twoContainerPod())
	if _, _, unfolded := s.counts(); len(unfolded) != 4 {
		t.Errorf("unfolded counted %v, want the 2 containers' 2 devices each", unfolded)
	}

	close(s.hang)
	want := pod("trainer",
		&v1.ContainerResources{Name: "main", Devices: []*v1.ContainerDevices{device(gpu, "GPU-0a1b", 0)}},
		&v1.ContainerResources{Name: "helper", Devices: []*v1.ContainerDevices{device(gpu, "GPU-1c2d", 1)}},
	)
	poll.Until(t, "a List folding the claim once it is read", func() bool {
		p := twoContainerPod()
		v.FoldList(t.Context(), []*v1.PodResources{p})
		return proto.Equal(p, want)
	})
}

// within fails t unless answer returns well before a read's deadline:
// the bound a hanging read would hold it past, not a measurement.
func within(t *testing.T, what string, answer func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		answer()
	}()
	bound := time.NewTimer(2 * time.Second)
	defer bound.Stop()
	select {
	case <-done:
	case <-bound.C:
		t.Fatalf("%s waited on the hanging claim read", what)
	}
}

// A pod the pod sources do not know yet is answered as the kubelet
// answers it; a device in no slice is counted.
func TestUnknownPodsAndDevicesAreAnsweredAsTheKubeletDoes(t *testing.T) {
	s := &fakeSources{claims: map[model.PodKey]*model.ExtendedResourceClaim{
		{Namespace: "ml", Name: "known"}: {ClaimName: claim, Requests: []model.ExtendedResourceRequest{mapping("main", gpu, "r")}},
	}}
	v := s.view(t)
	unknown := pod("unknown", container("main", claimed(claim, ref(gpuDriver, "gpu-0"))))
	known := pod("known", container("main", claimed(claim, ref(gpuDriver, "gpu-new"))))
	before := []*v1.PodResources{proto.Clone(unknown).(*v1.PodResources), proto.Clone(known).(*v1.PodResources)}
	v.FoldPod(t.Context(), unknown)
	v.FoldPod(t.Context(), known)
	wantPod(t, unknown, before[0])
	wantPod(t, known, before[1])
	s.mu.Lock()
	if len(s.unfolded) != 1 || s.unfolded[0] != ReasonNoSlice {
		t.Errorf("unfolded %v; want the device in no slice counted", s.unfolded)
	}
	s.mu.Unlock()
	v.FoldPod(t.Context(), proto.Clone(before[1]).(*v1.PodResources)) // asked again: told once
	s.mu.Lock()
	defer s.mu.Unlock()
	// What the pod's Event says (serve's Unfolded), once.
	if want := []string{"ml/known main " + ref(gpuDriver, "gpu-new").String() + " " + ReasonNoSlice}; !slices.Equal(s.told, want) {
		t.Errorf("told %q, want %q", s.told, want)
	}
}
