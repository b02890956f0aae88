package deploy_test

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The paths consumers open inside their containers.
const (
	consumerSocket     = "/var/lib/kubelet/pod-resources/kubelet.sock"
	multusCheckpoint   = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
	kubeletHostSocket  = "/var/lib/kubelet/pod-resources/kubelet.sock"
	dcgmSocketOverride = "DCGM_POD_RESOURCES_KUBELET_SOCKET"
)

// consumer is a DaemonSet a component redirects, where its stand-in is,
// the socket path it opens (consumerSocket when empty, or the value of its
// socketFlag when set) and the view it must see (docs/views.md).
type consumer struct {
	name, dir, standin   string
	daemonSet, container string
	socket               string
	socketFlag           string
	view                 string
}

var consumers = []consumer{
	{name: "multus-thick", dir: "testdata/multus-thick", standin: "multus-standin.yaml", daemonSet: "kube-multus-ds", container: "kube-multus", view: "plain"},
	{name: "dcgm-exporter", dir: "testdata/dcgm-exporter", standin: "dcgm-exporter-standin.yaml", daemonSet: "dcgm-exporter", container: "exporter", view: "dcgm"},
	{name: "nfd-topology-updater", dir: "testdata/nfd-topology-updater", standin: "nfd-topology-updater-standin.yaml",
		daemonSet: "node-feature-discovery-topology-updater", container: "topology-updater",
		socket: "/host-var/lib/kubelet-podresources/kubelet.sock", view: "topology"},
	{name: "nri-plugins", dir: "testdata/nri-plugins", standin: "nri-plugins-standin.yaml",
		daemonSet: "nri-resource-policy-topology-aware", container: "nri-resource-policy-topology-aware", view: "plain"},
	{name: "resource-topology-exporter", dir: "testdata/resource-topology-exporter", standin: "resource-topology-exporter-standin.yaml",
		daemonSet: "resource-topology-exporter-ds", container: "resource-topology-exporter-container",
		socketFlag: "podresources-socket", view: "topology"},
}

// openedSocket is the socket path the consumer's container ctr opens: the
// path of the unix:// endpoint its socketFlag names, or its default.
func (c consumer) openedSocket(t *testing.T, ctr *corev1.Container) string {
	t.Helper()
	if c.socketFlag == "" {
		if c.socket != "" {
			return c.socket
		}
		return consumerSocket
	}
	v, ok := goFlagValue(t, containerArgv(ctr), c.socketFlag)
	if !ok {
		t.Fatalf("%s does not pass --%s", ctr.Name, c.socketFlag)
	}
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "unix" || u.Path == "" {
		t.Fatalf("%s: --%s=%s is not a unix:// endpoint (err %v)", ctr.Name, c.socketFlag, v, err)
	}
	return u.Path
}

// containerArgv is what a container's program is given after its name: the
// rest of command, then args.
func containerArgv(ctr *corev1.Container) []string {
	var argv []string
	if len(ctr.Command) > 1 {
		argv = append(argv, ctr.Command[1:]...)
	}
	return append(argv, ctr.Args...)
}

// goFlagValue returns the value Go's flag package gives the string flag
// name from argv: the last one given, and none after "--" or the first
// argument that is not a flag, where parsing stops. It fails the test on
// another flag written without "=" and followed by a non-flag, whose
// meaning depends on whether that flag is a bool.
func goFlagValue(t *testing.T, argv []string, name string) (string, bool) {
	t.Helper()
	value, found := "", false
	for i := 0; i < len(argv); i++ {
		a := argv[i]
		if a == "--" || len(a) < 2 || a[0] != '-' {
			break
		}
		n, v, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		switch {
		case n == name && hasValue:
			value, found = v, true
		case n == name:
			if i+1 == len(argv) {
				t.Fatalf("%s is the last argument and has no value", a)
			}
			i++
			value, found = argv[i], true
		case !hasValue && i+1 < len(argv) && !strings.HasPrefix(argv[i+1], "-"):
			t.Fatalf("cannot tell whether %s takes %q as its value; write it as %s=VALUE", a, argv[i+1], a)
		}
	}
	return value, found
}

