package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// koordAnnotation is where Koordinator's scheduler writes its allocation.
const koordAnnotation = "scheduling.koordinator.sh/device-allocated"

// hamiAnnotation is where HAMi's scheduler writes the NVIDIA vGPUs it
// allocated, one entry per container.
const hamiAnnotation = "hami.io/vgpu-devices-allocated"

// Device ids of the suite's Koordinator allocations.
const (
	gpuUUID        = "GPU-8f3a2c1e-0001-4c6b-9d2e-5a7b3c4d1e01"
	sidecarGPUUUID = "GPU-8f3a2c1e-0002-4c6b-9d2e-5a7b3c4d1e02"
	devGPUUUID     = "GPU-8f3a2c1e-0003-4c6b-9d2e-5a7b3c4d1e03"
	lateGPUUUID    = "GPU-8f3a2c1e-0004-4c6b-9d2e-5a7b3c4d1e04"
	rdmaPF         = "0000:3b:00.0"
	rdmaVF         = "0000:3b:02.1"
)

// The GPUs HAMi's scheduler gives hamiPod's sidecar and app container; the
// HAMi-style device plugin advertises slots of both (hamiDeviceIDs).
const (
	hamiSidecarGPU = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"
	hamiAppGPU     = "GPU-4b1c6e8d-27a3-4f59-b0e2-9d6c1a7f3e50"
)

// devices is what a pod's containers hold: container -> resource -> ids.
type devices map[string]map[string][]string

// testPod is a static pod of the suite and the devices the proxy must
// report for it (the kubelet's own example.com/dev devices aside).
type testPod struct {
	// name is the manifest's name; the kubelet runs it as name-<node>.
	name string
	pod  *corev1.Pod
	// want are the devices the proxy adds, per container.
	want devices
}

// fullName is the pod's name as the kubelet runs it.
func (p testPod) fullName() string { return p.name + "-" + nodeName }

// Pods of the suite.
var (
	gpuPod     = newTestPod("gpu", gpuAllocation(gpuUUID), appContainers("app"), nil, map[string]corev1.ResourceList{"app": limits(gpuResource, "1")})
	rdmaPod    = newTestPod("rdma", rdmaAllocation(), appContainers("app"), nil, map[string]corev1.ResourceList{"app": limits(rdmaResource, "1")})
	sidecarPod = newTestPod("sidecar", gpuAllocation(sidecarGPUUUID), appContainers("app-a", "app-b"), []string{"mesh-proxy"},
		map[string]corev1.ResourceList{"app-b": limits("koordinator.sh/gpu-core", "100", "koordinator.sh/gpu-memory-ratio", "100")})
	plainPod = newTestPod("plain", "", appContainers("app"), nil, nil)
	// devPluginPod asks the kubelet for a device of the test device plugin
	// and Koordinator for a GPU: both must be in the proxy's answer.
	devPluginPod = newTestPod("devplugin", gpuAllocation(devGPUUUID), appContainers("app"), nil,
		map[string]corev1.ResourceList{"app": limits(devResource, "1", gpuResource, "1")})
	// latePod is created after containerd restarted, to see NRI again.
	latePod = newTestPod("late", gpuAllocation(lateGPUUUID), appContainers("app"), nil, map[string]corev1.ResourceList{"app": limits(gpuResource, "1")})
	// hamiPod is a HAMi pod: the kubelet allocates a fake id of the
	// HAMi-style device plugin to its sidecar and to its app container, and
	// HAMi's annotation names the real GPUs, which must replace them.
	hamiPod = newHAMiPod()
	// forgerPod copies gpuPod's allocation and requests a GPU like it, but
	// no device scheduler placed it (default-scheduler): it must get
	// nothing, and gpuPod keeps its GPU.
	forgerPod = newTestPod("forger", gpuAllocation(gpuUUID), appContainers("app"), nil, map[string]corev1.ResourceList{"app": limits(gpuResource, "1")}).
			scheduledBy(corev1.DefaultSchedulerName)
)

func init() {
	gpuPod.want = devices{"app": {gpuResource: {gpuUUID}}}
	rdmaPod.want = devices{"app": {rdmaResource: {rdmaVF}}}
	sidecarPod.want = devices{"app-b": {gpuResource: {sidecarGPUUUID}}}
	plainPod.want = devices{}
	devPluginPod.want = devices{"app": {gpuResource: {devGPUUUID}}}
	latePod.want = devices{"app": {gpuResource: {lateGPUUUID}}}
	hamiPod.want = devices{"monitor": {hamiResource: {hamiSidecarGPU}}, "app": {hamiResource: {hamiAppGPU}}}
	forgerPod.want = devices{}
}

