package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/test/binder"
	"github.com/podres-proxy/podres-proxy/test/clients"
	"github.com/podres-proxy/podres-proxy/test/e2eutil"
)

// The namespace the test's workloads run in.
const testNamespace = "podres-cluster-e2e"

// How long a pod may take from creation to Ready on a busy 2-core machine.
const podTimeout = 3 * time.Minute

// --- what the tests look at ---------------------------------------------

// probeRecord is one line the CNI probe wrote (test/cniprobe).
type probeRecord struct {
	Time          time.Time `json:"time"`
	Command       string    `json:"command"`
	Namespace     string    `json:"namespace"`
	Name          string    `json:"name"`
	UID           string    `json:"uid"`
	PodFound      bool      `json:"podFound"`
	DeviceIDs     []string  `json:"deviceIDs"`
	SandboxListed bool      `json:"sandboxListed"`
	Error         string    `json:"error"`
}

// probeAdds returns the probe's CNI ADD records for the pod with uid.
func probeAdds(uid types.UID) ([]probeRecord, error) {
	recs, err := probeRecords()
	return slices.DeleteFunc(recs, func(r probeRecord) bool { return r.Command != "ADD" || r.UID != string(uid) }), err
}

// probeRecords returns every record of the probe, in the order written.
func probeRecords() ([]probeRecord, error) {
	f, err := os.Open(h.probeRecords)
	if err != nil {
		return nil, fmt.Errorf("read the CNI probe's records: %w", err)
	}
	defer f.Close()
	var out []probeRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r probeRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("decode CNI probe record %q: %w", sc.Text(), err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// allocatedVFs returns the VF addresses the binder wrote on the pod.
func allocatedVFs(t *testing.T, uid types.UID) []string {
	t.Helper()
	vfs, _ := allocated(t, uid)
	return vfs
}

// allocated returns the VF addresses and the GPU UUIDs the binder wrote on
// the pod, each sorted.
func allocated(t *testing.T, uid types.UID) (vfs, gpus []string) {
	t.Helper()
	ann, ok := h.binder.Allocation(uid)
	if !ok {
		t.Fatalf("the binder did not place pod %s", uid)
	}
	var alloc struct {
		RDMA []struct {
			Extension struct {
				VFs []struct {
					BusID string `json:"busID"`
				} `json:"vfs"`
			} `json:"extension"`
		} `json:"rdma"`
		GPU []struct {
			ID string `json:"id"`
		} `json:"gpu"`
	}
	if err := json.Unmarshal([]byte(ann), &alloc); err != nil {
		t.Fatalf("the binder's annotation %q: %v", ann, err)
	}
	for _, d := range alloc.RDMA {
		for _, vf := range d.Extension.VFs {
			vfs = append(vfs, vf.BusID)
		}
	}
	for _, g := range alloc.GPU {
		gpus = append(gpus, g.ID)
	}
	slices.Sort(vfs)
	slices.Sort(gpus)
	return vfs, gpus
}

// proxySocket is podres-proxy's socket, where the DaemonSet serves it on
// the host.
func proxySocket() string { return h.env["PROXY_SOCKET_DIR"] + "/kubelet.sock" }

// proxyGet asks podres-proxy's socket, where the DaemonSet serves it on the
// host, for one pod.
func proxyGet(namespace, name string) (resp *podresourcesv1.GetPodResourcesResponse, err error) {
	err = callProxy(func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) error {
		resp, err = c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: name, PodNamespace: namespace})
		return err
	})
	return resp, err
}

// callProxy calls fn on a new connection to podres-proxy's socket, with a
// 10 s deadline.
func callProxy(fn func(context.Context, podresourcesv1.PodResourcesListerClient) error) error {
	return callSocket(proxySocket(), fn)
}

// callSocket calls fn on a new connection to socket, with a 10 s deadline.
func callSocket(socket string, fn func(context.Context, podresourcesv1.PodResourcesListerClient) error) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return fn(ctx, podresourcesv1.NewPodResourcesListerClient(conn))
}

// containerDevices maps each container of the answer to its device ids of
// resource.
func containerDevices(resp *podresourcesv1.GetPodResourcesResponse, resource string) map[string][]string {
	out := map[string][]string{}
	for _, c := range resp.GetPodResources().GetContainers() {
		for _, d := range c.GetDevices() {
			if d.GetResourceName() == resource {
				out[c.GetName()] = append(out[c.GetName()], d.GetDeviceIds()...)
			}
		}
		slices.Sort(out[c.GetName()])
	}
	return out
}

// metric returns the sum of the daemon's metric samples whose line starts
// with prefix (name and labels), from its /metrics on the node's loopback.
func metric(prefix string) (float64, error) {
	resp, err := http.Get("http://127.0.0.1:9477/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, prefix) {
			f := strings.Fields(l)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				return 0, fmt.Errorf("metric line %q: %w", l, err)
			}
			sum += v
		}
	}
	return sum, nil
}

// --- what the tests create ----------------------------------------------

// rdmaContainer is a pause container requesting n VFs.
func rdmaContainer(name string, n int64) corev1.Container {
	q := *resource.NewQuantity(n, resource.DecimalSI)
	return corev1.Container{
		Name: name, Image: h.env["PAUSE_IMAGE"], ImagePullPolicy: corev1.PullNever,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{binder.RDMAResource: q}},
	}
}

// podSpec is a spec the binder places, with one container requesting a VF.
func podSpec() corev1.PodSpec {
	grace := int64(2)
	return corev1.PodSpec{
		SchedulerName:                 schedulerName,
		TerminationGracePeriodSeconds: &grace,
		Containers:                    []corev1.Container{rdmaContainer("app", 1)},
	}
}

func ensureNamespace(t *testing.T) {
	t.Helper()
	_, err := h.client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", testNamespace, err)
	}
}

func createPod(t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	ensureNamespace(t)
	pod.Namespace = testNamespace
	created, err := h.client.CoreV1().Pods(testNamespace).Create(context.Background(), pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	return created
}

// waitReady waits until the pod named name (any UID but those in not) is
// Ready, and returns it.
func waitReady(t *testing.T, name string, not ...types.UID) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll(t, podTimeout, "pod "+name+" Ready", func() error {
		p, err := h.client.CoreV1().Pods(testNamespace).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if slices.Contains(not, p.UID) || p.DeletionTimestamp != nil {
			return fmt.Errorf("pod %s is still the old one (%s)", name, p.UID)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				pod = p
				return nil
			}
		}
		return fmt.Errorf("pod %s (%s) is %s, not Ready", name, p.UID, p.Status.Phase)
	})
	return pod
}

