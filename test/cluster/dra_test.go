package cluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/test/clients"
)

// The DRA scenario's names: test/dradriver's driver, the extended resource
// its DeviceClass names, the legacy view's socket where
// deploy/components/dra-legacy-view serves it on the host, and a namespace
// of its own (the later scenarios look at every pod of testNamespace as
// one the binder placed).
const (
	draDriver       = "gpu.podres-proxy.test"
	draResource     = "example.com/gpu"
	draClass        = "podres-proxy-test-gpu"
	draNamespace    = "podres-cluster-dra"
	draDevices      = 4
	draNUMANodes    = 2
	legacySocket    = "/var/run/podres-proxy/legacy/kubelet.sock"
	draOverlay      = "test/cluster/testdata/dra-legacy-view"
	pciBusAttribute = "resource.kubernetes.io/pciBusID"
)

// draDevice is a device as test/dradriver published it in its ResourceSlice.
type draDevice struct {
	pool, name, pciBusID string
	numa                 int64
}

// TestDRADeviceShownUnderDevicesOnTheLegacySocketOnly is issue 26's check
// (docs/dra.md) with the real control plane and kubelet: a DRA driver
// (test/dradriver) publishes devices with a PCI address and a NUMA node, a
// DeviceClass names the extended resource example.com/gpu, and a pod whose
// app container requests example.com/gpu: 1 (its sidecar nothing) is
// scheduled by the default scheduler, which satisfies the request from the
// driver's devices. podres-proxy runs as deploy/base with
// deploy/components/dra-legacy-view, watching the kubelet's Pods API, whose
// pods lack the extended resource claim's status (the legacy view reads it
// from /pods). Through the legacy socket, NFD's,
// resource-topology-exporter's and nri-plugins' reads see the device on the
// app container, by its PCI address, with its NUMA node, and every device of
// the driver as allocatable; the device is no longer under
// dynamic_resources there. Through the default socket the device is where
// the kubelet puts it, under the app container's dynamic_resources only, and
// none of those reads sees it.
//
// It is the suite's first test (files run in name order) and leaves
// nothing behind: the daemon, the pod, the class and the driver are gone
// when it ends, and the next test installs deploy/base afresh.
func TestDRADeviceShownUnderDevicesOnTheLegacySocketOnly(t *testing.T) {
	requireCluster(t)
	ctx := context.Background()
	devices := startDRADriver(t)

	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: draClass},
		Spec: resourcev1.DeviceClassSpec{
			ExtendedResourceName: new(draResource),
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == %q", draDriver)}}},
		},
	}
	if _, err := h.client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass %s: %v", draClass, err)
	}
	t.Cleanup(func() {
		if err := h.client.ResourceV1().DeviceClasses().Delete(context.Background(), draClass, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete DeviceClass %s: %v", draClass, err)
		}
	})

	// podres-proxy with the legacy view, as an operator composes it; it
	// runs before the pod is created, as the cluster's CNI plugin (the
	// Multus-like probe) asks its socket during every CNI ADD.
	if out, err := kubectl("apply", "-k", draOverlay); err != nil {
		t.Fatal(err)
	} else {
		t.Log(out)
	}
	t.Cleanup(func() {
		retireDaemon()
		if _, err := kubectl("delete", "-k", draOverlay, "--wait", "--timeout=180s"); err != nil {
			t.Errorf("uninstall podres-proxy: %v", err)
		}
	})
	if _, err := kubectl("-n", "podres-proxy", "rollout", "status", "daemonset/podres-proxy", "--timeout=180s"); err != nil {
		out, _ := kubectl("-n", "podres-proxy", "describe", "pods")
		t.Fatalf("%v\n%s", err, out)
	}
	useSource(t, "podres-proxy", viaPodsAPI)
	pod, dev := startDRAPod(t, devices)
	t.Logf("pod %s's app container got %s/%s/%s (PCI %s, NUMA node %d)", pod.Name, draDriver, dev.pool, dev.name, dev.pciBusID, dev.numa)

	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	// The daemon lists the node's ResourceSlices before it serves the
	// legacy view and learns the new pod at its first answer; a deadline
	// covers a slow first read of the pod's facts.
	poll(t, time.Minute, "the pod's "+draResource+" under devices through the legacy view", func() error {
		resp, err := getThrough(legacySocket, pod.Name)
		if err != nil {
			return err
		}
		if got := containerDevices(resp, draResource); len(got) == 0 {
			return fmt.Errorf("no container has %s", draResource)
		}
		return nil
	})

	// The daemon answers as the kubelet does, at most 100 calls a second in
	// bursts of 10 (ResourceExhausted beyond); the consumers' reads below
	// (one or two calls each) are paced at 20 a second, which never
	// empties the bucket, as consumers that read every few seconds never do.
	pacer := rate.NewLimiter(rate.Every(50*time.Millisecond), 1)
	pace := func() {
		t.Helper()
		if err := pacer.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// nri-plugins (v1 Get of the pod): the app container's topology hint
	// for example.com/gpu is the device's NUMA node; the sidecar has none.
	pace()
	if hints, err := clients.NRIPluginsTopologyHints(ctx, legacySocket, draNamespace, pod.Name, "app"); err != nil {
		t.Errorf("nri-plugins (legacy view): %v", err)
	} else if want := []int64{dev.numa}; !slices.Equal(hints[draResource], want) {
		t.Errorf("nri-plugins (legacy view): app's %s hint is NUMA %v, want %v", draResource, hints[draResource], want)
	}
	pace()
	if side, err := clients.NRIPluginsTopologyHints(ctx, legacySocket, draNamespace, pod.Name, "sidecar"); err != nil {
		t.Errorf("nri-plugins (legacy view), sidecar: %v", err)
	} else if len(side) > 0 {
		t.Errorf("nri-plugins (legacy view): the sidecar, which requests nothing, has hints %v", side)
	}

	// The pod's answer through each socket.
	pace()
	legacy := draGet(t, legacySocket, pod.Name)
	pace()
	def := draGet(t, proxySocket(), pod.Name)
	if got := containerDevices(legacy, draResource); !slices.Equal(got["app"], []string{dev.pciBusID}) || len(got["sidecar"]) > 0 {
		t.Errorf("legacy view: %s devices %v, want [%s] on app only", draResource, got, dev.pciBusID)
	}
	if claims := dynamicDevices(legacy); len(claims) > 0 {
		t.Errorf("legacy view: the device is still under dynamic_resources %v: a consumer reading both sees it twice", claims)
	}
	if ids := allDeviceIDs(def); len(ids) > 0 {
		t.Errorf("default socket: devices %v; the kubelet lists the DRA device under dynamic_resources only", ids)
	}
	wantDynamic := map[string][]string{"app": {draDriver + "/" + dev.pool + "/" + dev.name}}
	if got := dynamicDevices(def); len(got) != 1 || !slices.Equal(got["app"], wantDynamic["app"]) {
		t.Errorf("default socket: dynamic_resources %v, want %v", got, wantDynamic)
	}

	// NFD topology-updater and resource-topology-exporter
	// (GetAllocatableResources, then List): through the legacy view the
	// driver's devices are allocatable on their NUMA nodes and the pod's is
	// used on its own; through the default socket the resource does not
	// exist.
	wantFree := map[clients.NUMAKey]int{}
	for _, d := range devices {
		wantFree[clients.NUMAKey{Resource: draResource, NUMA: d.numa}]++
	}
	wantFree[clients.NUMAKey{Resource: draResource, NUMA: dev.numa}]--
	pace()
	free, unknown, err := clients.NFDFreePerNUMA(ctx, legacySocket)
	if err != nil {
		t.Fatalf("NFD (legacy view): %v", err)
	}
	if got := onlyResource(free, draResource); !maps.Equal(got, wantFree) || len(unknown) > 0 {
		t.Errorf("NFD (legacy view): free %s per NUMA node %v (unknown ids %v), want %v", draResource, got, unknown, wantFree)
	}
	pace()
	avail, clamped, err := clients.RTEAvailablePerNUMA(ctx, legacySocket)
	if err != nil {
		t.Fatalf("RTE (legacy view): %v", err)
	}
	if got := onlyResource(avail, draResource); !maps.Equal(got, wantFree) || len(clamped) > 0 {
		t.Errorf("RTE (legacy view): available %s per NUMA node %v (clamped %v), want %v", draResource, got, clamped, wantFree)
	}
	wantAlloc := map[string]int64{}
	for _, d := range devices {
		wantAlloc[d.pciBusID] = d.numa
	}
	pace()
	if got := allocatableNUMA(t, legacySocket, draResource); !maps.Equal(got, wantAlloc) {
		t.Errorf("legacy view: GetAllocatableResources lists %s %v, want %v", draResource, got, wantAlloc)
	}
	pace()
	if got := allocatableNUMA(t, proxySocket(), draResource); len(got) > 0 {
		t.Errorf("default socket: GetAllocatableResources lists %s %v; the kubelet lists no DRA device", draResource, got)
	}
	pace()
	if free, unknown, err := clients.NFDFreePerNUMA(ctx, proxySocket()); err != nil {
		t.Errorf("NFD (default socket): %v", err)
	} else if got := onlyResource(free, draResource); len(got) > 0 || len(unknown) > 0 {
		t.Errorf("NFD (default socket): free %s %v, unknown ids %v; want none", draResource, got, unknown)
	}
	pace()
	if hints, err := clients.NRIPluginsTopologyHints(ctx, proxySocket(), draNamespace, pod.Name, "app"); err != nil {
		t.Errorf("nri-plugins (default socket): %v", err)
	} else if len(hints[draResource]) > 0 {
		t.Errorf("nri-plugins (default socket): app's %s hint %v; the default socket must not fold", draResource, hints[draResource])
	}
}