// basePods start before the tests and run throughout.
func basePods() []testPod {
	return []testPod{gpuPod, rdmaPod, sidecarPod, plainPod, devPluginPod, hamiPod, forgerPod}
}

// needsPluginDevices tells whether the kubelet must allocate devices of
// the test device plugins to p: it may refuse such a pod, which only the
// pod's own test is about.
func needsPluginDevices(p testPod) bool {
	return p.name == devPluginPod.name || p.name == hamiPod.name
}

// newHAMiPod builds hamiPod: a plain init container (which HAMi's list
// covers too, first, with no devices), then a sidecar and an app container
// that each request one vGPU, as HAMi's users write them (count and memory).
// Its annotation is what HAMi's scheduler writes for that pod.
func newHAMiPod() testPod {
	vgpu := limits(hamiResource, "1", "nvidia.com/gpumem", "3000")
	p := newTestPod("hami", "", appContainers("app"), []string{"monitor"}, map[string]corev1.ResourceList{"monitor": vgpu, "app": vgpu})
	// `pause -v` prints its version and exits: a plain init container that
	// completes.
	setup := corev1.Container{Name: "setup", ImagePullPolicy: corev1.PullNever, Args: []string{"-v"}}
	p.pod.Spec.InitContainers = append([]corev1.Container{setup}, p.pod.Spec.InitContainers...)
	p.pod.Annotations = map[string]string{
		hamiAnnotation: fmt.Sprintf(";%s,NVIDIA,3000,30:;%s,NVIDIA,3000,30:;", hamiSidecarGPU, hamiAppGPU),
	}
	return p.scheduledBy("hami-scheduler")
}

// scheduledBy sets the pod's spec.schedulerName: podres-proxy believes an
// allocation only on a pod its allocator's scheduler placed.
func (p testPod) scheduledBy(scheduler string) testPod {
	p.pod.Spec.SchedulerName = scheduler
	return p
}

func gpuAllocation(uuid string) string {
	return fmt.Sprintf(`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory":"23040Mi","koordinator.sh/gpu-memory-ratio":"100"},"id":%q}]}`, uuid)
}

func rdmaAllocation() string { return vfAllocation(rdmaVF) }

// vfAllocation is Koordinator's allocation of one VF of rdmaPF.
func vfAllocation(vf string) string {
	return fmt.Sprintf(`{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":%q,"extension":{"vfs":[{"minor":-1,"busID":%q}]}}]}`, rdmaPF, vf)
}

// newVFPod is a pod whose app container requests one VF, which Koordinator
// allocated: vf, of rdmaPF.
func newVFPod(name, vf string) testPod {
	p := newTestPod(name, vfAllocation(vf), appContainers("app"), nil, map[string]corev1.ResourceList{"app": limits(rdmaResource, "1")})
	p.want = devices{"app": {rdmaResource: {vf}}}
	return p
}

func appContainers(names ...string) []string { return names }

// limits builds a resource list from name, quantity pairs.
func limits(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

// newTestPod builds a static pod running the pause image in every
// container, with sidecars as restartable init containers.
func newTestPod(name, allocation string, apps, sidecars []string, res map[string]corev1.ResourceList) testPod {
	grace := int64(2)
	always := corev1.ContainerRestartPolicyAlways
	container := func(n string) corev1.Container {
		return corev1.Container{
			Name:            n,
			ImagePullPolicy: corev1.PullNever,
			Resources:       corev1.ResourceRequirements{Limits: res[n]},
		}
	}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: podNamespace, Labels: map[string]string{"app.kubernetes.io/part-of": "podres-e2e"}},
		Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: &grace},
	}
	if allocation != "" {
		pod.Annotations = map[string]string{koordAnnotation: allocation}
		pod.Spec.SchedulerName = "koord-scheduler"
	}
	for _, s := range sidecars {
		c := container(s)
		c.RestartPolicy = &always
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, c)
	}
	for _, a := range apps {
		pod.Spec.Containers = append(pod.Spec.Containers, container(a))
	}
	return testPod{name: name, pod: pod}
}

