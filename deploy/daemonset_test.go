package deploy_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The paths and values the manifests and the binary must agree on.
const (
	proxySocket        = "/var/run/podres-proxy/pod-resources/kubelet.sock"
	kubeletPodResDir   = "/var/lib/kubelet/pod-resources"
	serviceAccountDir  = "/var/run/secrets/kubernetes.io/serviceaccount"
	proxyNamespace     = "podres-proxy"
	proxyName          = "podres-proxy"
	koordinatorGroup   = "scheduling.koordinator.sh"
	deviceCRFlagOffArg = "--device-cr=false"
	// The socket `podres-proxy probe` asks by default, which the DaemonSet's
	// exec probes rely on, and the emptyDir volume it sits in.
	probeSocket     = "/var/run/podres-proxy-probe/probe.sock"
	probeVolumeName = "probe"
)

// argValues returns the --name=value arguments after the subcommand; a
// later one wins, as with Go's flag package. A bare --name is "true".
func argValues(t *testing.T, args []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("argument %q is not a --flag", a)
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			value = "true"
		}
		out[name] = value
	}
	return out
}

// proxyContainer returns the DaemonSet's one container.
func proxyContainer(t *testing.T, ds *appsv1.DaemonSet) *corev1.Container {
	t.Helper()
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 1 || len(ds.Spec.Template.Spec.InitContainers) != 0 {
		t.Fatalf("want exactly one container and no init containers, got %d and %d", len(cs), len(ds.Spec.Template.Spec.InitContainers))
	}
	return &cs[0]
}

// resolved is where a path inside a container comes from.
type resolved struct {
	mount    *corev1.VolumeMount
	volume   *corev1.Volume
	hostPath string // "" when the volume is not a hostPath
}

// resolve finds the mount that serves path inside container c (the longest
// mount path that is path or one of its parents) and the host path behind
// it. ok is false when no volume is mounted there: the path is the image's.
func resolve(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, path string) (resolved, bool) {
	t.Helper()
	var best *corev1.VolumeMount
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		mp := filepath.Clean(m.MountPath)
		if (path == mp || strings.HasPrefix(path, strings.TrimSuffix(mp, "/")+"/")) &&
			(best == nil || len(mp) > len(filepath.Clean(best.MountPath))) {
			best = m
		}
	}
	if best == nil {
		return resolved{}, false
	}
	var vol *corev1.Volume
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == best.Name {
			vol = &spec.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("container %s mounts volume %q, which the pod does not define", c.Name, best.Name)
	}
	r := resolved{mount: best, volume: vol}
	if vol.HostPath != nil {
		rel, err := filepath.Rel(filepath.Clean(best.MountPath), path)
		if err != nil {
			t.Fatal(err)
		}
		r.hostPath = filepath.Join(vol.HostPath.Path, best.SubPath, rel)
	}
	return r, true
}

// hostPathType names a hostPath volume's type ("" when unset: no check).
func hostPathType(v *corev1.Volume) string {
	if v.HostPath == nil || v.HostPath.Type == nil {
		return ""
	}
	return string(*v.HostPath.Type)
}

func isDirectoryType(v *corev1.Volume) bool {
	return v.HostPath != nil && v.HostPath.Type != nil &&
		(*v.HostPath.Type == corev1.HostPathDirectory || *v.HostPath.Type == corev1.HostPathDirectoryOrCreate)
}