// workloadPods returns the pods whose label app is app.
func workloadPods(t *testing.T, app string) []corev1.Pod {
	t.Helper()
	list, err := h.client.CoreV1().Pods(testNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatalf("list pods of %s: %v", app, err)
	}
	return list.Items
}

// checkOwnVFs checks that the CNI probe, during each CNI ADD of the pod,
// received exactly the VFs the binder allocated to that pod, and that
// podres-proxy's Get gives them to container, and to no other container.
func checkOwnVFs(t *testing.T, pod *corev1.Pod, container string) {
	t.Helper()
	checkOwnVFsAfterFailures(t, pod, container, false)
}

// checkOwnVFsAfterFailures is checkOwnVFs where failed CNI ADDs that
// received no device are allowed when failuresAllowed (a pod whose ADD
// failed while podres-proxy could not read /pods); one ADD must succeed.
func checkOwnVFsAfterFailures(t *testing.T, pod *corev1.Pod, container string, failuresAllowed bool) {
	t.Helper()
	want := allocatedVFs(t, pod.UID)
	if len(want) == 0 {
		t.Fatalf("pod %s: the binder allocated no VF", pod.Name)
	}
	adds, err := probeAdds(pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if len(adds) == 0 {
		t.Fatalf("pod %s (%s): the CNI probe saw no ADD", pod.Name, pod.UID)
	}
	succeeded := false
	for _, a := range adds {
		got := slices.Sorted(slices.Values(a.DeviceIDs))
		if failuresAllowed && a.Error != "" && len(got) == 0 {
			continue
		}
		succeeded = succeeded || a.Error == ""
		if a.Error != "" || !slices.Equal(got, want) {
			t.Errorf("pod %s (%s): CNI ADD at %s received %v (error %q), want its own VFs %v",
				pod.Name, pod.UID, a.Time.Format(time.TimeOnly), a.DeviceIDs, a.Error, want)
		}
	}
	if !succeeded {
		t.Errorf("pod %s (%s): no CNI ADD succeeded", pod.Name, pod.UID)
	}
	resp, err := proxyGet(pod.Namespace, pod.Name)
	if err != nil {
		t.Fatalf("podres-proxy Get %s: %v", pod.Name, err)
	}
	devs := containerDevices(resp, binder.RDMAResource)
	for name, ids := range devs {
		if name != container && len(ids) > 0 {
			t.Errorf("pod %s: container %s got %v; only %s requests VFs", pod.Name, name, ids, container)
		}
	}
	if !slices.Equal(devs[container], want) {
		t.Errorf("pod %s: podres-proxy gives container %s %v, want %v", pod.Name, container, devs[container], want)
	}
}

// daemonPod returns the running podres-proxy pod in namespace: the one pod
// of the DaemonSet not being deleted. Right after a rollout the old pod may
// still terminate, and a 1.37 DaemonSet controller acting on a cache behind
// its own writes ("read version ... is not as new as written version") can
// create a surplus pod that it deletes moments later: wait for one.
func daemonPod(t *testing.T, namespace string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll(t, time.Minute, "one podres-proxy pod in "+namespace, func() error {
		list, err := h.client.CoreV1().Pods(namespace).List(context.Background(),
			metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=podres-proxy"})
		if err != nil {
			return err
		}
		var live []*corev1.Pod
		for i := range list.Items {
			if list.Items[i].DeletionTimestamp == nil {
				live = append(live, &list.Items[i])
			}
		}
		if len(live) != 1 {
			return fmt.Errorf("%d pods not being deleted, of %d", len(live), len(list.Items))
		}
		pod = live[0]
		return nil
	})
	return pod
}

func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, c := range p.Status.ContainerStatuses {
		n += c.RestartCount
	}
	return n
}

// smoke creates a pod through the API, which the binder places, and checks
// that the CNI probe received its VF during CNI ADD, before its sandbox
// existed: podres-proxy could only learn the allocation from the kubelet,
// from its Pods API watch or from /pods read over HTTPS with its
// service-account token, whichever the daemon is configured for
// (checkSource).
func smoke(t *testing.T, name string) {
	t.Helper()
	before := mustReads(t)
	createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: podSpec()})
	pod := waitReady(t, name)
	checkOwnVFs(t, pod, "app")
	adds, _ := probeAdds(pod.UID)
	if len(adds) > 0 && adds[0].SandboxListed {
		t.Errorf("pod %s: the runtime listed the sandbox before CNI ADD; the check proves nothing", name)
	}
	checkSource(t, before, mustReads(t))
	if err := h.client.CoreV1().Pods(testNamespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete pod %s: %v", name, err)
	}
}

// --- the scenarios, in order --------------------------------------------

func TestBaseBecomesReadyAndReadsThePodsOfTheKubelet(t *testing.T) {
	requireCluster(t)
	if out, err := kubectl("apply", "-k", "deploy/base"); err != nil {
		t.Fatal(err)
	} else {
		t.Log(out)
	}
	// Ready means the readiness probe (/podres-proxy probe readyz, on the pod's own probe socket) passed.
	if out, err := kubectl("-n", "podres-proxy", "rollout", "status", "daemonset/podres-proxy", "--timeout=180s"); err != nil {
		out2, _ := kubectl("-n", "podres-proxy", "describe", "pods")
		t.Fatalf("%v\n%s", err, out2)
	} else {
		t.Log(out)
	}
	useSource(t, "podres-proxy", viaPodsAPI)
	smoke(t, "smoke-kustomize")
}