// startDRADriver builds test/dradriver (hack/build-dradriver.sh, cached in
// PODRES_CACHE), runs it on the node as root with the admin kubeconfig,
// waits until its ResourceSlice lists every device, and returns them by
// name. The driver is stopped, and its slices deleted, when the test ends,
// after the cleanups registered later (the pod's, whose claim it must
// unprepare).
func startDRADriver(t *testing.T) map[string]draDevice {
	t.Helper()
	build := exec.Command("bash", filepath.Join(h.repo, "hack", "build-dradriver.sh"))
	build.Dir, build.Stderr = h.repo, os.Stderr
	out, err := build.Output()
	if err != nil {
		t.Fatalf("hack/build-dradriver.sh: %v", err)
	}
	bin := strings.TrimSpace(string(out))
	logPath := filepath.Join(h.artifacts, "dradriver.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--driver-name", draDriver, "--node-name", h.env["NODE_NAME"],
		"--kubeconfig", h.env["KUBECONFIG_ADMIN"], "--kubelet-dir", h.env["KUBELET_ROOT"],
		"--devices", fmt.Sprint(draDevices), "--numa-nodes", fmt.Sprint(draNUMANodes))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the DRA driver: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("the DRA driver ignored SIGTERM for 10 s: killed (log %s)", logPath)
			_ = cmd.Process.Kill()
			<-exited
		}
		err := h.client.ResourceV1().ResourceSlices().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
		if err != nil {
			t.Errorf("delete the DRA driver's ResourceSlices: %v", err)
		}
	})
	devices := map[string]draDevice{}
	poll(t, time.Minute, "the DRA driver's ResourceSlice with every device", func() error {
		select {
		case <-exited:
			return permanentf("the DRA driver exited (%v); log %s", waitErr, logPath)
		default:
		}
		list, err := h.client.ResourceV1().ResourceSlices().List(context.Background(),
			metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver + ",spec.nodeName=" + h.env["NODE_NAME"]})
		if err != nil {
			return err
		}
		clear(devices)
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				pci, numa := d.Attributes[pciBusAttribute].StringValue, d.Attributes["numaNode"].IntValue
				if pci == nil || numa == nil {
					return permanentf("device %s has no %s or numaNode: %v", d.Name, pciBusAttribute, d.Attributes)
				}
				devices[d.Name] = draDevice{pool: s.Spec.Pool.Name, name: d.Name, pciBusID: *pci, numa: *numa}
			}
		}
		if len(devices) != draDevices {
			return fmt.Errorf("%d devices published, want %d", len(devices), draDevices)
		}
		return nil
	})
	return devices
}