func TestClusterRoleIsLeastPrivilege(t *testing.T) {
	all := renderAll(t)
	dss := proxyDaemonSets(t, all)
	for _, r := range all {
		ds := dss[r.dir]
		if ds == nil {
			continue
		}
		t.Run(r.dir, func(t *testing.T) {
			role := find[rbacv1.ClusterRole](t, r.objects, "ClusterRole", proxyName)
			if role.AggregationRule != nil {
				t.Error("the ClusterRole aggregates other roles")
			}
			var got []string
			for _, rule := range role.Rules {
				if len(rule.NonResourceURLs) > 0 {
					t.Errorf("rule grants non-resource URLs %v", rule.NonResourceURLs)
				}
				if len(rule.ResourceNames) > 0 {
					t.Errorf("rule limits resource names %v: the role is shared by every node's pod", rule.ResourceNames)
				}
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						got = append(got, fmt.Sprintf("%s %s/%s", rule.Verbs, g, res))
					}
				}
			}
			slices.Sort(got)
			want := []string{"[get] /nodes/pods"}
			args := argValues(t, proxyContainer(t, ds).Args)
			if args["device-cr"] != "false" {
				// The Device object's watch is on: without the rule it
				// gets 403.
				want = append(want, "[list watch] "+koordinatorGroup+"/devices")
			}
			if args["events"] != "false" {
				// Events are only written: created, and patched as a series.
				want = append(want, "[create patch] events.k8s.io/events")
			}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("ClusterRole grants %q, want exactly %q (never nodes/proxy, never a wildcard)", got, want)
			}

			b := find[rbacv1.ClusterRoleBinding](t, r.objects, "ClusterRoleBinding", proxyName)
			if b.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}) {
				t.Errorf("binding refers to %+v, want ClusterRole %s", b.RoleRef, role.Name)
			}
			wantSubject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: ds.Spec.Template.Spec.ServiceAccountName, Namespace: ds.Namespace}
			if len(b.Subjects) != 1 || b.Subjects[0] != wantSubject {
				t.Errorf("binding subjects %+v, want only %+v", b.Subjects, wantSubject)
			}
			sa := find[corev1.ServiceAccount](t, r.objects, "ServiceAccount", wantSubject.Name)
			if sa.Namespace != ds.Namespace {
				t.Errorf("service account in namespace %q, DaemonSet in %q", sa.Namespace, ds.Namespace)
			}
		})
	}
}

func TestDaemonSetMountsOnlyDirectories(t *testing.T) {
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			spec := &ds.Spec.Template.Spec
			c := proxyContainer(t, ds)
			for i := range spec.Volumes {
				v := &spec.Volumes[i]
				if v.Name == probeVolumeName && v.EmptyDir != nil {
					continue // the pod's own probe socket (TestDaemonSetProbesAskThePodsOwnSocket)
				}
				if v.HostPath == nil {
					t.Errorf("volume %s is not a hostPath: nothing else is needed but the probe's emptyDir", v.Name)
					continue
				}
				if !isDirectoryType(v) {
					t.Errorf("hostPath volume %s (%s) has type %q, want Directory or DirectoryOrCreate: a socket file mount loses the socket when its owner re-creates it",
						v.Name, v.HostPath.Path, hostPathType(v))
				}
			}
			for _, m := range c.VolumeMounts {
				if m.SubPath != "" || m.SubPathExpr != "" {
					t.Errorf("mount %s uses a subPath", m.Name)
				}
				r, _ := resolve(t, spec, c, m.MountPath)
				if r.volume.EmptyDir != nil {
					continue
				}
				if r.hostPath != m.MountPath {
					t.Errorf("mount %s shows host %s at %s: every path must be the same inside and on the host, so socket paths are too",
						m.Name, r.hostPath, m.MountPath)
				}
				if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
					t.Errorf("mount %s is Bidirectional, which needs a privileged container", m.Name)
				}
			}
		})
	}
}