func TestWorkloadsCreatedThroughTheAPIGetTheirOwnDevices(t *testing.T) {
	requireCluster(t)
	ensureNamespace(t)
	ctx := context.Background()
	before := mustReads(t)
	two := int32(2)
	labels := func(app string) map[string]string { return map[string]string{"app": app} }
	template := func(app string) corev1.PodTemplateSpec {
		return corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels(app)}, Spec: podSpec()}
	}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "rdma-deploy"},
		Spec: appsv1.DeploymentSpec{Replicas: &two, Selector: &metav1.LabelSelector{MatchLabels: labels("rdma-deploy")},
			Template: template("rdma-deploy")},
	}
	if _, err := h.client.AppsV1().Deployments(testNamespace).Create(ctx, deploy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "rdma-sts"},
		Spec: appsv1.StatefulSetSpec{Replicas: &two, ServiceName: "rdma-sts",
			Selector: &metav1.LabelSelector{MatchLabels: labels("rdma-sts")}, Template: template("rdma-sts")},
	}
	if _, err := h.client.AppsV1().StatefulSets(testNamespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A native sidecar (an init container that keeps running), which the
	// kubelet lists first: the VF goes to the container that requests it.
	always := corev1.ContainerRestartPolicyAlways
	spec := podSpec()
	spec.InitContainers = []corev1.Container{{Name: "mesh", Image: h.env["PAUSE_IMAGE"],
		ImagePullPolicy: corev1.PullNever, RestartPolicy: &always}}
	createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "with-sidecar", Labels: labels("with-sidecar")}, Spec: spec})

	for _, app := range []string{"rdma-deploy", "rdma-sts", "with-sidecar"} {
		want := 2
		if app == "with-sidecar" {
			want = 1
		}
		poll(t, podTimeout, app+" pods created", func() error {
			if n := len(workloadPods(t, app)); n != want {
				return fmt.Errorf("%d pods, want %d", n, want)
			}
			return nil
		})
		for _, p := range workloadPods(t, app) {
			t.Run(p.Name, func(t *testing.T) {
				checkOwnVFs(t, waitReady(t, p.Name), "app")
			})
		}
	}
	checkSource(t, before, mustReads(t))
}

func TestStatefulSetSuccessorSeesOnlyItsOwnDevices(t *testing.T) {
	requireCluster(t)
	old := waitReady(t, "rdma-sts-0")
	oldVFs := allocatedVFs(t, old.UID)
	before := mustReads(t)
	if err := h.client.CoreV1().Pods(testNamespace).Delete(context.Background(), old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	successor := waitReady(t, "rdma-sts-0", old.UID)
	newVFs := allocatedVFs(t, successor.UID)
	for _, vf := range newVFs {
		if slices.Contains(oldVFs, vf) {
			t.Fatalf("the binder gave the successor its predecessor's VF %s: the test proves nothing", vf)
		}
	}
	checkOwnVFs(t, successor, "app")
	checkSource(t, before, mustReads(t))
}

func TestAForceDeletedPodsSuccessorGetsOnlyItsOwnVF(t *testing.T) {
	requireCluster(t)
	before := mustReads(t)
	forceRecreate(t, "recreated")
	checkSource(t, before, mustReads(t))
}

func TestDCGMNFDAndGetStyleClientsAgree(t *testing.T) {
	requireCluster(t)
	// A training pod: its app container holds a VF and a whole GPU
	// (Koordinator's gpu-core: 100), its sidecar nothing.
	spec := podSpec()
	spec.Containers[0].Resources.Limits[binder.GPUCoreResource] = resource.MustParse("100")
	spec.Containers = append(spec.Containers, corev1.Container{Name: "sidecar", Image: h.env["PAUSE_IMAGE"], ImagePullPolicy: corev1.PullNever})
	pod := waitReady(t, createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "clients"}, Spec: spec}).Name)
	vfs, gpus := allocated(t, pod.UID)
	if len(vfs) != 1 || len(gpus) != 1 {
		t.Fatalf("the binder allocated VFs %v and GPUs %v, want one of each", vfs, gpus)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	socket := proxySocket()

	// Multus (v1 List): the pod's VF.
	if ids, err := clients.MultusDeviceIDs(ctx, socket, testNamespace, pod.Name, binder.RDMAResource); err != nil {
		t.Errorf("Multus: %v", err)
	} else if !slices.Equal(slices.Sorted(slices.Values(ids)), vfs) {
		t.Errorf("Multus hands on %v, want the pod's VF %v", ids, vfs)
	}
	// DCGM exporter (v1 List, and v1alpha1 before 4.2.3-4.1.1): the GPU's
	// metrics carry the app container's labels.
	want := clients.GPUOwner{Namespace: testNamespace, Pod: pod.Name, Container: "app"}
	if owners, err := clients.DCGMDeviceToPod(ctx, socket); err != nil {
		t.Errorf("DCGM exporter: %v", err)
	} else if owners[gpus[0]] != want {
		t.Errorf("DCGM exporter labels GPU %s with %+v, want %+v", gpus[0], owners[gpus[0]], want)
	}
	if owners, err := clients.DCGMV1alpha1DeviceToPod(ctx, socket); err != nil {
		t.Errorf("DCGM exporter (v1alpha1): %v", err)
	} else if owners[gpus[0]] != want {
		t.Errorf("DCGM exporter (v1alpha1) labels GPU %s with %+v, want %+v", gpus[0], owners[gpus[0]], want)
	}
	// Get-style clients (Kata, nri-plugins): Get answers the pod as List
	// does, the devices on the app container only.
	resp, err := proxyGet(testNamespace, pod.Name)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	for res, ids := range map[string][]string{binder.RDMAResource: vfs, binder.NvidiaGPU: gpus} {
		got := containerDevices(resp, res)
		if !slices.Equal(got["app"], ids) || len(got["sidecar"]) > 0 {
			t.Errorf("Get gives %s %v, want %v on app only", res, got, ids)
		}
	}
	wantCDI := []string{binder.RDMAResource + "=" + vfs[0], binder.NvidiaGPU + "=" + gpus[0]}
	slices.Sort(wantCDI)
	if cdi, err := clients.KataCDIDevices(ctx, socket, testNamespace, pod.Name); err != nil {
		t.Errorf("Kata: %v", err)
	} else if slices.Sort(cdi); !slices.Equal(cdi, wantCDI) {
		t.Errorf("Kata cold-plugs %v, want %v", cdi, wantCDI)
	}
	// NFD's topology-updater (GetAllocatableResources, then List): it
	// accounts the pod's devices from List as the allocatable answer
	// allows, against its NUMA node when the answer has the device, else as
	// an unknown id it skips, and no count goes below zero.
	free, unknown, err := clients.NFDFreePerNUMA(ctx, socket)
	if err != nil {
		t.Fatalf("NFD: %v", err)
	}
	for k, n := range free {
		if n < 0 {
			t.Errorf("NFD counts %d free %s on NUMA node %d", n, k.Resource, k.NUMA)
		}
	}
	alloc, err := allocatable()
	if err != nil {
		t.Fatalf("GetAllocatableResources: %v", err)
	}
	for _, id := range wantCDI {
		if slices.Contains(alloc, id) == slices.Contains(unknown, id) {
			t.Errorf("NFD: %s is allocatable %v and unknown %v: NFD did not read it from List as the allocatable answer says",
				id, slices.Contains(alloc, id), slices.Contains(unknown, id))
		}
	}
}