// withoutFlag returns argv less every occurrence of the flag name.
func withoutFlag(argv []string, name string) []string {
	var out []string
	for i := 0; i < len(argv); i++ {
		n, _, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(argv[i], "-"), "-"), "=")
		if strings.HasPrefix(argv[i], "-") && n == name {
			if !hasValue {
				i++
			}
			continue
		}
		out = append(out, argv[i])
	}
	return out
}

// viewSockets returns the socket each view is served on by the
// podres-proxy DaemonSet with every view's component (testdata/views):
// --socket's is the topology view, each --view NAME=PATH another.
func viewSockets(t *testing.T) map[string]string {
	t.Helper()
	ds := find[appsv1.DaemonSet](t, renderDir(t, "testdata/views"), "DaemonSet", proxyName)
	args := proxyContainer(t, ds).Args
	out := map[string]string{"topology": argValues(t, args)["socket"]}
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--view="); ok {
			name, path, _ := strings.Cut(v, "=")
			out[name] = path
		}
	}
	return out
}

// containerOf returns the named container of a DaemonSet.
func containerOf(t *testing.T, ds *appsv1.DaemonSet, name string) *corev1.Container {
	t.Helper()
	for i := range ds.Spec.Template.Spec.Containers {
		if c := &ds.Spec.Template.Spec.Containers[i]; c.Name == name {
			return c
		}
	}
	t.Fatalf("DaemonSet %s has no container %s", ds.Name, name)
	return nil
}

// socketSeenBy returns the host path behind the socket path the consumer
// opens: its default, or DCGM's override when set.
func socketSeenBy(t *testing.T, ds *appsv1.DaemonSet, c *corev1.Container, opened string) (resolved, string) {
	t.Helper()
	path := opened
	for _, e := range c.Env {
		if e.Name == dcgmSocketOverride {
			path = e.Value
		}
	}
	r, ok := resolve(t, &ds.Spec.Template.Spec, c, path)
	if !ok || r.hostPath == "" {
		t.Fatalf("%s: %s is not on a hostPath mount", c.Name, path)
	}
	return r, path
}

