// Package podstest builds realistic kubelet /pods answers for tests and
// benchmarks: pods shaped like the ones a node really runs (owner
// references, managedFields, env, probes, volumes, a projected service
// account token, status with conditions and container statuses), 5-7 KB
// of JSON each, so that decode benchmarks measure what the daemon will meet
// rather than a toy.
//
// The pods are built from the k8s.io/api types and marshalled with
// encoding/json, which writes the same field names and order as the
// kubelet's own encoder.
package podstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// GPUResource is the extended resource that every third pod's app
// container requests (one GPU), so that decoders have requests to find.
const GPUResource = "nvidia.com/gpu"

// PodListJSON returns a kubelet /pods answer (a v1 PodList) with n pods.
// annotate, when not nil, returns extra annotations for pod i (for example
// an allocator's device annotation); nil maps are fine.
func PodListJSON(n int, annotate func(i int) map[string]string) []byte {
	b, err := json.Marshal(PodList(n, annotate))
	if err != nil {
		// The input is built here from plain values; failing to marshal
		// it is a bug in this package.
		panic(fmt.Sprintf("podstest: marshal pod list: %v", err))
	}
	return b
}

// PodList returns the PodList that PodListJSON encodes, for tests that want
// to change a pod before encoding it.
func PodList(n int, annotate func(i int) map[string]string) *corev1.PodList {
	list := &corev1.PodList{
		TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
		Items:    make([]corev1.Pod, 0, n),
	}
	for i := range n {
		var extra map[string]string
		if annotate != nil {
			extra = annotate(i)
		}
		list.Items = append(list.Items, Pod(i, extra))
	}
	return list
}

// UID returns the uid of pod i: distinct per i, stable across calls.
func UID(i int) string {
	return fmt.Sprintf("%08x-5e1d-4c2a-9b7f-%012x", 0x1f3a0000+i, 0xa0b1c2d30000+i)
}

// Namespace and Name return pod i's namespace and name.
func Namespace(i int) string { return fmt.Sprintf("team-%d", i%7) }

// Name returns pod i's name, shaped like a Deployment's pod.
func Name(i int) string { return fmt.Sprintf("web-%d-7d9c8b6f5-x%04d", i%13, i) }