// allocatable returns "resource=id" for every device of podres-proxy's
// GetAllocatableResources answer.
func allocatable() ([]string, error) {
	var out []string
	err := callProxy(func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) error {
		resp, err := c.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
		for _, d := range resp.GetDevices() {
			for _, id := range d.GetDeviceIds() {
				out = append(out, d.GetResourceName()+"="+id)
			}
		}
		return err
	})
	return out, err
}

// rolloutImage is the tag the rollouts move the DaemonSet to: cluster-up
// imports it as an image of its own (PODRES_IMAGE_TAGS), so the new pod's
// image really is new to containerd.
const rolloutImage = "podres-proxy:v2"

// TestRolloutUnderPodCreationAndAListLoop rolls the DaemonSet to a new image
// (maxSurge 1, maxUnavailable 0: the new pod takes the socket over beside the
// old one, deploy/README.md "Upgrades and restarts") while a pod holding a VF
// is created every 500 ms and a consumer pod calls List every 100 ms: no CNI
// ADD fails (none without its own VF, no FailedCreatePodSandBox), no List
// fails or answers wrongly, and the new pod's inspect shows the records and
// the refusal the old one made.
func TestRolloutUnderPodCreationAndAListLoop(t *testing.T) {
	requireCluster(t)
	rolloutUnderLoad(t, "podres-proxy", func() error {
		_, err := kubectl("-n", "podres-proxy", "set", "image", "daemonset/podres-proxy", "podres-proxy="+rolloutImage)
		return err
	})
}

// rolloutUnderLoad is the rollout test against the DaemonSet in namespace,
// which roll moves to rolloutImage (kubectl set image, helm upgrade).
func rolloutUnderLoad(t *testing.T, namespace string, roll func() error) {
	t.Helper()
	ctx := context.Background()
	ensureNamespace(t)
	// What every running test pod must be listed with: its own VFs.
	want := map[string][]string{}
	list, err := h.client.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var holder *corev1.Pod
	for i, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			if _, placed := h.binder.Allocation(p.UID); placed {
				want[p.Name] = allocatedVFs(t, p.UID)
				holder = &list.Items[i]
			}
		}
	}
	if holder == nil {
		holder = createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rollout-holder"}, Spec: podSpec()})
		holder = waitReady(t, holder.Name)
		want[holder.Name] = allocatedVFs(t, holder.UID)
	}
	old := daemonPod(t, namespace)

	// A tenant's pod carrying another pod's allocation under a scheduler that
	// is not a device scheduler: the old daemon refuses it, and the new one
	// must still show that refusal.
	forged := forgedPod(t, holder)
	poll(t, time.Minute, "the old daemon records its refusal of "+forged.Name, func() error {
		if r, ok := storeRecords(t)[string(forged.UID)]; !ok || len(r.Refused) == 0 {
			return fmt.Errorf("no refusal recorded for %s (%s)", forged.Name, forged.UID)
		}
		return nil
	})

	// A monitoring agent's pod (DCGM exporter, RTE): List every 100 ms on
	// the socket the DaemonSet serves on the host, mounted as such an
	// agent mounts it (test/listloop).
	consumer := startConsumer(t)
	poll(t, time.Minute, "ten right answers in a row before the update", func() error {
		return rightInARow(t, consumer, want, time.Time{}, 10)
	})

	// Pods holding a VF, one every 500 ms, for the whole rollout: each one's
	// CNI ADD asks the socket while it changes hands.
	// They start 2 s before the update, so that sandboxes are being set up
	// while the socket changes hands.
	creator := startCreator(t)
	t.Cleanup(creator.deleteAll)
	time.Sleep(2 * time.Second)

	source := h.source
	retireDaemon()
	setAt := time.Now()
	if err := roll(); err != nil {
		creator.stop()
		t.Fatal(err)
	}
	out, err := kubectl("-n", namespace, "rollout", "status", "daemonset/podres-proxy", "--timeout=240s")
	rolledAt := time.Now()
	if err == nil {
		// The rollout is over when the old pod is gone, not when the new
		// one is Ready: keep creating pods through the old one's shutdown.
		poll(t, 2*time.Minute, "the old daemon pod "+old.Name+" gone", func() error {
			_, err := h.client.CoreV1().Pods(namespace).Get(ctx, old.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still there (err %v)", err)
		})
		time.Sleep(time.Second)
	}
	goneAt := time.Now()
	created := creator.stop()
	if err != nil {
		desc, _ := kubectl("-n", namespace, "describe", "pods")
		t.Fatalf("kubectl rollout status: %v\n%s\n%s", err, out, desc)
	}
	t.Logf("rollout: set image at %s, rollout status returned after %s, the old pod gone after %s; %d pods created from 2 s before",
		setAt.Format(time.TimeOnly+".000"), rolledAt.Sub(setAt).Round(time.Millisecond),
		goneAt.Add(-time.Second).Sub(setAt).Round(time.Millisecond), len(created))
	useSource(t, namespace, source)
	updated := daemonPod(t, namespace)
	if updated.UID == old.UID || updated.Spec.Containers[0].Image != rolloutImage {
		t.Fatalf("the DaemonSet was not rolled: pod %s image %s", updated.UID, updated.Spec.Containers[0].Image)
	}
	if len(created) < 4 {
		t.Errorf("only %d pods were created during the rollout", len(created))
	}

	// Every pod created during the rollout: Ready, each CNI ADD received
	// its own VF (no ADD failed), no FailedCreatePodSandBox.
	seen := map[string]string{}
	for _, c := range created {
		pod := waitReady(t, c.Name)
		checkOwnVFs(t, pod, "app")
		for _, vf := range allocatedVFs(t, pod.UID) {
			if other, dup := seen[vf]; dup {
				t.Errorf("VF %s given to both %s and %s", vf, other, pod.Name)
			}
			seen[vf] = pod.Name
		}
	}
	// The check proves something only if CNI ADDs asked while the socket
	// changed hands: between the update and the old pod's end.
	adds, err := probeRecords()
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]bool{}
	for _, c := range created {
		ours[string(c.UID)] = true
	}
	during := 0
	for _, r := range adds {
		if r.Command == "ADD" && ours[r.UID] && !r.Time.Before(setAt) && r.Time.Before(goneAt) {
			during++
		}
	}
	t.Logf("%d of the %d pods' CNI ADDs ran between the update and the old pod's end", during, len(created))
	if during == 0 {
		t.Error("no CNI ADD ran during the rollout: the check proves nothing")
	}
	events, err := h.client.CoreV1().Events(testNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedCreatePodSandBox"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.LastTimestamp.Time.Before(setAt.Add(-time.Second)) && e.EventTime.Time.Before(setAt.Add(-time.Second)) {
			continue
		}
		t.Errorf("FailedCreatePodSandBox on %s at %s: %s", e.InvolvedObject.Name, e.LastTimestamp.Format(time.TimeOnly), e.Message)
	}

	// The consumer: no failed and no wrong List at any point.
	var readyAt time.Time
	for _, c := range updated.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			readyAt = c.LastTransitionTime.Time
		}
	}
	checkedAt := time.Now()
	poll(t, time.Minute, "ten right answers in a row from the new daemon", func() error {
		return rightInARow(t, consumer, want, checkedAt, 10)
	})
	records := consumerRecords(t, consumer)
	var errs, wrong int
	for _, r := range records {
		at := r.At.Format(time.TimeOnly + ".000")
		if r.Code != codes.OK.String() {
			errs++
			if errs <= 5 {
				t.Errorf("List at %s failed with %s %q: a rollout must never leave the socket without a daemon", at, r.Code, r.Error)
			}
			continue
		}
		if w := wrongListing(r.Pods, want); w != "" {
			wrong++
			if wrong <= 5 {
				t.Errorf("List at %s answered wrongly: %s", at, w)
			}
		}
	}
	t.Logf("%d Lists from the consumer pod: %d errors, %d wrong answers; update began %s, new daemon Ready %s",
		len(records), errs, wrong, setAt.Format(time.TimeOnly+".000"), readyAt.Format(time.TimeOnly))

	// The new pod's inspect shows what the old one wrote: every running test
	// pod's allocation (learned before the update began: a /pods read does
	// not reset that time for an allocation it already has, nor does the
	// Pods API watch's relist), and the forged pod's refusal.
	recs := podStoreRecords(t, namespace, updated.Name)
	for name := range want {
		p, err := h.client.CoreV1().Pods(testNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		r, ok := recs[string(p.UID)]
		switch {
		case !ok:
			t.Errorf("the new daemon's store has no record of pod %s (%s)", p.Name, p.UID)
		case r.Sources.Annotations == nil:
			t.Errorf("the new daemon's record of pod %s has no allocation", p.Name)
		case !r.Sources.Annotations.At.Before(setAt):
			t.Errorf("the new daemon re-learned pod %s's allocation from %s at %s, after the update began at %s",
				p.Name, r.Sources.Annotations.Source, r.Sources.Annotations.At.Format(time.TimeOnly+".000"), setAt.Format(time.TimeOnly+".000"))
		}
	}
	if r, ok := recs[string(forged.UID)]; !ok || len(r.Refused) == 0 {
		t.Errorf("the new daemon's inspect shows no refusal of %s (%s): %+v", forged.Name, forged.UID, r)
	} else {
		t.Logf("the new daemon's inspect: %d records; %s refused (%s)", len(recs), forged.Name, r.Refused[0].Reason)
	}
	if c, err := daemonReads(); err == nil {
		t.Logf("the new daemon, reading %s: %s", h.source, c.describe(h.source))
	}
	if err := h.client.CoreV1().Pods(testNamespace).Delete(ctx, forged.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("delete pod %s: %v", forged.Name, err)
	}
}