// renderStandin renders a consumer's stand-in alone, without the component,
// from a copy in a temporary directory.
func renderStandin(t *testing.T, c consumer) []object {
	t.Helper()
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(c.dir, c.standin))
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + c.standin + "\n"
	for name, content := range map[string][]byte{c.standin: data, "kustomization.yaml": []byte(k)} {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := build(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func TestStandinsReadTheKubeletSocketWithoutTheirComponent(t *testing.T) {
	// Without the component each stand-in reaches the kubelet's own socket:
	// so the redirection the next test sees is the component's doing.
	for _, c := range consumers {
		t.Run(c.name, func(t *testing.T) {
			ds := find[appsv1.DaemonSet](t, renderStandin(t, c), "DaemonSet", c.daemonSet)
			ctr := containerOf(t, ds, c.container)
			r, _ := socketSeenBy(t, ds, ctr, c.openedSocket(t, ctr))
			if r.hostPath != kubeletHostSocket {
				t.Errorf("stand-in reads %s, want the kubelet's %s", r.hostPath, kubeletHostSocket)
			}
		})
	}
}

func TestConsumerComponentsPointAtTheirViewsSocket(t *testing.T) {
	sockets := viewSockets(t)
	for _, c := range consumers {
		t.Run(c.name, func(t *testing.T) {
			served := sockets[c.view]
			if served == "" {
				t.Fatalf("no component serves the %s view", c.view)
			}
			ds := find[appsv1.DaemonSet](t, renderDir(t, c.dir), "DaemonSet", c.daemonSet)
			ctr := containerOf(t, ds, c.container)
			r, path := socketSeenBy(t, ds, ctr, c.openedSocket(t, ctr))
			if r.hostPath != served {
				t.Errorf("%s opens %s, which is host %s; podres-proxy serves its %s view on %s", c.container, path, r.hostPath, c.view, served)
			}
			if !isDirectoryType(r.volume) {
				t.Errorf("volume %s has type %q, want a directory type: a socket file mount loses podres-proxy's socket when it restarts",
					r.volume.Name, hostPathType(r.volume))
			}
			if !r.mount.ReadOnly {
				t.Errorf("mount %s is writable; consumers only connect", r.mount.Name)
			}
			if filepath.Clean(r.mount.MountPath) != filepath.Dir(path) {
				t.Errorf("podres-proxy's directory is mounted at %s, want exactly the socket's directory %s", r.mount.MountPath, filepath.Dir(path))
			}
		})
	}
}

func TestMultusLosesTheCheckpointFallback(t *testing.T) {
	// With the kubelet's directory gone from Multus' container, a missing
	// podres-proxy socket fails CNI ADD instead of falling back to the
	// device-plugin checkpoint, which knows none of the scheduler's devices.
	c := consumers[0]
	before := find[appsv1.DaemonSet](t, renderStandin(t, c), "DaemonSet", c.daemonSet)
	if _, ok := resolve(t, &before.Spec.Template.Spec, containerOf(t, before, c.container), multusCheckpoint); !ok {
		t.Fatalf("the stand-in does not mount %s: it is no stand-in for Multus", multusCheckpoint)
	}
	after := find[appsv1.DaemonSet](t, renderDir(t, c.dir), "DaemonSet", c.daemonSet)
	if r, ok := resolve(t, &after.Spec.Template.Spec, containerOf(t, after, c.container), multusCheckpoint); ok {
		t.Errorf("Multus still sees %s (host %s through mount %s)", multusCheckpoint, r.hostPath, r.mount.Name)
	}
	for _, v := range after.Spec.Template.Spec.Volumes {
		if v.Name == "host-var-lib-kubelet" {
			t.Error("volume host-var-lib-kubelet is still defined")
		}
	}
}

func TestConsumerComponentsChangeNothingElse(t *testing.T) {
	// Apart from the pod-resources mount (and the socket flag, for a
	// consumer that takes one), a consumer keeps its containers, images,
	// arguments and other mounts.
	for _, c := range consumers {
		t.Run(c.name, func(t *testing.T) {
			before := find[appsv1.DaemonSet](t, renderStandin(t, c), "DaemonSet", c.daemonSet)
			after := find[appsv1.DaemonSet](t, renderDir(t, c.dir), "DaemonSet", c.daemonSet)
			// The mounts on the way to the socket, before or after.
			sockets := []string{
				c.openedSocket(t, containerOf(t, before, c.container)),
				c.openedSocket(t, containerOf(t, after, c.container)),
			}
			mounts := func(ds *appsv1.DaemonSet) map[string]string {
				out := map[string]string{}
				ctr := containerOf(t, ds, c.container)
				for _, m := range ctr.VolumeMounts {
					if strings.HasPrefix(m.MountPath, "/var/lib/kubelet") ||
						strings.HasPrefix(sockets[0], m.MountPath) || strings.HasPrefix(sockets[1], m.MountPath) {
						continue
					}
					r, _ := resolve(t, &ds.Spec.Template.Spec, ctr, m.MountPath)
					out[m.MountPath] = r.hostPath
				}
				return out
			}
			b, a := mounts(before), mounts(after)
			if len(a) != len(b) {
				t.Errorf("other mounts changed: %v -> %v", b, a)
			}
			for k, v := range b {
				if a[k] != v {
					t.Errorf("mount %s: host %s -> %s", k, v, a[k])
				}
			}
			cb, ca := containerOf(t, before, c.container), containerOf(t, after, c.container)
			argv := func(ctr *corev1.Container) string {
				return strings.Join(withoutFlag(containerArgv(ctr), c.socketFlag), " ")
			}
			if cb.Image != ca.Image || argv(cb) != argv(ca) ||
				len(before.Spec.Template.Spec.Containers) != len(after.Spec.Template.Spec.Containers) {
				t.Error("containers, images or arguments changed")
			}
			if before.Namespace != after.Namespace {
				t.Errorf("namespace %s -> %s", before.Namespace, after.Namespace)
			}
		})
	}
}

// runPath spells a path under /var/run as under /run: on hosts and in images
// /var/run is a link to /run.
func runPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "/var/run/"); ok {
		return "/run/" + rest
	}
	return p
}