// Pod returns pod i. Pods vary with i the way a node's pods do:
//   - every pod has one app container "app" (cpu, memory);
//   - i%3 == 0: "app" also requests one GPUResource;
//   - i%4 == 1: a plain init container "init-db" runs first;
//   - i%5 == 2: a restartable init container (sidecar) "istio-proxy";
//   - i%2 == 1: a second app container "metrics";
//   - i%11 == 10: the pod has Succeeded (a finished pod the kubelet still
//     lists); the others are Running.
func Pod(i int, annotations map[string]string) corev1.Pod {
	created := time.Date(2026, 11, 1, 8, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Minute)
	ts := metav1.NewTime(created)
	ns, name := Namespace(i), Name(i)
	app := fmt.Sprintf("web-%d", i%13)
	rs := fmt.Sprintf("web-%d-7d9c8b6f5", i%13)
	controller := true

	ann := map[string]string{
		"kubectl.kubernetes.io/restartedAt": "2026-10-30T12:00:00Z",
		"prometheus.io/scrape":              "true",
		"prometheus.io/port":                "9090",
	}
	for k, v := range annotations {
		ann[k] = v
	}

	appContainer := corev1.Container{
		Name:            "app",
		Image:           "registry.example.com/" + app + ":v1.8.3",
		ImagePullPolicy: corev1.PullIfNotPresent,
		Args:            []string{"--config=/etc/app/config.yaml", "--listen=:8080", "--log-level=info"},
		Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
		},
		Env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
			{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}},
			{Name: "GOMAXPROCS", Value: "2"},
			{Name: "DATABASE_URL", Value: "postgres://db." + ns + ".svc.cluster.local:5432/app"},
		},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("250m"),
				corev1.ResourceMemory: resource.MustParse("256Mi"),
			},
			Limits: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("1"),
				corev1.ResourceMemory: resource.MustParse("512Mi"),
			},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "config", MountPath: "/etc/app", ReadOnly: true},
			{Name: "kube-api-access-" + shortID(i), MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true},
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("http"), Scheme: corev1.URISchemeHTTP}},
			PeriodSeconds:    10,
			TimeoutSeconds:   1,
			SuccessThreshold: 1,
			FailureThreshold: 3,
		},
		TerminationMessagePath:   "/dev/termination-log",
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	if i%3 == 0 {
		appContainer.Resources.Limits[GPUResource] = resource.MustParse("1")
		appContainer.Resources.Requests[GPUResource] = resource.MustParse("1")
	}

	var initContainers []corev1.Container
	if i%4 == 1 {
		initContainers = append(initContainers, corev1.Container{
			Name:    "init-db",
			Image:   "registry.example.com/migrate:v3.1.0",
			Command: []string{"/migrate", "up"},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			},
			TerminationMessagePath:   "/dev/termination-log",
			TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			ImagePullPolicy:          corev1.PullIfNotPresent,
		})
	}
	if i%5 == 2 {
		always := corev1.ContainerRestartPolicyAlways
		initContainers = append(initContainers, corev1.Container{
			Name:          "istio-proxy",
			Image:         "docker.io/istio/proxyv2:1.27.1",
			Args:          []string{"proxy", "sidecar", "--domain", "$(POD_NAMESPACE).svc.cluster.local"},
			RestartPolicy: &always,
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi")},
			},
			TerminationMessagePath:   "/dev/termination-log",
			TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			ImagePullPolicy:          corev1.PullIfNotPresent,
		})
	}
	containers := []corev1.Container{appContainer}
	if i%2 == 1 {
		containers = append(containers, corev1.Container{
			Name:  "metrics",
			Image: "registry.example.com/exporter:v0.9.2",
			Ports: []corev1.ContainerPort{{Name: "exporter", ContainerPort: 9100, Protocol: corev1.ProtocolTCP}},
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			},
			TerminationMessagePath:   "/dev/termination-log",
			TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			ImagePullPolicy:          corev1.PullIfNotPresent,
		})
	}

	phase := corev1.PodRunning
	if i%11 == 10 {
		phase = corev1.PodSucceeded
	}
	var statuses []corev1.ContainerStatus
	for _, c := range containers {
		statuses = append(statuses, corev1.ContainerStatus{
			Name:         c.Name,
			State:        corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ts}},
			Ready:        true,
			RestartCount: 0,
			Image:        c.Image,
			ImageID:      c.Image + "@sha256:" + fmt.Sprintf("%064x", i+1),
			ContainerID:  "containerd://" + fmt.Sprintf("%064x", 1000+i),
		})
	}

	tokenExpiry := int64(3607)
	defaultMode := int32(420)
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              name,
			GenerateName:      rs + "-",
			Namespace:         ns,
			UID:               types.UID(UID(i)),
			ResourceVersion:   fmt.Sprint(48213000 + i),
			CreationTimestamp: ts,
			Labels: map[string]string{
				"app.kubernetes.io/name":    app,
				"app.kubernetes.io/part-of": "shop",
				"pod-template-hash":         "7d9c8b6f5",
			},
			Annotations: ann,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs,
				UID:        types.UID(fmt.Sprintf("6b0c%04x-1111-4222-8333-444455556666", i%13)),
				Controller: &controller, BlockOwnerDeletion: &controller,
			}},
			ManagedFields: managedFields(ts),
		},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: app + "-config"}, DefaultMode: &defaultMode,
				}}},
				{Name: "kube-api-access-" + shortID(i), VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					DefaultMode: &defaultMode,
					Sources: []corev1.VolumeProjection{
						{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{ExpirationSeconds: &tokenExpiry, Path: "token"}},
						{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
							Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
					},
				}}},
			},
			InitContainers:                initContainers,
			Containers:                    containers,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: ptr(int64(30)),
			DNSPolicy:                     corev1.DNSClusterFirst,
			ServiceAccountName:            "default",
			DeprecatedServiceAccount:      "default",
			NodeName:                      "node-a1",
			SecurityContext:               &corev1.PodSecurityContext{},
			SchedulerName:                 "koord-scheduler",
			Tolerations: []corev1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr(int64(300))},
			},
			Priority:           ptr(int32(0)),
			EnableServiceLinks: ptr(true),
			PreemptionPolicy:   ptr(corev1.PreemptLowerPriority),
		},
		Status: corev1.PodStatus{
			Phase: phase,
			Conditions: []corev1.PodCondition{
				{Type: "PodReadyToStartContainers", Status: corev1.ConditionTrue, LastTransitionTime: ts},
				{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: ts},
				{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: ts},
				{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: ts},
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: ts},
			},
			HostIP:            "10.20.0.11",
			HostIPs:           []corev1.HostIP{{IP: "10.20.0.11"}},
			PodIP:             fmt.Sprintf("10.244.%d.%d", 1+i/250, 2+i%250),
			PodIPs:            []corev1.PodIP{{IP: fmt.Sprintf("10.244.%d.%d", 1+i/250, 2+i%250)}},
			StartTime:         &ts,
			ContainerStatuses: statuses,
			QOSClass:          corev1.PodQOSBurstable,
		},
	}
}