// forgedPod creates a pod that carries holder's allocation annotation but is
// placed by the default scheduler, and requests no device: the daemon refuses
// the allocation (wrong scheduler). It waits until the pod runs.
func forgedPod(t *testing.T, holder *corev1.Pod) *corev1.Pod {
	t.Helper()
	ann, ok := h.binder.Allocation(holder.UID)
	if !ok {
		t.Fatalf("the binder did not place %s", holder.Name)
	}
	grace := int64(2)
	name := fmt.Sprintf("forged-%d", time.Now().UnixNano()%100000)
	pod := createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{binder.Annotation: ann}},
		Spec: corev1.PodSpec{
			// Placed by nodeName; its schedulerName stays default-scheduler.
			NodeName:                      h.env["NODE_NAME"],
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "app", Image: h.env["PAUSE_IMAGE"], ImagePullPolicy: corev1.PullNever}},
		},
	})
	return waitReady(t, pod.Name)
}

// creator creates a pod holding a VF every 500 ms until stopped.
type creator struct {
	t       *testing.T
	done    chan struct{}
	stopped chan struct{}
	created []*corev1.Pod
}

func startCreator(t *testing.T) *creator {
	c := &creator{t: t, done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(c.stopped)
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rollout-%03d", i),
				Labels: map[string]string{"app": "rollout"}}, Spec: podSpec()}
			pod.Namespace = testNamespace
			p, err := h.client.CoreV1().Pods(testNamespace).Create(context.Background(), pod, metav1.CreateOptions{})
			if err != nil {
				t.Errorf("create pod %s: %v", pod.Name, err)
			} else {
				c.created = append(c.created, p)
			}
			select {
			case <-c.done:
				return
			case <-tick.C:
			}
		}
	}()
	return c
}

// stop stops the creation and returns the pods created.
func (c *creator) stop() []*corev1.Pod {
	select {
	case <-c.done:
	default:
		close(c.done)
	}
	<-c.stopped
	return c.created
}