// startDRAPod creates, in draNamespace, a pod whose app container requests
// one example.com/gpu and whose sidecar requests nothing, for the default
// scheduler; waits until it is Ready (the kubelet prepared its claim through
// the driver); and returns it with the device its extended resource claim
// was allocated. The pod and the namespace are deleted when the test ends,
// the pod first, while the driver still runs to unprepare the claim.
func startDRAPod(t *testing.T, devices map[string]draDevice) (*corev1.Pod, draDevice) {
	t.Helper()
	ctx := context.Background()
	if _, err := h.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: draNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", draNamespace, err)
	}
	grace := int64(2)
	pause := func(name string) corev1.Container {
		return corev1.Container{Name: name, Image: h.env["PAUSE_IMAGE"], ImagePullPolicy: corev1.PullNever}
	}
	app := pause("app")
	app.Resources.Limits = corev1.ResourceList{draResource: resource.MustParse("1")}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dra-gpu", Namespace: draNamespace},
		Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{pause("sidecar"), app}},
	}
	if _, err := h.client.CoreV1().Pods(draNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		pods := h.client.CoreV1().Pods(draNamespace)
		if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete pod %s: %v", pod.Name, err)
		}
		poll(t, podTimeout, "pod "+pod.Name+" gone", func() error {
			if _, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
		if err := h.client.CoreV1().Namespaces().Delete(ctx, draNamespace, metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete namespace %s: %v", draNamespace, err)
		}
	})
	var ready *corev1.Pod
	poll(t, podTimeout, "pod "+pod.Name+" Ready", func() error {
		p, err := h.client.CoreV1().Pods(draNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = p
				return nil
			}
		}
		return fmt.Errorf("pod %s is %s, not Ready: %v", pod.Name, p.Status.Phase, p.Status.Conditions)
	})
	st := ready.Status.ExtendedResourceClaimStatus
	if st == nil {
		t.Fatalf("pod %s has no extendedResourceClaimStatus: the scheduler did not satisfy %s through DRA", pod.Name, draResource)
	}
	claim, err := h.client.ResourceV1().ResourceClaims(draNamespace).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pod's extended resource claim %s: %v", st.ResourceClaimName, err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s's allocation %+v: want one device", claim.Name, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	d, ok := devices[r.Device]
	if r.Driver != draDriver || !ok || d.pool != r.Pool {
		t.Fatalf("claim %s was allocated %s/%s/%s, not one of the driver's devices %v", claim.Name, r.Driver, r.Pool, r.Device, devices)
	}
	return ready, d
}

