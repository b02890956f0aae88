package deploy_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// chartDir is the Helm chart, which must render what the kustomizations do.
var chartDir = filepath.Join(deployDir, "helm", "podres-proxy")

// chartNamespace is the namespace the chart is rendered into, deploy/base's.
const chartNamespace = "podres-proxy"

// renderChart renders the chart with values as `helm template --namespace
// podres-proxy podres-proxy deploy/helm/podres-proxy` does, and decodes
// every object strictly into its k8s.io/api type.
func renderChart(values map[string]any) ([]object, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("loading the chart: %w", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"}
	if err := chartutil.ProcessDependencies(ch, values); err != nil {
		return nil, fmt.Errorf("chart dependencies: %w", err)
	}
	vals, err := chartutil.ToRenderValues(ch, values,
		chartutil.ReleaseOptions{Name: "podres-proxy", Namespace: chartNamespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("rendering the chart: %w", err)
	}
	var out []object
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		docs := releaseutil.SplitManifests(files[name])
		for _, key := range slices.Sorted(maps.Keys(docs)) {
			doc := docs[key]
			if strings.TrimSpace(doc) == "" {
				continue
			}
			data, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if string(data) == "null" {
				continue
			}
			o, err := decodeStrict(data)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			out = append(out, o)
		}
	}
	return out, nil
}

// helmLabels are the chart's bookkeeping labels, which kustomize does not
// write: the only difference normalise removes.
var helmLabels = []string{"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}

// normalise turns rendered objects into comparable JSON values keyed by
// kind/namespace/name, with Helm's bookkeeping labels removed from the
// objects' and the pod templates' metadata (and an empty labels map with
// them).
func normalise(t *testing.T, objs []object) map[string]any {
	t.Helper()
	out := map[string]any{}
	for _, o := range objs {
		data, err := json.Marshal(o.value)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		dropLabels(v)
		if spec, ok := v["spec"].(map[string]any); ok {
			if tmpl, ok := spec["template"].(map[string]any); ok {
				dropLabels(tmpl)
			}
		}
		key := o.kind + " " + o.namespace + "/" + o.name
		if _, dup := out[key]; dup {
			t.Fatalf("%s rendered twice", key)
		}
		out[key] = v
	}
	return out
}

func dropLabels(v map[string]any) {
	meta, ok := v["metadata"].(map[string]any)
	if !ok {
		return
	}
	labels, ok := meta["labels"].(map[string]any)
	if !ok {
		return
	}
	for _, l := range helmLabels {
		delete(labels, l)
	}
	if len(labels) == 0 {
		delete(meta, "labels")
	}
}

// differences lists, one line each, where two normalised renderings differ:
// objects only one has, and the first differing JSON path of each object
// both have.
func differences(kustomize, helm map[string]any) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(kustomize)) {
		h, ok := helm[k]
		if !ok {
			out = append(out, k+": only in the kustomization")
			continue
		}
		if p := firstDiff(k, kustomize[k], h); p != "" {
			out = append(out, p)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(helm)) {
		if _, ok := kustomize[k]; !ok {
			out = append(out, k+": only in the chart")
		}
	}
	return out
}

// firstDiff describes the first place where a and b differ, or "".
func firstDiff(path string, a, b any) string {
	if reflect.DeepEqual(a, b) {
		return ""
	}
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		keys := slices.Sorted(maps.Keys(av))
		for _, k := range slices.Sorted(maps.Keys(bv)) {
			if _, ok := av[k]; !ok {
				keys = append(keys, k)
			}
		}
		for _, k := range keys {
			if d := firstDiff(path+"."+k, av[k], bv[k]); d != "" {
				return d
			}
		}
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		for i := range av {
			if d := firstDiff(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i]); d != "" {
				return d
			}
		}
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return fmt.Sprintf("%s: kustomize %s, chart %s", path, ja, jb)
}

// chartEquivalents are the chart's values that stand for each kustomization
// under deploy/ that installs podres-proxy (the base, and the base with its
// components).
// createNamespace: true makes the chart render the Namespace object the
// kustomize base has (helm install needs the namespace to exist already).
var chartEquivalents = map[string]map[string]any{
	"base":                                {"createNamespace": true},
	"testdata/cri-o":                      {"createNamespace": true, "runtime": "cri-o"},
	"testdata/kubelet-insecure-tls":       {"createNamespace": true, "kubelet": map[string]any{"insecureTLS": true}},
	"testdata/without-koordinator-device": {"createNamespace": true, "koordinatorDevice": false},
	"testdata/admission-policy":           {"createNamespace": true, "admissionPolicy": map[string]any{"enabled": true}},
	"testdata/dra-legacy-view":            {"createNamespace": true, "legacyView": map[string]any{"enabled": true}},
	"testdata/monitoring":                 {"createNamespace": true, "monitoring": chartMonitoring},
	"testdata/podmonitor":                 {"createNamespace": true, "monitoring": chartScraped},
	"testdata/views": {"createNamespace": true, "views": map[string]any{
		"dcgm": map[string]any{"enabled": true}, "plain": map[string]any{"enabled": true}, "kata": map[string]any{"enabled": true}}},
	"testdata/all-components": {
		"createNamespace":   true,
		"runtime":           "cri-o",
		"kubelet":           map[string]any{"insecureTLS": true},
		"koordinatorDevice": false,
		"admissionPolicy":   map[string]any{"enabled": true},
		"legacyView":        map[string]any{"enabled": true},
		"monitoring":        chartScraped,
		"image":             map[string]any{"repository": "registry.example.com/podres-proxy", "tag": "v0.1.0"},
	},
}

