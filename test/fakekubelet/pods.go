package fakekubelet

import (
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

var (
	metaPodList = metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}
	metaPod     = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
)

// PodOption shapes a Pod built by NewPod.
type PodOption func(*Pod)

// NewPod builds a running pod. Without a container option it gets one app
// container named "app".
func NewPod(namespace, name, uid string, opts ...PodOption) Pod {
	p := Pod{Pod: corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid), Annotations: map[string]string{}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}}
	for _, o := range opts {
		o(&p)
	}
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10.2"}}
	}
	return p
}

// WithAnnotation sets an annotation.
func WithAnnotation(key, value string) PodOption {
	return func(p *Pod) { p.Annotations[key] = value }
}

// WithContainer adds an app container with these resource limits.
func WithContainer(name string, limits map[string]string) PodOption {
	return func(p *Pod) { p.Spec.Containers = append(p.Spec.Containers, container(name, limits)) }
}

// WithSidecar adds a restartable init container (a sidecar).
func WithSidecar(name string, limits map[string]string) PodOption {
	return func(p *Pod) {
		c := container(name, limits)
		always := corev1.ContainerRestartPolicyAlways
		c.RestartPolicy = &always
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	}
}

// WithInit adds a plain init container.
func WithInit(name string, limits map[string]string) PodOption {
	return func(p *Pod) { p.Spec.InitContainers = append(p.Spec.InitContainers, container(name, limits)) }
}

// WithKubeletDevices gives a container devices from the kubelet's own
// device manager (a device plugin), with NUMA node numa (-1: none).
func WithKubeletDevices(containerName, resourceName string, numa int64, ids ...string) PodOption {
	return func(p *Pod) {
		if p.Devices == nil {
			p.Devices = map[string][]*v1.ContainerDevices{}
		}
		for _, id := range ids {
			d := &v1.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{id}}
			if numa >= 0 {
				d.Topology = &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: numa}}}
			}
			p.Devices[containerName] = append(p.Devices[containerName], d)
		}
	}
}

// WithCPUs gives a container exclusive CPUs.
func WithCPUs(containerName string, cpus ...int64) PodOption {
	return func(p *Pod) {
		if p.CPUs == nil {
			p.CPUs = map[string][]int64{}
		}
		p.CPUs[containerName] = cpus
	}
}

// WithPhase sets the pod phase (Succeeded and Failed pods are terminal).
func WithPhase(phase corev1.PodPhase) PodOption {
	return func(p *Pod) { p.Status.Phase = phase }
}

func container(name string, limits map[string]string) corev1.Container {
	c := corev1.Container{Name: name, Image: "registry.k8s.io/pause:3.10.2"}
	if len(limits) > 0 {
		c.Resources.Limits = corev1.ResourceList{}
		c.Resources.Requests = corev1.ResourceList{}
		for k, v := range limits {
			q := resource.MustParse(v)
			c.Resources.Limits[corev1.ResourceName(k)] = q
			c.Resources.Requests[corev1.ResourceName(k)] = q
		}
	}
	return c
}

func cloneAllocatable(r *v1.AllocatableResourcesResponse) *v1.AllocatableResourcesResponse {
	return proto.Clone(r).(*v1.AllocatableResourcesResponse)
}
