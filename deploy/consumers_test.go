package deploy_test

import (
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
// the socket path it opens (consumerSocket when empty) and the view it
// must see (docs/views.md).
type consumer struct {
	name, dir, standin   string
	daemonSet, container string
	socket               string
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
}

// openedSocket is the socket path c's container opens by default.
func (c consumer) openedSocket() string {
	if c.socket != "" {
		return c.socket
	}
	return consumerSocket
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
			r, _ := socketSeenBy(t, ds, containerOf(t, ds, c.container), c.openedSocket())
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
			r, path := socketSeenBy(t, ds, ctr, c.openedSocket())
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
	// Apart from the pod-resources mount, a consumer keeps its containers,
	// images, arguments and other mounts.
	for _, c := range consumers {
		t.Run(c.name, func(t *testing.T) {
			before := find[appsv1.DaemonSet](t, renderStandin(t, c), "DaemonSet", c.daemonSet)
			after := find[appsv1.DaemonSet](t, renderDir(t, c.dir), "DaemonSet", c.daemonSet)
			mounts := func(ds *appsv1.DaemonSet) map[string]string {
				out := map[string]string{}
				ctr := containerOf(t, ds, c.container)
				for _, m := range ctr.VolumeMounts {
					if strings.HasPrefix(m.MountPath, "/var/lib/kubelet") || strings.HasPrefix(c.openedSocket(), m.MountPath) {
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
			if cb.Image != ca.Image || strings.Join(cb.Args, " ") != strings.Join(ca.Args, " ") ||
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