// manifestPath is where the pod's manifest lives in the static pod dir.
func (p testPod) manifestPath() string {
	return filepath.Join(h.env["MANIFESTS"], p.name+".json")
}

// create writes the pod's manifest atomically (the kubelet ignores
// dot-files, so it never reads a half-written one).
func (p testPod) create() error {
	pod := p.pod.DeepCopy()
	image := h.env["PAUSE_IMAGE"]
	for i := range pod.Spec.InitContainers {
		pod.Spec.InitContainers[i].Image = image
	}
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].Image = image
	}
	b, err := json.MarshalIndent(pod, "", "  ")
	if err != nil {
		return fmt.Errorf("encode pod %s: %w", p.name, err)
	}
	tmp := filepath.Join(h.env["MANIFESTS"], "."+p.name+".json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write manifest of %s: %w", p.name, err)
	}
	if err := os.Rename(tmp, p.manifestPath()); err != nil {
		return fmt.Errorf("install manifest of %s: %w", p.name, err)
	}
	return nil
}

// remove deletes the pod's manifest: the kubelet then stops the pod.
func (p testPod) remove() error {
	if err := os.Remove(p.manifestPath()); err != nil {
		return fmt.Errorf("remove manifest of %s: %w", p.name, err)
	}
	return nil
}

// podsOnce starts the base pods once for all tests.
var podsOnce struct {
	sync.Once
	err error
	// refused says why the kubelet did not run a pod that needs plugin
	// devices, by pod name.
	refused map[string]error
}

// ensurePods starts the base pods (once) and waits until they run. The pods
// that need device plugin devices are waited for separately: the kubelet
// may refuse them, which only their own tests are about.
func ensurePods(t *testing.T) {
	t.Helper()
	requireNode(t)
	podsOnce.Do(func() {
		for _, p := range basePods() {
			if err := p.create(); err != nil {
				podsOnce.err = err
				return
			}
		}
		var names []string
		for _, p := range basePods() {
			if !needsPluginDevices(p) {
				names = append(names, p.fullName())
			}
		}
		podsOnce.err = waitRunning(3*time.Minute, names...)
		podsOnce.refused = map[string]error{}
		for _, p := range basePods() {
			if needsPluginDevices(p) {
				if err := waitRunning(time.Minute, p.fullName()); err != nil {
					podsOnce.refused[p.name] = err
				}
			}
		}
	})
	if podsOnce.err != nil {
		t.Fatalf("the suite's pods did not start: %v", podsOnce.err)
	}
}

// refused says why the kubelet did not run p, a base pod; nil when it runs.
func refused(p testPod) error { return podsOnce.refused[p.name] }

// waitRunning waits until the kubelet reports each pod Running with all
// its containers running, and fails fast when one failed.
func waitRunning(timeout time.Duration, names ...string) error {
	return pollErr(timeout, func() error {
		list, err := kubeletPods()
		if err != nil {
			return err
		}
		for _, name := range names {
			pod := findKubeletPod(list, podNamespace, name)
			if pod == nil {
				return fmt.Errorf("pod %s/%s: not in the kubelet's /pods yet", podNamespace, name)
			}
			if err := podRunning(pod); err != nil {
				return err
			}
		}
		return nil
	})
}

// podRunning tells why a pod from /pods is not running yet.
func podRunning(pod *corev1.Pod) error {
	st := pod.Status
	if st.Phase == corev1.PodFailed {
		return permanentf("pod %s/%s failed: %s: %s", pod.Namespace, pod.Name, st.Reason, st.Message)
	}
	if st.Phase != corev1.PodRunning {
		return fmt.Errorf("pod %s/%s is %q (%s %s)", pod.Namespace, pod.Name, st.Phase, st.Reason, st.Message)
	}
	if len(st.ContainerStatuses) != len(pod.Spec.Containers) {
		return fmt.Errorf("pod %s/%s: %d of %d container statuses", pod.Namespace, pod.Name, len(st.ContainerStatuses), len(pod.Spec.Containers))
	}
	for _, cs := range st.ContainerStatuses {
		if cs.State.Running == nil {
			return fmt.Errorf("pod %s/%s: container %s is not running (%+v)", pod.Namespace, pod.Name, cs.Name, cs.State)
		}
	}
	return nil
}