func TestDaemonSetFlagsPointIntoTheirMounts(t *testing.T) {
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			spec := &ds.Spec.Template.Spec
			c := proxyContainer(t, ds)
			if len(c.Command) != 0 {
				t.Errorf("command %q overrides the image's entrypoint /podres-proxy", c.Command)
			}
			if len(c.Args) == 0 || c.Args[0] != "serve" {
				t.Fatalf("args %q do not start with the serve subcommand", c.Args)
			}
			args := argValues(t, c.Args)

			// Each socket sits in a mounted host directory (not a file mount),
			// writable only where podres-proxy creates something.
			type want struct {
				flag     string
				path     string
				writable bool
			}
			cri, ok := strings.CutPrefix(args["cri-socket"], "unix://")
			if !ok {
				t.Errorf("--cri-socket=%q is not a unix:// endpoint", args["cri-socket"])
			}
			for _, w := range []want{
				{"socket", filepath.Dir(args["socket"]), true},
				{"kubelet-socket", filepath.Dir(args["kubelet-socket"]), false},
				{"state-dir", args["state-dir"], true},
				{"device-info-dir", args["device-info-dir"], true},
				{"nri-socket", filepath.Dir(args["nri-socket"]), false},
				{"cri-socket", filepath.Dir(cri), false},
			} {
				if w.path == "" || w.path == "." {
					t.Errorf("--%s is not set: the mounts depend on it, so the manifest must say it", w.flag)
					continue
				}
				r, ok := resolve(t, spec, c, w.path)
				if !ok || r.hostPath == "" {
					t.Errorf("--%s: %s is not on a hostPath mount", w.flag, w.path)
					continue
				}
				if r.hostPath != w.path {
					t.Errorf("--%s: %s comes from host %s", w.flag, w.path, r.hostPath)
				}
				if w.writable && r.mount.ReadOnly {
					t.Errorf("--%s: mount %s is read-only, but podres-proxy writes there", w.flag, r.mount.Name)
				}
				if !w.writable && !r.mount.ReadOnly {
					t.Errorf("--%s: mount %s is writable; podres-proxy only connects there, mount it read-only", w.flag, r.mount.Name)
				}
			}
			// The runtime's directory holds every container's root filesystem
			// mount; without HostToContainer this pod would pin them.
			if r, ok := resolve(t, spec, c, filepath.Dir(cri)); ok &&
				(r.mount.MountPropagation == nil || *r.mount.MountPropagation != corev1.MountPropagationHostToContainer) {
				t.Errorf("the CRI socket's mount %s is not HostToContainer", r.mount.Name)
			}
			if args["socket"] != proxySocket {
				t.Errorf("--socket=%s, want %s (the consumers' components mount its directory)", args["socket"], proxySocket)
			}
			if r, ok := resolve(t, spec, c, filepath.Dir(args["kubelet-socket"])); ok &&
				(r.hostPath != kubeletPodResDir || hostPathType(r.volume) != string(corev1.HostPathDirectory)) {
				t.Errorf("the kubelet's socket directory comes from %s (type %q), want %s of type Directory: the kubelet creates it",
					r.hostPath, hostPathType(r.volume), kubeletPodResDir)
			}

			// A CA file, if given, is the service account's, which the pod gets
			// by automounting; --kubelet-insecure-tls stands alone.
			if ca, ok := args["kubelet-ca-file"]; ok {
				if filepath.Dir(ca) != serviceAccountDir {
					t.Errorf("--kubelet-ca-file=%s is not in the service-account mount %s", ca, serviceAccountDir)
				}
				if _, shadowed := resolve(t, spec, c, ca); shadowed {
					t.Errorf("a volume is mounted over %s", ca)
				}
				if _, both := args["kubelet-insecure-tls"]; both {
					t.Error("both --kubelet-ca-file and --kubelet-insecure-tls: the CA file would be ignored")
				}
			}
			if am := spec.AutomountServiceAccountToken; am != nil && !*am {
				t.Error("automountServiceAccountToken is false: /pods and the Device object need the token")
			}
			// The /pods URL is left to the binary, which builds it from
			// NODE_IP (and brackets IPv6 addresses).
			if u, ok := args["kubelet-pods-url"]; ok {
				t.Errorf("--kubelet-pods-url=%s is set; leave it to the NODE_IP default", u)
			}
		})
	}
}

func TestDaemonSetTakesNodeIdentityFromTheDownwardAPI(t *testing.T) {
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			env := map[string]corev1.EnvVar{}
			for _, e := range proxyContainer(t, ds).Env {
				env[e.Name] = e
			}
			for name, field := range map[string]string{"NODE_IP": "status.hostIP", "NODE_NAME": "spec.nodeName"} {
				e := env[name]
				if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
					t.Errorf("env %s = %+v, want the downward API's %s", name, e, field)
				}
			}
		})
	}
}