// deleteAll deletes the pods created and waits until they are gone, so the
// tests after this one find the node as it was.
func (c *creator) deleteAll() {
	ctx := context.Background()
	for _, p := range c.stop() {
		_ = h.client.CoreV1().Pods(testNamespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		list, err := h.client.CoreV1().Pods(testNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=rollout"})
		if err == nil && len(list.Items) == 0 {
			return
		}
		time.Sleep(time.Second)
	}
	c.t.Errorf("the rollout's pods were not gone after 3 minutes")
}

// TestCrashWindowOfServe kills serve in its pod with SIGKILL and measures,
// on the real node, how long the socket refuses calls: until the kubelet has
// restarted the container and the new serve answers. The figure is
// deploy/README.md's.
func TestCrashWindowOfServe(t *testing.T) {
	requireCluster(t)
	pod := daemonPod(t, "podres-proxy")
	before := restarts(pod)
	pid, err := servePID()
	if err != nil {
		t.Fatal(err)
	}
	if err := callProxy(func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) error {
		_, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		return err
	}); err != nil {
		t.Fatalf("the socket does not answer before the kill: %v", err)
	}
	source := h.source
	retireDaemon()
	killedAt := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill serve (pid %d): %v", pid, err)
	}
	var failed int
	var firstFail time.Time
	var answeredAt time.Time
	for time.Since(killedAt) < 2*time.Minute {
		err := callProxy(func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) error {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
			return err
		})
		if err == nil {
			if failed > 0 {
				answeredAt = time.Now()
				break
			}
		} else {
			if failed == 0 {
				firstFail = time.Now()
			}
			failed++
		}
		time.Sleep(10 * time.Millisecond)
	}
	if answeredAt.IsZero() {
		t.Fatalf("the socket did not answer again within 2 minutes of the SIGKILL (%d failed calls)", failed)
	}
	poll(t, time.Minute, "the kubelet reports serve's container restarted", func() error {
		p, err := h.client.CoreV1().Pods("podres-proxy").Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err == nil && restarts(p) <= before {
			err = fmt.Errorf("pod %s: restarts %d, was %d", p.Name, restarts(p), before)
		}
		return err
	})
	t.Logf("cluster: crash window: serve (pid %d) killed with SIGKILL at %s; calls failed from %s for %s (%d calls, each dialing anew), answered again %s after the kill, the kubelet's restart included",
		pid, killedAt.Format(time.TimeOnly+".000"), firstFail.Format(time.TimeOnly+".000"),
		answeredAt.Sub(firstFail).Round(time.Millisecond), failed, answeredAt.Sub(killedAt).Round(time.Millisecond))
	poll(t, time.Minute, "the restarted daemon Ready", func() error {
		p, err := h.client.CoreV1().Pods("podres-proxy").Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return errors.New("not Ready")
	})
	useSource(t, "podres-proxy", source)
}

// servePID finds the one serve process on the node by /proc: its command
// line is the image's /podres-proxy serve.
func servePID() (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) > 1 && args[0] == "/podres-proxy" && args[1] == "serve" {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		return 0, fmt.Errorf("%d serve processes on the node (%v), want one", len(pids), pids)
	}
	return pids[0], nil
}

// storeRecord is the part of `podres-proxy inspect -o json` the suite
// reads: where and when a record's allocation was learned.
type storeRecord struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Sources   struct {
		Annotations *struct {
			Source string    `json:"source"`
			At     time.Time `json:"at"`
		} `json:"annotations"`
	} `json:"sources"`
	Refused []struct {
		Reason string `json:"reason"`
	} `json:"refused"`
}

// storeRecords runs `podres-proxy inspect -o json` (the binary cluster-up
// packed into the image) on the daemon's state directory on the host, and
// returns its records by pod UID.
func storeRecords(t *testing.T) map[string]storeRecord {
	t.Helper()
	cmd := exec.Command(filepath.Join(h.root, "images", "podres-proxy"), "inspect", "--state-dir", h.env["PROXY_STATE_DIR"], "-o", "json")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("podres-proxy inspect: %v: %s", err, stderr.String())
	}
	var recs []storeRecord
	if err := json.Unmarshal(out, &recs); err != nil {
		t.Fatalf("decode podres-proxy inspect -o json: %v", err)
	}
	byUID := map[string]storeRecord{}
	for _, r := range recs {
		byUID[r.UID] = r
	}
	return byUID
}

// podStoreRecords runs `podres-proxy inspect -o json` in the daemon pod
// (kubectl exec: the pod's own binary on its state directory) and returns
// its records by pod UID.
func podStoreRecords(t *testing.T, namespace, pod string) map[string]storeRecord {
	t.Helper()
	out, err := kubectlOut("-n", namespace, "exec", pod, "--", "/podres-proxy", "inspect", "--state-dir", "/var/lib/podres-proxy", "-o", "json")
	if err != nil {
		t.Fatalf("podres-proxy inspect in pod %s: %v", pod, err)
	}
	var recs []storeRecord
	if err := json.Unmarshal([]byte(out), &recs); err != nil {
		t.Fatalf("decode podres-proxy inspect -o json in pod %s: %v", pod, err)
	}
	byUID := map[string]storeRecord{}
	for _, r := range recs {
		byUID[r.UID] = r
	}
	return byUID
}

// consumerRecord is one line of test/listloop's output.
type consumerRecord struct {
	At    time.Time           `json:"at"`
	Code  string              `json:"code"`
	Error string              `json:"error"`
	Pods  map[string][]string `json:"pods"`
}

// startConsumer starts test/listloop's pod, which mounts the directory of
// the socket the DaemonSet serves on the host, and waits until it runs.
func startConsumer(t *testing.T) string {
	t.Helper()
	const name = "list-consumer"
	dir := corev1.HostPathDirectory
	grace := int64(0)
	createPod(t, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                      h.env["NODE_NAME"],
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "listloop", Image: consumerImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"--socket", "/var/run/podres-proxy/pod-resources/kubelet.sock",
					"--namespace", testNamespace, "--resource", binder.RDMAResource, "--interval", "100ms"},
				VolumeMounts: []corev1.VolumeMount{{Name: "sockets", MountPath: "/var/run/podres-proxy/pod-resources"}},
			}},
			Volumes: []corev1.Volume{{Name: "sockets", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: h.env["PROXY_SOCKET_DIR"], Type: &dir}}}},
		},
	})
	t.Cleanup(func() {
		_ = h.client.CoreV1().Pods(testNamespace).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &grace})
	})
	waitReady(t, name)
	return name
}

// consumerRecords reads the consumer pod's lines from its log.
func consumerRecords(t *testing.T, pod string) []consumerRecord {
	t.Helper()
	raw, err := h.client.CoreV1().Pods(testNamespace).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("the consumer pod's log: %v", err)
	}
	var out []consumerRecord
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l == "" {
			continue // no line yet
		}
		var r consumerRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("the consumer pod's line %q: %v", l, err)
		}
		out = append(out, r)
	}
	return out
}

// rightInARow fails unless the consumer's last n answers after since were
// all right.
func rightInARow(t *testing.T, pod string, want map[string][]string, since time.Time, n int) error {
	records := consumerRecords(t, pod)
	got := 0
	for i := len(records) - 1; i >= 0 && records[i].At.After(since); i-- {
		r := records[i]
		if r.Code != codes.OK.String() || wrongListing(r.Pods, want) != "" {
			break
		}
		got++
	}
	if got < n {
		return fmt.Errorf("%d right answers in a row (of %d lines)", got, len(records))
	}
	return nil
}