func TestChartRendersWhatTheKustomizationsDo(t *testing.T) {
	// Every kustomization that deploys podres-proxy has its chart values here,
	// so a new component cannot be added without the chart learning it.
	for dir := range proxyDaemonSets(t, renderAll(t)) {
		if _, ok := chartEquivalents[filepath.ToSlash(dir)]; !ok {
			t.Errorf("%s deploys podres-proxy but has no chart values in chartEquivalents", dir)
		}
	}
	for dir, values := range chartEquivalents {
		t.Run(dir, func(t *testing.T) {
			want := normalise(t, renderDir(t, dir))
			objs, err := renderChart(values)
			if err != nil {
				t.Fatal(err)
			}
			if d := differences(want, normalise(t, objs)); len(d) > 0 {
				t.Errorf("the chart with %v differs from kustomize build %s:\n  %s", values, dir, strings.Join(d, "\n  "))
			}
		})
	}
}

func TestChartComparisonNoticesADivergence(t *testing.T) {
	// The comparison above must fail when the chart and the kustomization
	// disagree: one flag, one volume path, one object too many.
	base := normalise(t, renderDir(t, "base"))
	withNamespace := func(v map[string]any) map[string]any {
		if _, ok := v["createNamespace"]; !ok {
			v["createNamespace"] = true
		}
		return v
	}
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"another socket directory", map[string]any{"socketDir": "/run/elsewhere"}, "--socket=/run/elsewhere/kubelet.sock"},
		{"the CRI-O volume on a containerd base", map[string]any{"runtime": "cri-o"}, "/var/run/crio"},
		{"an object the base lacks", map[string]any{"admissionPolicy": map[string]any{"enabled": true}}, "only in the chart"},
		{"an extra flag", map[string]any{"extraArgs": []any{"--log-level=debug"}}, "args"},
		{"no namespace", map[string]any{"createNamespace": false}, "Namespace /podres-proxy: only in the kustomization"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := renderChart(withNamespace(tc.values))
			if err != nil {
				t.Fatal(err)
			}
			d := strings.Join(differences(base, normalise(t, objs)), "\n")
			if !strings.Contains(d, tc.want) {
				t.Errorf("differences = %q, want one mentioning %q", d, tc.want)
			}
		})
	}
}

func TestChartValuesBecomeFlagsServeAccepts(t *testing.T) {
	// The chart's values that no component covers (the socket directory,
	// allocators, resource and scheduler names) become flags serve accepts,
	// and the socket stays inside its mount.
	values := map[string]any{
		"socketDir":      "/run/podres",
		"allocators":     []any{"koordinator", "hami"},
		"resourceNames":  map[string]any{"gpu": "example.com/gpu", "rdma": "example.com/rdma", "fpga": "example.com/fpga"},
		"hamiResources":  "vgpu=nvidia.com/gpu",
		"schedulerNames": map[string]any{"koordinator": []any{"koord-scheduler", "default-scheduler"}, "hami": []any{"hami-scheduler"}, "volcano": []any{"volcano"}},
		"extraArgs":      []any{"--log-level=debug"},
	}
	ds, c, fs := chartServe(t, values)
	for flag, want := range map[string]string{
		"socket":                      "/run/podres/kubelet.sock",
		"allocators":                  "koordinator,hami",
		"gpu-resource-name":           "example.com/gpu",
		"rdma-resource-name":          "example.com/rdma",
		"fpga-resource-name":          "example.com/fpga",
		"hami-resources":              "vgpu=nvidia.com/gpu",
		"koordinator-scheduler-names": "koord-scheduler,default-scheduler",
		"hami-scheduler-names":        "hami-scheduler",
		"volcano-scheduler-names":     "volcano",
		"log-level":                   "debug",
	} {
		if got := fs.Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", flag, got, want)
		}
	}
	if _, ok := resolve(t, &ds.Spec.Template.Spec, c, "/run/podres/kubelet.sock"); !ok {
		t.Error("the socket at /run/podres/kubelet.sock is not inside a hostPath mount")
	}
}

func TestChartRefusesAnUnknownRuntime(t *testing.T) {
	_, err := renderChart(map[string]any{"runtime": "docker"})
	if err == nil || !strings.Contains(err.Error(), "runtime must be containerd or cri-o") {
		t.Errorf("rendering with runtime docker: err = %v, want the chart's refusal", err)
	}
}