// TestMultusSeesTheDeviceInfoFiles: Multus, during CNI ADD, copies a VF's
// device-info file from /var/run/k8s.cni.cncf.io/devinfo/dp into the pod's
// network-status; with the component, that directory in its container is
// the host directory podres-proxy writes the files of its VFs to, whether
// or not Multus' own manifest mounted it.
func TestMultusSeesTheDeviceInfoFiles(t *testing.T) {
	const multusDir = "/run/k8s.cni.cncf.io/devinfo/dp" // nadutils' path, /var/run being /run
	base := find[appsv1.DaemonSet](t, renderDir(t, "base"), "DaemonSet", "podres-proxy")
	written := argValues(t, proxyContainer(t, base).Args)["device-info-dir"]
	if written == "" {
		t.Fatal("the DaemonSet does not set --device-info-dir")
	}
	for _, c := range consumers {
		if c.name != "multus-thick" {
			continue
		}
		ds := find[appsv1.DaemonSet](t, renderDir(t, c.dir), "DaemonSet", c.daemonSet)
		r, ok := resolve(t, &ds.Spec.Template.Spec, containerOf(t, ds, c.container), multusDir)
		if !ok || runPath(r.hostPath) != runPath(written) {
			t.Errorf("Multus reads %s from host %q (mounted: %v); podres-proxy writes %s", multusDir, r.hostPath, ok, written)
		}
	}
}

// TestDCGMExporterGivesEachSharerItsSeries: with the component, DCGM
// exporter runs in virtual-GPU mode, which reads the dcgm view's
// <uuid>::<slot> ids of a shared GPU's sharers as one series per pod.
func TestDCGMExporterGivesEachSharerItsSeries(t *testing.T) {
	for _, c := range consumers {
		if c.name != "dcgm-exporter" {
			continue
		}
		ds := find[appsv1.DaemonSet](t, renderDir(t, c.dir), "DaemonSet", c.daemonSet)
		on := false
		for _, e := range containerOf(t, ds, c.container).Env {
			on = on || e.Name == "KUBERNETES_VIRTUAL_GPUS" && e.Value == "true"
		}
		if !on {
			t.Error("dcgm-exporter runs without KUBERNETES_VIRTUAL_GPUS=true: a shared GPU's metrics go to one of its pods")
		}
	}
}

// TestRTEStillReadsTheKubeletConfig: RTE reads the kubelet's config.yaml
// (--kubelet-config-file) through its /var/lib/kubelet mount, which the
// component leaves in place beside podres-proxy's directory.
func TestRTEStillReadsTheKubeletConfig(t *testing.T) {
	for _, c := range consumers {
		if c.name != "resource-topology-exporter" {
			continue
		}
		ds := find[appsv1.DaemonSet](t, renderDir(t, c.dir), "DaemonSet", c.daemonSet)
		ctr := containerOf(t, ds, c.container)
		path, ok := goFlagValue(t, containerArgv(ctr), "kubelet-config-file")
		if !ok {
			t.Fatal("RTE is given no --kubelet-config-file")
		}
		if r, ok := resolve(t, &ds.Spec.Template.Spec, ctr, path); !ok || r.hostPath != "/var/lib/kubelet/config.yaml" {
			t.Errorf("RTE reads %s from host %q (mounted: %v), want the kubelet's /var/lib/kubelet/config.yaml", path, r.hostPath, ok)
		}
	}
}