// wrongListing says what is wrong with the devices a List answer gave the
// test's pods: a running test pod missing, listed without its own VFs or
// with another's. "" when nothing is.
func wrongListing(got, want map[string][]string) string {
	var out []string
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			out = append(out, name+" is not listed")
		} else if !slices.Equal(g, w) {
			out = append(out, fmt.Sprintf("%s has %v, want %v", name, g, w))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// TestRemovingTheClusterRoleBindingDeniesUntilRestored removes the
// ClusterRoleBinding that grants the daemon nodes/pods: its /pods reads are
// denied, and a pod being created is not answered (its CNI ADD fails) until
// the binding is back. Watching the Pods API, serve reads no /pods, so the
// test first patches deploy/base's DaemonSet to serve with
// --kubelet-pods-api-socket= (a rollout) and leaves it so: the tests after
// it run no daemon (the admission policy's) or remove the base (the Helm
// chart's).
func TestRemovingTheClusterRoleBindingDeniesUntilRestored(t *testing.T) {
	requireCluster(t)
	ctx := context.Background()
	servePodsOnly(t)
	daemon := daemonPod(t, "podres-proxy")
	before := mustReads(t)
	binding, err := h.client.RbacV1().ClusterRoleBindings().Get(ctx, "podres-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubectl("delete", "clusterrolebinding", "podres-proxy"); err != nil {
		t.Fatal(err)
	}
	// Restored as it was, the DaemonSet left as it is.
	restore := func() error {
		_, err := h.client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: binding.Name, Labels: binding.Labels, Annotations: binding.Annotations},
			RoleRef:    binding.RoleRef, Subjects: binding.Subjects,
		}, metav1.CreateOptions{})
		return err
	}
	restored := false
	defer func() {
		if !restored {
			_ = restore()
		}
	}()
	// The kubelet's answer: 403 naming what RBAC no longer grants (with
	// fine-grained authorization, nodes/pods and then nodes/proxy).
	denied := regexp.MustCompile(`403 Forbidden.*user=system:serviceaccount:podres-proxy:podres-proxy, verb=get, resource=nodes, subresource\(s\)=\[pods`)
	deniedGet := func(name string) error {
		resp, err := proxyGet(testNamespace, name)
		if err == nil {
			return permanentf("Get of %s answered (%s devices %v) instead of Unavailable",
				name, binder.RDMAResource, containerDevices(resp, binder.RDMAResource))
		}
		if status.Code(err) == codes.Unavailable && denied.MatchString(status.Convert(err).Message()) {
			return nil
		}
		return fmt.Errorf("Get answered %v", err)
	}
	// A new pod needs a /pods read. The kubelet caches its last "allowed"
	// for a few seconds (PODRES_CLUSTER_AUTHZ_TTL): a pod whose first read
	// came in that window was learned, so try another new pod.
	var pod *corev1.Pod
	for i := 0; pod == nil; i++ {
		if i == 5 {
			t.Fatal("five new pods in a row were answered, not Unavailable, after the ClusterRoleBinding was deleted")
		}
		p := createPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("rbac-denied-%d", i)}, Spec: podSpec()})
		err := pollErr(time.Minute, func() error { return deniedGet(p.Name) })
		if err == nil {
			pod = p
		} else if !e2eutil.IsPermanent(err) {
			t.Fatalf("Get of a new pod answered Unavailable with the kubelet's 403: not within a minute: %v", err)
		} else {
			t.Logf("%v: the kubelet still had podres-proxy's access cached", err)
		}
	}
	// Multus-like, the CNI probe failed the pod's ADD rather than wiring it
	// without its VF.
	poll(t, podTimeout, "a failed CNI ADD of the new pod", func() error {
		adds, err := probeAdds(pod.UID)
		if err != nil {
			return err
		}
		for _, a := range adds {
			if len(a.DeviceIDs) > 0 {
				return permanentf("CNI ADD at %s received %v while RBAC denied /pods", a.Time.Format(time.TimeOnly), a.DeviceIDs)
			}
			if a.Error != "" {
				return nil
			}
		}
		return fmt.Errorf("%d ADD records, none failed", len(adds))
	})
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	restored = true
	// The kubelet caches authorization answers (PODRES_CLUSTER_AUTHZ_TTL,
	// 5 s here): the daemon recovers once the kubelet asks again.
	poll(t, time.Minute, "Get of the pod answered with its VF after the binding is restored", func() error {
		resp, err := proxyGet(testNamespace, pod.Name)
		if err != nil {
			return err
		}
		if got := containerDevices(resp, binder.RDMAResource)["app"]; !slices.Equal(got, allocatedVFs(t, pod.UID)) {
			return fmt.Errorf("app has %v", got)
		}
		return nil
	})
	now := daemonPod(t, "podres-proxy")
	if now.UID != daemon.UID || restarts(now) != restarts(daemon) {
		t.Errorf("the daemon was restarted (pod %s restarts %d, was %s restarts %d)", now.UID, restarts(now), daemon.UID, restarts(daemon))
	}
	// The pod whose CNI ADD failed meanwhile starts once the kubelet retries.
	checkOwnVFsAfterFailures(t, waitReady(t, pod.Name), "app", true)
	// Denied, then allowed: serve's reads were of /pods, never of the Pods
	// API.
	after := mustReads(t)
	d := after.since(before)
	t.Logf("serve, reading %s, while the binding was removed and restored: %s", h.source, d.describe(h.source))
	if d.failed == 0 || d.shared-d.failed <= 0 {
		t.Errorf("serve's /pods reads: %v failed and %v succeeded; want both denied ones and, once restored, allowed ones", d.failed, d.shared-d.failed)
	}
	checkPodsAPIUnused(t, after)
}