func TestDaemonSetProbesAskThePodsOwnSocket(t *testing.T) {
	// During a rollout the new pod runs beside the old one on the host
	// network (maxSurge): a probe on the shared metrics port could be answered
	// by the old pod, so each probe execs the binary against the socket serve
	// creates in the pod's own emptyDir. And no containerPort: on the host
	// network it is a host port, and the scheduler keeps the surge pod off a
	// node whose old pod declares it (kubernetes issue 106417).
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			spec := &ds.Spec.Template.Spec
			c := proxyContainer(t, ds)
			if len(c.Ports) != 0 {
				t.Errorf("ports %+v declared: on the host network each is a host port, which blocks the surge pod (kubernetes issue 106417)", c.Ports)
			}
			if got := argValues(t, c.Args)["probe-socket"]; got != probeSocket {
				t.Errorf("--probe-socket=%q, want %s, where `podres-proxy probe` asks by default", got, probeSocket)
			}
			r, ok := resolve(t, spec, c, filepath.Dir(probeSocket))
			if !ok || r.volume.EmptyDir == nil || r.mount.MountPath != filepath.Dir(probeSocket) {
				t.Errorf("%s is not the mount of an emptyDir: the probe socket must be this pod's own", filepath.Dir(probeSocket))
			} else if r.mount.ReadOnly {
				t.Errorf("mount %s is read-only; serve creates the probe socket there", r.mount.Name)
			}
			for _, p := range []struct {
				name  string
				probe *corev1.Probe
				path  string
			}{{"liveness", c.LivenessProbe, "healthz"}, {"readiness", c.ReadinessProbe, "readyz"}} {
				if p.probe == nil || p.probe.Exec == nil {
					t.Errorf("%s probe is not an exec probe: %+v", p.name, p.probe)
					continue
				}
				if want := []string{"/podres-proxy", "probe", p.path}; !slices.Equal(p.probe.Exec.Command, want) {
					t.Errorf("%s probe runs %q, want %q", p.name, p.probe.Exec.Command, want)
				}
				if p.probe.TimeoutSeconds < 4 {
					t.Errorf("%s probe's timeout %ds is under the probe command's own 3 s", p.name, p.probe.TimeoutSeconds)
				}
			}
			// The metrics server stays on the node's loopback, which only the
			// host network makes reachable (it is no probe's target any more).
			if host, _, err := net.SplitHostPort(argValues(t, c.Args)["metrics-addr"]); err != nil || host != "127.0.0.1" || !spec.HostNetwork {
				t.Errorf("--metrics-addr=%q (hostNetwork %v), want the node's 127.0.0.1", argValues(t, c.Args)["metrics-addr"], spec.HostNetwork)
			}
		})
	}
}

func TestBaseAppendsTheProbeSocketAfterThePositionalArguments(t *testing.T) {
	// The components patch the base's arguments by position (a test op, then
	// replace) and append theirs: --probe-socket is the base's last argument,
	// so no index a component tests moved.
	ds := proxyDaemonSets(t, renderAll(t))["base"]
	if ds == nil {
		t.Fatal("deploy/base renders no podres-proxy DaemonSet")
	}
	args := proxyContainer(t, ds).Args
	if last := args[len(args)-1]; last != "--probe-socket="+probeSocket {
		t.Errorf("the base's last argument is %q, want --probe-socket=%s", last, probeSocket)
	}
}

func TestDaemonSetRunsWithoutPrivileges(t *testing.T) {
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			spec := &ds.Spec.Template.Spec
			c := proxyContainer(t, ds)
			if spec.HostPID || spec.HostIPC {
				t.Errorf("hostPID %v, hostIPC %v: neither is needed", spec.HostPID, spec.HostIPC)
			}
			if !spec.HostNetwork {
				t.Error("hostNetwork is off: podres-proxy must not depend on the CNI that asks it (deploy/README.md)")
			}
			if psc := spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Error("pod seccomp profile is not RuntimeDefault")
			}
			sc := c.SecurityContext
			if sc == nil {
				t.Fatal("container has no securityContext")
			}
			if sc.Privileged == nil || *sc.Privileged {
				t.Error("container is (or may default to) privileged")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("allowPrivilegeEscalation is not false")
			}
			if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
				t.Error("root filesystem is writable")
			}
			if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
				t.Errorf("capabilities %+v, want all dropped and none added", sc.Capabilities)
			}
			if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
				t.Error("runAsUser is not 0: the sockets it connects to are root's, in root-only directories")
			}
			if sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
				t.Error("container seccomp is Unconfined")
			}
		})
	}
}