func TestChartPodsAPIValue(t *testing.T) {
	// podsAPI.enabled (default true) mounts the kubelet's pods-api
	// directory, so that serve's default --kubelet-pods-api-socket is
	// inside a hostPath mount of the kubelet's own path; false passes
	// --kubelet-pods-api-socket= (serve reads /pods only) and mounts
	// nothing of the kubelet's Pods API.
	const socket = "/var/lib/kubelet/pods-api/pods-api.sock"
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   bool
	}{
		{"default", map[string]any{}, true},
		{"enabled", map[string]any{"podsAPI": map[string]any{"enabled": true}}, true},
		{"disabled", map[string]any{"podsAPI": map[string]any{"enabled": false}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, c, fs := chartServe(t, tc.values)
			flag := fs.Lookup("kubelet-pods-api-socket")
			if flag == nil {
				t.Fatal("serve has no --kubelet-pods-api-socket")
			}
			r, mounted := resolve(t, &ds.Spec.Template.Spec, c, socket)
			if tc.want {
				if flag.Changed {
					t.Errorf("--kubelet-pods-api-socket=%q is set; serve's default (%s) is the kubelet's path", flag.Value, socket)
				}
				if !mounted || r.hostPath != socket || !r.mount.ReadOnly || !isDirectoryType(r.volume) {
					t.Errorf("%s is not the host's, mounted read-only from a hostPath directory (mounted %v, host path %q)", socket, mounted, r.hostPath)
				}
				return
			}
			if !flag.Changed || flag.Value.String() != "" {
				t.Errorf("--kubelet-pods-api-socket is %q (set %v), want it set empty", flag.Value, flag.Changed)
			}
			if mounted {
				t.Errorf("%s is mounted (volume %s) although the Pods API is disabled", socket, r.volume.Name)
			}
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/var/lib/kubelet/pods-api") {
					t.Errorf("volume %s mounts the host's %s although the Pods API is disabled", v.Name, v.HostPath.Path)
				}
			}
		})
	}
}

func TestChartPodLogsDirValue(t *testing.T) {
	// kubeletPodLogsDir (default /var/log/pods, the kubelet's default
	// podLogsDir and serve's default --kubelet-pod-logs-dir) is mounted
	// read-only from the host's same path, and passed to serve when it is
	// not the default; empty mounts nothing and passes the flag empty.
	for _, tc := range []struct {
		name, value string
		values      map[string]any
	}{
		{"default", "/var/log/pods", map[string]any{}},
		{"another", "/data/kubelet-logs/pods", map[string]any{"kubeletPodLogsDir": "/data/kubelet-logs/pods"}},
		{"disabled", "", map[string]any{"kubeletPodLogsDir": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, c, fs := chartServe(t, tc.values)
			flag := fs.Lookup("kubelet-pod-logs-dir")
			if flag == nil {
				t.Fatal("serve has no --kubelet-pod-logs-dir")
			}
			switch got := flag.Value.String(); {
			case tc.value == "/var/log/pods" && flag.Changed:
				t.Errorf("--kubelet-pod-logs-dir=%q is set; serve's default is the kubelet's %s", got, tc.value)
			case tc.value != "/var/log/pods" && (!flag.Changed || got != tc.value):
				t.Errorf("serve's --kubelet-pod-logs-dir is %q (set %v), want %q", got, flag.Changed, tc.value)
			}
			var mounted []string
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.HostPath != nil && strings.Contains(v.HostPath.Path, "pods") && strings.Contains(v.HostPath.Path, "log") {
					mounted = append(mounted, v.HostPath.Path)
				}
			}
			if tc.value == "" {
				if len(mounted) != 0 {
					t.Errorf("pod logs directories %v are mounted although kubeletPodLogsDir is empty", mounted)
				}
				return
			}
			r, ok := resolve(t, &ds.Spec.Template.Spec, c, tc.value)
			if !ok || r.hostPath != tc.value || !r.mount.ReadOnly {
				t.Errorf("%s is not the host's, mounted read-only (mounted %v, host path %q)", tc.value, ok, r.hostPath)
			}
		})
	}
}

// chartServe renders the chart with values, and parses its DaemonSet's serve
// arguments as serve does.
func chartServe(t *testing.T, values map[string]any) (*appsv1.DaemonSet, *corev1.Container, *pflag.FlagSet) {
	t.Helper()
	objs, err := renderChart(values)
	if err != nil {
		t.Fatal(err)
	}
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "podres-proxy")
	c := proxyContainer(t, ds)
	fs := serveFlagSet(t, binary(t))
	if err := fs.Parse(c.Args[1:]); err != nil {
		t.Fatalf("podres-proxy serve refuses the chart's arguments: %v (args %q)", err, c.Args[1:])
	}
	return ds, c, fs
}