// draGet is a v1 Get of the DRA pod through socket; an error fails the
// test.
func draGet(t *testing.T, socket, name string) *podresourcesv1.GetPodResourcesResponse {
	t.Helper()
	resp, err := getThrough(socket, name)
	if err != nil {
		t.Fatalf("Get %s through %s: %v", name, socket, err)
	}
	return resp
}

// getThrough is a v1 Get of the DRA pod through socket.
func getThrough(socket, name string) (resp *podresourcesv1.GetPodResourcesResponse, err error) {
	err = callSocket(socket, func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) error {
		resp, err = c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: name, PodNamespace: draNamespace})
		return err
	})
	return resp, err
}

// allDeviceIDs returns "container: resource=id" for every device of the
// answer's containers.
func allDeviceIDs(resp *podresourcesv1.GetPodResourcesResponse) []string {
	var out []string
	for _, c := range resp.GetPodResources().GetContainers() {
		for _, d := range c.GetDevices() {
			for _, id := range d.GetDeviceIds() {
				out = append(out, c.GetName()+": "+d.GetResourceName()+"="+id)
			}
		}
	}
	return out
}

// dynamicDevices maps each container of the answer to its
// dynamic_resources devices, as driver/pool/device.
func dynamicDevices(resp *podresourcesv1.GetPodResourcesResponse) map[string][]string {
	out := map[string][]string{}
	for _, c := range resp.GetPodResources().GetContainers() {
		for _, dr := range c.GetDynamicResources() {
			for _, r := range dr.GetClaimResources() {
				out[c.GetName()] = append(out[c.GetName()], r.GetDriverName()+"/"+r.GetPoolName()+"/"+r.GetDeviceName())
			}
		}
	}
	return out
}

// allocatableNUMA returns the NUMA node of every device id of res in
// socket's GetAllocatableResources answer (-1 for one without topology).
func allocatableNUMA(t *testing.T, socket, res string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	err := callSocket(socket, func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) error {
		resp, err := c.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
		for _, d := range resp.GetDevices() {
			if d.GetResourceName() != res {
				continue
			}
			numa := int64(-1)
			if nodes := d.GetTopology().GetNodes(); len(nodes) > 0 {
				numa = nodes[0].GetID()
			}
			for _, id := range d.GetDeviceIds() {
				out[id] = numa
			}
		}
		return err
	})
	if err != nil {
		t.Fatalf("GetAllocatableResources through %s: %v", socket, err)
	}
	return out
}

// onlyResource keeps the counts of res.
func onlyResource(m map[clients.NUMAKey]int, res string) map[clients.NUMAKey]int {
	out := map[clients.NUMAKey]int{}
	for k, n := range m {
		if k.Resource == res {
			out[k] = n
		}
	}
	return out
}