func TestDaemonSetIsANodeAgent(t *testing.T) {
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			spec := &ds.Spec.Template.Spec
			if ds.Namespace != proxyNamespace {
				t.Errorf("namespace %q, want %q", ds.Namespace, proxyNamespace)
			}
			if spec.PriorityClassName != "system-node-critical" {
				t.Errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
			}
			tolerateAll := false
			for _, tol := range spec.Tolerations {
				if tol.Operator == corev1.TolerationOpExists && tol.Key == "" && tol.Effect == "" {
					tolerateAll = true
				}
			}
			if !tolerateAll {
				t.Errorf("tolerations %+v do not tolerate every taint", spec.Tolerations)
			}
			// The new pod starts beside the old one and takes the socket over
			// before the old one is deleted (deploy/README.md, "Upgrades").
			u := ds.Spec.UpdateStrategy
			if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
				u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.String() != "0" ||
				u.RollingUpdate.MaxSurge == nil || u.RollingUpdate.MaxSurge.String() != "1" {
				t.Errorf("update strategy %+v, want RollingUpdate with maxSurge 1, maxUnavailable 0", u)
			}
			// serve's shutdown (NRI left, gRPC stopped gracefully, the store
			// flushed, the lock released) must end before the kubelet's SIGKILL.
			if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < serveShutdownGrace(t)+5*time.Second {
				t.Errorf("terminationGracePeriodSeconds %v does not cover serve's shutdown (%s) with 5 s to spare", g, serveShutdownGrace(t))
			}
			if ds.Spec.Selector == nil || !labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
				t.Errorf("selector %v does not match the template's labels %v", ds.Spec.Selector, ds.Spec.Template.Labels)
			}
		})
	}
}

// serveShutdownGrace reads serve's bound on its shutdown from its source.
func serveShutdownGrace(t *testing.T) time.Duration {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(repoRoot, "cmd", "podres-proxy", "serve.go"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^const shutdownGrace = (\d+) \* time\.Second$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("cmd/podres-proxy/serve.go no longer has `const shutdownGrace = N * time.Second`")
	}
	n, err := strconv.Atoi(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(n) * time.Second
}

func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestDaemonSetHasRequestsAndAMemoryLimit(t *testing.T) {
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		t.Run(dir, func(t *testing.T) {
			c := proxyContainer(t, ds)
			req, lim := c.Resources.Requests, c.Resources.Limits
			cpu, mem := req[corev1.ResourceCPU], req[corev1.ResourceMemory]
			if cpu.IsZero() || mem.IsZero() {
				t.Errorf("requests %v, want cpu and memory", req)
			}
			memLimit, ok := lim[corev1.ResourceMemory]
			if !ok || memLimit.Cmp(mem) < 0 {
				t.Errorf("memory limit %v, want one at least the request %v", lim, mem.String())
			}
			// GOMEMLIMIT must sit under the container's limit, or the kernel
			// kills the process before the Go runtime tries to stay under it.
			for _, e := range c.Env {
				if e.Name != "GOMEMLIMIT" {
					continue
				}
				soft, err := resource.ParseQuantity(strings.TrimSuffix(e.Value, "B"))
				if err != nil {
					t.Fatalf("GOMEMLIMIT=%q: %v", e.Value, err)
				}
				if soft.Cmp(memLimit) >= 0 || soft.Cmp(mem) < 0 {
					t.Errorf("GOMEMLIMIT=%s, want between the memory request %s and the limit %s", e.Value, mem.String(), memLimit.String())
				}
			}
		})
	}
}
