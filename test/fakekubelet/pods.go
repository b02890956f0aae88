package fakekubelet

import (
	"strings"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

var (
	metaPodList = metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}
	metaPod     = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
)

// PodOption shapes a Pod built by NewPod.
type PodOption func(*Pod)

// NewPod builds a running pod. Without a container option it gets one app
// container named "app". Its spec.schedulerName is default-scheduler, as
// the API server defaults it, unless WithSchedulerName says otherwise.
func NewPod(namespace, name, uid string, opts ...PodOption) Pod {
	p := Pod{Pod: corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(uid), Annotations: map[string]string{}},
		Spec:       corev1.PodSpec{SchedulerName: corev1.DefaultSchedulerName},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}}
	for _, o := range opts {
		o(&p)
	}
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10.2"}}
	}
	if p.realistic {
		p.makeRealistic()
	}
	return p
}

// WithSchedulerName sets spec.schedulerName: the scheduler that placed the
// pod (koord-scheduler, hami-scheduler, volcano), whose annotations the
// proxy believes only on its own pods.
func WithSchedulerName(name string) PodOption {
	return func(p *Pod) { p.Spec.SchedulerName = name }
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

// WithPodCPUs gives the pod itself exclusive CPUs (pod-level resources),
// which the kubelet reports as the pod's cpu_ids.
func WithPodCPUs(cpus ...int64) PodOption {
	return func(p *Pod) { p.PodCPUs = cpus }
}

// WithPodMemory gives the pod itself memory of a type ("memory",
// "hugepages-1Gi") on NUMA node numa (-1: none), which the kubelet reports
// in the pod's memory.
func WithPodMemory(memoryType string, size uint64, numa int64) PodOption {
	return func(p *Pod) {
		m := &v1.ContainerMemory{MemoryType: memoryType, Size: size}
		if numa >= 0 {
			m.Topology = &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: numa}}}
		}
		p.PodMemory = append(p.PodMemory, m)
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

// Realistic fills a pod the way API-server pods look in /pods, about 5 KB
// of JSON: labels, owner, managedFields, env, volumes, probes, status with
// conditions and container statuses. Benchmarks use it so that decoding
// costs what it costs on a real node.
func Realistic() PodOption {
	return func(p *Pod) { p.realistic = true }
}

// makeRealistic runs after the other options, so that it sees every container.
func (p *Pod) makeRealistic() {
	{
		p.Labels = map[string]string{"app.kubernetes.io/name": p.Name, "app.kubernetes.io/part-of": "training", "pod-template-hash": "7d4b9c8f6d"}
		p.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = `{"apiVersion":"v1","kind":"Pod","metadata":{"annotations":{},"name":"` + p.Name + `"},"spec":{"containers":[{"image":"registry.example.com/team/app:1.2.3","name":"app"}]}}`
		p.CreationTimestamp = metav1.Unix(1763700000, 0)
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: p.Name + "-rs", UID: types.UID("owner-" + string(p.UID))}}
		fields := metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{".":{},"f:app.kubernetes.io/name":{},"f:app.kubernetes.io/part-of":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:env":{".":{},"k:{\"name\":\"MODE\"}":{".":{},"f:name":{},"f:value":{}}},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:resources":{".":{},"f:limits":{".":{},"f:cpu":{},"f:memory":{}}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{}}}`)
		p.ManagedFields = []metav1.ManagedFieldsEntry{
			{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: fields},
			{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", Subresource: "status",
				FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:phase":{},"f:podIP":{},"f:podIPs":{".":{},"k:{\"ip\":\"10.88.0.12\"}":{".":{},"f:ip":{}}},"f:startTime":{}}}`)},
		}
		p.Spec.NodeName = "node-1"
		p.Spec.ServiceAccountName = "default"
		p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr(int64(3607))}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
		}}}}}
		p.Spec.Tolerations = []corev1.Toleration{
			{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
			{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
		}
		for i := range p.Spec.Containers {
			c := &p.Spec.Containers[i]
			c.Image = "registry.example.com/team/app:1.2.3"
			c.Env = []corev1.EnvVar{{Name: "MODE", Value: "train"}, {Name: "NCCL_DEBUG", Value: "INFO"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}
			for _, kv := range [][2]string{{"NCCL_IB_HCA", "mlx5_0,mlx5_1"}, {"NCCL_SOCKET_IFNAME", "eth0"}, {"OMP_NUM_THREADS", "8"},
				{"DATASET_URI", "s3://datasets/imagenet/train"}, {"CHECKPOINT_DIR", "/checkpoints/" + p.Name}, {"LOG_LEVEL", "info"},
				{"WORLD_SIZE", "16"}, {"MASTER_ADDR", p.Name + "-0.training.svc.cluster.local"}, {"MASTER_PORT", "29500"}} {
				c.Env = append(c.Env, corev1.EnvVar{Name: kv[0], Value: kv[1]})
			}
			c.Resources.Requests = mergeList(c.Resources.Requests, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("16Gi")})
			c.Resources.Limits = mergeList(c.Resources.Limits, corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("32Gi")})
			c.VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
			c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 10}
			c.TerminationMessagePath = "/dev/termination-log"
			c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
			c.ImagePullPolicy = corev1.PullIfNotPresent
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
				Name: c.Name, Ready: true, Image: c.Image, ImageID: "registry.example.com/team/app@sha256:" + strings.Repeat("ab", 32),
				ContainerID: "containerd://" + strings.Repeat("0f", 32),
				State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Unix(1763700010, 0)}},
			})
		}
		t := metav1.Unix(1763700005, 0)
		for _, c := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: c, Status: corev1.ConditionTrue, LastTransitionTime: t})
		}
		p.Status.HostIP = "192.0.2.10"
		p.Status.PodIP = "10.88.0.12"
		p.Status.PodIPs = []corev1.PodIP{{IP: "10.88.0.12"}}
		p.Status.QOSClass = corev1.PodQOSBurstable
		p.Status.StartTime = &t
	}
}

func ptr[T any](v T) *T { return &v }

func mergeList(a, b corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	for k, v := range b {
		out[k] = v
	}
	for k, v := range a {
		out[k] = v
	}
	return out
}
