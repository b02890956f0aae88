package fakekubelet

// The PodResources gRPC side of the fake: List, Get and
// GetAllocatableResources answered as the kubelet answers them, pods (and a
// container's devices) in a new order on every List, as the kubelet's
// pod manager map gives them.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	corev1 "k8s.io/api/core/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
)

func terminal(p *Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// v1Pod builds a pod's v1 answer the kubelet's way.
func (k *Kubelet) v1Pod(p *Pod) *v1.PodResources {
	out := v1Pod(p)
	if !k.fixedOrder {
		for _, c := range out.Containers {
			c.Devices = shuffled(c.Devices)
		}
	}
	if k.unknown {
		out.ProtoReflect().SetUnknown(UnknownField)
		for _, c := range out.Containers {
			c.ProtoReflect().SetUnknown(UnknownField)
		}
	}
	return out
}

func v1Pod(p *Pod) *v1.PodResources {
	out := &v1.PodResources{Name: p.Name, Namespace: p.Namespace, Containers: []*v1.ContainerResources{},
		CpuIds: p.PodCPUs, Memory: p.PodMemory}
	add := func(name string) {
		out.Containers = append(out.Containers, &v1.ContainerResources{
			Name:             name,
			Devices:          p.Devices[name],
			CpuIds:           p.CPUs[name],
			DynamicResources: p.DynamicResources[name],
		})
	}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c.Name)
		}
	}
	for _, c := range p.Spec.Containers {
		add(c.Name)
	}
	return out
}

// order returns the indexes of the pods List names, in the order it names
// them: a new random one per call, as the kubelet's map gives, unless
// SetFixedOrder. k.mu is held.
func (k *Kubelet) order() []int {
	idx := make([]int, len(k.pods))
	for i := range idx {
		idx[i] = i
	}
	if !k.fixedOrder {
		rand.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	}
	return idx
}

// listPods returns the pods' answers List gives, in the order it names
// them (order). k.mu is held.
func (k *Kubelet) listPods() []*v1.PodResources {
	if k.prebuilt && len(k.built) < len(k.pods) {
		k.built = append(k.built, make([]*v1.PodResources, len(k.pods)-len(k.built))...)
	}
	out := []*v1.PodResources{}
	for _, i := range k.order() {
		if !terminal(&k.pods[i]) {
			out = append(out, k.podAnswer(i))
		}
	}
	return out
}

// podAnswer is pods[i]'s answer: built anew, or with SetPrebuiltList built
// once after the pod last changed and kept (gRPC only reads it). k.mu is
// held.
func (k *Kubelet) podAnswer(i int) *v1.PodResources {
	if !k.prebuilt {
		return k.v1Pod(&k.pods[i])
	}
	if k.built[i] == nil {
		k.built[i] = k.v1Pod(&k.pods[i])
	}
	return k.built[i]
}

// shuffled returns a copy of s in random order (the pods' own slices are
// shared with the test and must not be reordered).
func shuffled[T any](s []T) []T {
	if len(s) < 2 {
		return s
	}
	out := slices.Clone(s)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

type v1Server struct {
	v1.UnimplementedPodResourcesListerServer
	k *Kubelet
}

func (s *v1Server) List(ctx context.Context, _ *v1.ListPodResourcesRequest) (*v1.ListPodResourcesResponse, error) {
	s.k.mu.Lock()
	resp := &v1.ListPodResourcesResponse{PodResources: s.k.listPods()}
	s.k.mu.Unlock()
	if err := s.k.enterGRPC(ctx, "List"); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *v1Server) Get(ctx context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	s.k.mu.Lock()
	var resp *v1.GetPodResourcesResponse
	for i := range s.k.pods {
		p := &s.k.pods[i]
		if p.Name == req.PodName && p.Namespace == req.PodNamespace && !terminal(p) {
			resp = &v1.GetPodResourcesResponse{PodResources: s.k.v1Pod(p)}
			break
		}
	}
	s.k.mu.Unlock()
	if err := s.k.enterGRPC(ctx, "Get"); err != nil {
		return nil, err
	}
	if resp == nil {
		// The kubelet returns a plain error, which gRPC sends as code Unknown.
		return nil, fmt.Errorf("pod %s in namespace %s not found", req.PodName, req.PodNamespace)
	}
	return resp, nil
}

func (s *v1Server) GetAllocatableResources(ctx context.Context, _ *v1.AllocatableResourcesRequest) (*v1.AllocatableResourcesResponse, error) {
	s.k.mu.Lock()
	resp := &v1.AllocatableResourcesResponse{}
	if s.k.allocatable != nil {
		resp = cloneAllocatable(s.k.allocatable)
	}
	s.k.mu.Unlock()
	if err := s.k.enterGRPC(ctx, "GetAllocatableResources"); err != nil {
		return nil, err
	}
	return resp, nil
}

type v1alpha1Server struct {
	v1alpha1.UnimplementedPodResourcesListerServer
	k *Kubelet
}

// List answers like the kubelet's v1alpha1: every pod it knows (terminal
// ones too), app containers only, devices without topology.
func (s *v1alpha1Server) List(ctx context.Context, _ *v1alpha1.ListPodResourcesRequest) (*v1alpha1.ListPodResourcesResponse, error) {
	s.k.mu.Lock()
	resp := &v1alpha1.ListPodResourcesResponse{}
	for _, i := range s.k.order() {
		p := &s.k.pods[i]
		pr := &v1alpha1.PodResources{Name: p.Name, Namespace: p.Namespace}
		for _, c := range p.Spec.Containers {
			cr := &v1alpha1.ContainerResources{Name: c.Name}
			devs := p.Devices[c.Name]
			if !s.k.fixedOrder {
				devs = shuffled(devs)
			}
			for _, d := range devs {
				cr.Devices = append(cr.Devices, &v1alpha1.ContainerDevices{ResourceName: d.ResourceName, DeviceIds: d.DeviceIds})
			}
			pr.Containers = append(pr.Containers, cr)
		}
		resp.PodResources = append(resp.PodResources, pr)
	}
	s.k.mu.Unlock()
	if err := s.k.enterGRPC(ctx, "v1alpha1.List"); err != nil {
		return nil, err
	}
	return resp, nil
}

// ErrNotFound matches the kubelet's Get error text for a pod.
func ErrNotFound(namespace, name string) error {
	return errors.New("pod " + name + " in namespace " + namespace + " not found")
}