// servePodsOnly patches deploy/base's DaemonSet to serve with
// --kubelet-pods-api-socket= and waits until its new daemon is Ready: it
// reads the kubelet's /pods, as where the kubelet has no Pods API.
func servePodsOnly(t *testing.T) {
	t.Helper()
	retireDaemon()
	patch := `[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--kubelet-pods-api-socket="}]`
	if _, err := kubectl("-n", "podres-proxy", "patch", "daemonset", "podres-proxy", "--type=json", "-p", patch); err != nil {
		t.Fatal(err)
	}
	if out, err := kubectl("-n", "podres-proxy", "rollout", "status", "daemonset/podres-proxy", "--timeout=180s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	useSource(t, "podres-proxy", viaPods)
}

// TestTheAdmissionPolicyDeniesTenantsPodsBoundUnderADeviceSchedulersName
// applies deploy/components/admission-policy to the real API server. A
// pod's spec.schedulerName is written by whoever creates it, and a pod
// created with spec.nodeName set is never scheduled, so a tenant could make
// podres-proxy believe its own annotations as koord-scheduler's. As the
// tenant (impersonated), creating such a pod is denied; as koord-scheduler's
// service account, a listed writer, it is admitted, and so are the tenant's
// pods that koord-scheduler places or that name default-scheduler. The
// creations are dry runs: the API server admits them exactly as real ones,
// and nothing reaches the node.
func TestTheAdmissionPolicyDeniesTenantsPodsBoundUnderADeviceSchedulersName(t *testing.T) {
	requireCluster(t)
	ensureNamespace(t)
	ctx := context.Background()
	// The writers' ConfigMap lives in podres-proxy's namespace, which the
	// base creates; this test run alone has no base.
	if _, err := h.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "podres-proxy"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	const (
		tenant = "system:serviceaccount:" + testNamespace + ":default"
		writer = "system:serviceaccount:koordinator-system:koord-scheduler"
	)
	// Both may create pods in the namespace, so that only the policy can
	// deny them.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-creator", Namespace: testNamespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pod-creator", Namespace: testNamespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: tenant}, {Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: writer}}}
	for _, create := range []func() error{
		func() error {
			_, err := h.client.RbacV1().Roles(testNamespace).Create(ctx, role, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := h.client.RbacV1().RoleBindings(testNamespace).Create(ctx, binding, metav1.CreateOptions{})
			return err
		},
	} {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	as := func(user string) kubernetes.Interface {
		cfg, err := clientcmd.BuildConfigFromFlags("", h.env["KUBECONFIG_ADMIN"])
		if err != nil {
			t.Fatal(err)
		}
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// create creates, as a dry run, a pod of the binder's scheduler asking
	// for a VF, bound to the node when node is set.
	create := func(c kubernetes.Interface, name, scheduler, node string) error {
		spec := podSpec()
		spec.SchedulerName, spec.NodeName = scheduler, node
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace}, Spec: spec}
		_, err := c.CoreV1().Pods(testNamespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	node := h.env["NODE_NAME"]
	tenantClient, writerClient := as(tenant), as(writer)
	denied := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "spec.nodeName")
	}

	files := []string{"-f", "deploy/components/admission-policy/policy.yaml", "-f", "deploy/components/admission-policy/writers.yaml"}
	if out, err := kubectl(append([]string{"apply"}, files...)...); err != nil {
		t.Fatal(err)
	} else {
		t.Log(out)
	}
	// The API server enforces a policy once its informers have the policy,
	// the binding and the ConfigMap; later tests' binder writes allocation
	// annotations as the cluster admin, whom the policy would deny, so it
	// is gone again before they run.
	t.Cleanup(func() {
		if _, err := kubectl(append([]string{"delete", "--ignore-not-found"}, files...)...); err != nil {
			t.Error(err)
			return
		}
		poll(t, time.Minute, "the admission policy withdrawn", func() error {
			return create(tenantClient, "bound-by-tenant", schedulerName, node)
		})
	})
	var err error
	poll(t, time.Minute, "the admission policy in force", func() error {
		if err = create(tenantClient, "bound-by-tenant", schedulerName, node); denied(err) {
			return nil
		}
		return fmt.Errorf("a tenant's pod bound under %s's name: %v", schedulerName, err)
	})
	for _, w := range []string{schedulerName, tenant} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the denial %q does not name %q", err, w)
		}
	}
	t.Logf("denied: %v", err)
	if err := create(writerClient, "bound-by-koord-scheduler", schedulerName, node); err != nil {
		t.Errorf("koord-scheduler's service account, a listed writer, was refused a bound pod: %v", err)
	}
	if err := create(tenantClient, "placed-by-koord-scheduler", schedulerName, ""); err != nil {
		t.Errorf("a tenant's pod for koord-scheduler to place was refused: %v", err)
	}
	if err := create(tenantClient, "bound-under-default-scheduler", "default-scheduler", node); err != nil {
		t.Errorf("a tenant's bound pod under default-scheduler's name was refused: %v", err)
	}
}

// TestHelmChartInstallsTheSameDaemon replaces deploy/base by the Helm chart,
// installed with podsAPI.enabled: false: its daemon reads /pods (the Pods
// API's configuration is deploy/base's, as installed, earlier), and the
// smoke check runs again.
func TestHelmChartInstallsTheSameDaemon(t *testing.T) {
	requireCluster(t)
	retireDaemon()
	if _, err := kubectl("delete", "-k", "deploy/base", "--wait", "--timeout=180s"); err != nil {
		t.Fatal(err)
	}
	const ns = "podres-proxy-helm"
	if _, err := kubectl("create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	if _, err := kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged"); err != nil {
		t.Fatal(err)
	}
	kubeconfig := h.env["KUBECONFIG_ADMIN"]
	namespace := ns
	flags := &genericclioptions.ConfigFlags{KubeConfig: &kubeconfig, Namespace: &namespace}
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, ns, "secret", func(format string, v ...any) { t.Logf(format, v...) }); err != nil {
		t.Fatalf("helm: %v", err)
	}
	ch, err := loader.Load(h.repo + "/deploy/helm/podres-proxy")
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace = "podres-proxy", ns
	install.Wait, install.Timeout = true, 3*time.Minute
	values := map[string]any{"podsAPI": map[string]any{"enabled": false}}
	if _, err := install.Run(ch, values); err != nil {
		out, _ := kubectl("-n", ns, "describe", "pods")
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	defer func() {
		retireDaemon()
		if _, err := action.NewUninstall(cfg).Run("podres-proxy"); err != nil {
			t.Errorf("helm uninstall: %v", err)
		}
	}()
	if out, err := kubectl("-n", ns, "rollout", "status", "daemonset/podres-proxy", "--timeout=180s"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	useSource(t, ns, viaPods)
	smoke(t, "smoke-helm")
	// The same force deletion with serve reading /pods, as on most clusters.
	forceRecreate(t, "recreated-helm")
	// The chart's rollout, as an upgrade of the release to a new image tag.
	rolloutUnderLoad(t, ns, func() error {
		upgrade := action.NewUpgrade(cfg)
		upgrade.Namespace = ns
		values["image"] = map[string]any{"tag": strings.TrimPrefix(rolloutImage, "podres-proxy:")}
		_, err := upgrade.Run("podres-proxy", ch, values)
		return err
	})
}