// managedFields is what the API server records for a Deployment's pod: the
// controller-manager owns the spec, the kubelet owns the status.
func managedFields(ts metav1.Time) []metav1.ManagedFieldsEntry {
	return []metav1.ManagedFieldsEntry{
		{
			Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/restartedAt":{},"f:prometheus.io/port":{},"f:prometheus.io/scrape":{}},"f:generateName":{},"f:labels":{".":{},"f:app.kubernetes.io/name":{},"f:app.kubernetes.io/part-of":{},"f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"6b0c0000-1111-4222-8333-444455556666\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:args":{},"f:image":{},"f:imagePullPolicy":{},"f:name":{},"f:ports":{".":{},"k:{\"containerPort\":8080,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:name":{},"f:protocol":{}}},"f:resources":{".":{},"f:limits":{".":{},"f:cpu":{},"f:memory":{}},"f:requests":{".":{},"f:cpu":{},"f:memory":{}}},"f:terminationMessagePath":{},"f:terminationMessagePolicy":{},"f:volumeMounts":{".":{},"k:{\"mountPath\":\"/etc/app\"}":{".":{},"f:mountPath":{},"f:name":{},"f:readOnly":{}}}}},"f:dnsPolicy":{},"f:enableServiceLinks":{},"f:restartPolicy":{},"f:schedulerName":{},"f:securityContext":{},"f:terminationGracePeriodSeconds":{},"f:volumes":{".":{},"k:{\"name\":\"config\"}":{".":{},"f:configMap":{".":{},"f:defaultMode":{},"f:name":{}},"f:name":{}}}}}`),
		},
		{
			Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1", Subresource: "status",
			FieldsV1: metav1.NewFieldsV1(`{"f:status":{"f:conditions":{"k:{\"type\":\"ContainersReady\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Initialized\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"PodReadyToStartContainers\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}},"k:{\"type\":\"Ready\"}":{".":{},"f:lastProbeTime":{},"f:lastTransitionTime":{},"f:status":{},"f:type":{}}},"f:containerStatuses":{},"f:hostIP":{},"f:hostIPs":{},"f:phase":{},"f:podIP":{},"f:podIPs":{".":{},"k:{\"ip\":\"10.244.1.2\"}":{".":{},"f:ip":{}}},"f:startTime":{}}}`),
		},
	}
}

func shortID(i int) string { return fmt.Sprintf("%05x", 0x7a000+i) }

func ptr[T any](v T) *T { return &v }

// Koordinator's annotations, for LargeHintsJSON.
const (
	koordAllocated = "scheduling.koordinator.sh/device-allocated"
	koordHint      = "scheduling.koordinator.sh/device-allocate-hint"
)

// NewPodAllocation is the Koordinator allocation of the new pod of
// LargeHintsJSON: one whole GPU, whose id is NewPodGPU.
const (
	NewPodGPU        = "GPU-5f0c1d2e-3a4b-4c5d-8e9f-0a1b2c3d4e5f"
	NewPodAllocation = `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"},"id":"` + NewPodGPU + `"}]}`
)

// LargeHintsJSON returns a /pods answer of n running pods, each with a
// Koordinator device-allocate-hint of about hintBytes (a real strategy in
// a selector padded out: the pod's owner writes the hint, and the API
// takes 256 KiB of annotations a pod), then one new pod, Pod(n), that
// requests a GPU and carries NewPodAllocation: another tenant's pod being
// created on the same node (issue 23).
func LargeHintsJSON(n, hintBytes int) []byte {
	// The padding is put in after encoding: encoding/json would take
	// seconds (under the race detector) to escape 26 MiB of it.
	const pad = "@PADDING@"
	hint := `{"rdma":{"allocateStrategy":"RequestsAsCount","vfSelector":{"matchLabels":{"pad":"` + pad + `"}}}}`
	list := PodList(n+1, func(i int) map[string]string {
		if i == n {
			return map[string]string{koordAllocated: NewPodAllocation}
		}
		return map[string]string{koordHint: hint}
	})
	for i := range list.Items {
		list.Items[i].Status.Phase = corev1.PodRunning
	}
	b, err := json.Marshal(list)
	if err != nil {
		panic(fmt.Sprintf("podstest: marshal pod list: %v", err))
	}
	return bytes.ReplaceAll(b, []byte(pad), bytes.Repeat([]byte("x"), hintBytes))
}

// FinishedPodsJSON returns a /pods answer of n finished pods (Succeeded),
// each with an environment value of valueBytes (valid objects, as a Job
// leaves them: they stay in /pods and count against no quota), and then
// live pods that request a GPU and carry a Koordinator allocation each:
// what the /pods memory bound is tested with.
func FinishedPodsJSON(n, valueBytes, live int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[`)
	value := strings.Repeat("x", valueBytes)
	for i := range n + live {
		if i > 0 {
			b.WriteByte(',')
		}
		phase, env, ann := "Succeeded", value, `{}`
		if i >= n {
			phase, env = "Running", "small"
			ann = `{"scheduling.koordinator.sh/device-allocated":"{\"gpu\":[{\"minor\":0,\"id\":\"GPU-` + strconv.Itoa(i) + `\"}]}"}`
		}
		fmt.Fprintf(&b, `{"metadata":{"name":"p%d","namespace":"default","uid":"uid-%d","creationTimestamp":"2026-01-01T00:00:%02dZ","annotations":%s},`+
			`"spec":{"containers":[{"name":"app","image":"busybox","env":[{"name":"BIG","value":"%s"}],"resources":{"limits":{"nvidia.com/gpu":"1"}}}]},`+
			`"status":{"phase":"%s"}}`, i, i, i%60, ann, env, phase)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}
