// Package deploy_test checks the manifests under deploy/: it renders the
// kustomize base, its components and the consumer components with the
// kustomize library (as kubectl apply -k does), decodes every object strictly
// into its k8s.io/api type, and checks what the manifests promise: least
// privilege, directory mounts, flags the binary accepts, consumers that see
// podres-proxy's socket. It also parses the runtime configuration snippets
// and builds the binary the way the Dockerfile does.
package deploy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// rendered is the output of one kustomization, decoded.
type rendered struct {
	dir     string
	objects []object
}

// object is one decoded resource: its kind and the typed value.
type object struct {
	kind, namespace, name string
	value                 any
}

// newTyped maps apiVersion/kind to the k8s.io/api type a resource decodes
// into. A kind missing here fails the rendering test: every object the
// manifests create has to be checked as its real type.
var newTyped = map[string]func() any{
	"v1/Namespace": func() any { return &corev1.Namespace{} },
	"v1/ConfigMap": func() any { return &corev1.ConfigMap{} },
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy": func() any {
		return &admissionregistrationv1.ValidatingAdmissionPolicy{}
	},
	"admissionregistration.k8s.io/v1/ValidatingAdmissionPolicyBinding": func() any {
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	},
	"v1/ServiceAccount":                               func() any { return &corev1.ServiceAccount{} },
	"v1/ResourceQuota":                                func() any { return &corev1.ResourceQuota{} },
	"apps/v1/DaemonSet":                               func() any { return &appsv1.DaemonSet{} },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"scheduling.k8s.io/v1/PriorityClass":              func() any { return &schedulingv1.PriorityClass{} },
	"monitoring.coreos.com/v1/PrometheusRule":         func() any { return &prometheusRule{} },
	"monitoring.coreos.com/v1/PodMonitor":             func() any { return &podMonitor{} },
	"v1/Secret":                                       func() any { return &tokenSecret{} },
}

// deployDir is this package's directory: the tests run in it.
const deployDir = "."

// build renders the kustomization in dir, as kubectl apply -k would, from
// the given file system.
func build(fsys filesys.FileSystem, dir string) ([]object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []object
	for _, r := range m.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		o, err := decodeStrict(data)
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", r.GetKind(), r.GetNamespace(), r.GetName(), err)
		}
		out = append(out, o)
	}
	return out, nil
}

// decodeStrict decodes one resource into its k8s.io/api type, refusing
// fields the type does not have, as kubectl apply's strict field validation
// does.
func decodeStrict(data []byte) (object, error) {
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return object{}, err
	}
	mk := newTyped[meta.APIVersion+"/"+meta.Kind]
	if mk == nil {
		return object{}, fmt.Errorf("unexpected kind %s/%s: add it to newTyped and check it", meta.APIVersion, meta.Kind)
	}
	// The API server's own decoder: field names are case-sensitive, and
	// unknown or duplicate fields are errors.
	v := mk()
	strict, err := kjson.UnmarshalStrict(data, v)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		return object{}, fmt.Errorf("strict decoding into %T: %w", v, err)
	}
	return object{kind: meta.Kind, namespace: meta.Metadata.Namespace, name: meta.Metadata.Name, value: v}, nil
}

// kustomizationKind reads the kind of the kustomization file in dir
// (Kustomization, Component, or "" when dir has none) and its components.
func kustomizationKind(dir string) (kind string, components []string, err error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if os.IsNotExist(err) {
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	var k struct {
		Kind       string   `json:"kind"`
		Components []string `json:"components"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return "", nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	return k.Kind, k.Components, nil
}

var (
	renderOnce sync.Once
	renderOut  []rendered
	renderErrs []string
)

// renderAll renders every kustomization (not component) under deploy/, once
// per test run; the results are shared and must not be modified. It also
// reports the components no kustomization uses, which would otherwise go
// untested.
func renderAll(t *testing.T) []rendered {
	t.Helper()
	renderOnce.Do(func() { renderOut, renderErrs = renderEverything() })
	for _, e := range renderErrs {
		t.Error(e)
	}
	if len(renderErrs) > 0 {
		t.FailNow()
	}
	return renderOut
}

func renderEverything() ([]rendered, []string) {
	var errs, dirs, components []string
	used := map[string]bool{}
	err := filepath.WalkDir(deployDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		kind, comps, err := kustomizationKind(path)
		if err != nil {
			errs = append(errs, err.Error())
			return nil
		}
		switch kind {
		case "":
		case "Kustomization":
			dirs = append(dirs, path)
			for _, c := range comps {
				used[filepath.Clean(filepath.Join(path, c))] = true
			}
		case "Component":
			components = append(components, path)
		default:
			errs = append(errs, fmt.Sprintf("%s/kustomization.yaml: unexpected kind %q", path, kind))
		}
		return nil
	})
	if err != nil {
		return nil, append(errs, err.Error())
	}
	for _, c := range components {
		if !used[c] {
			errs = append(errs, fmt.Sprintf("component %s is not used by any kustomization under deploy/ (add one under testdata/), so it is never rendered", c))
		}
	}
	sort.Strings(dirs)
	var out []rendered
	for _, dir := range dirs {
		objs, err := build(filesys.MakeFsOnDisk(), dir)
		if err != nil {
			errs = append(errs, fmt.Sprintf("kustomize build %s: %v", dir, err))
			continue
		}
		out = append(out, rendered{dir: dir, objects: objs})
	}
	return out, errs
}

// renderDir renders one kustomization under deploy/.
func renderDir(t *testing.T, dir string) []object {
	t.Helper()
	objs, err := build(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return objs
}

// find returns the one object of that kind and name.
func find[T any](t *testing.T, objs []object, kind, name string) *T {
	t.Helper()
	var found *T
	for _, o := range objs {
		if o.kind == kind && o.name == name {
			if found != nil {
				t.Fatalf("two %s objects named %s", kind, name)
			}
			found = o.value.(*T)
		}
	}
	if found == nil {
		t.Fatalf("no %s named %s", kind, name)
	}
	return found
}

// proxyDaemonSets returns the podres-proxy DaemonSet of every rendering that
// has one (the base and every variant of it).
func proxyDaemonSets(t *testing.T, all []rendered) map[string]*appsv1.DaemonSet {
	t.Helper()
	out := map[string]*appsv1.DaemonSet{}
	for _, r := range all {
		for _, o := range r.objects {
			if o.kind == "DaemonSet" && o.name == "podres-proxy" {
				out[r.dir] = o.value.(*appsv1.DaemonSet)
			}
		}
	}
	if _, ok := out["base"]; !ok {
		t.Fatal("the base renders no DaemonSet podres-proxy")
	}
	return out
}

func TestEveryKustomizationRendersIntoKnownTypes(t *testing.T) {
	all := renderAll(t)
	var dirs []string
	for _, r := range all {
		dirs = append(dirs, r.dir)
		if len(r.objects) == 0 {
			t.Errorf("%s renders nothing", r.dir)
		}
	}
	// The base and each way of using the components must be among them.
	for _, want := range []string{
		"base",
		"testdata/multus-thick",
		"testdata/dcgm-exporter",
		"testdata/cri-o",
		"testdata/kubelet-insecure-tls",
		"testdata/without-koordinator-device",
		"testdata/all-components",
		"testdata/admission-policy",
		"testdata/dra-legacy-view",
		"testdata/monitoring",
	} {
		if !slices.Contains(dirs, want) {
			t.Errorf("%s was not rendered (rendered: %v)", want, dirs)
		}
	}
}

func TestBaseHasExactlyTheObjectsItNeeds(t *testing.T) {
	objs := renderDir(t, "base")
	var got []string
	for _, o := range objs {
		got = append(got, fmt.Sprintf("%s %s/%s", o.kind, o.namespace, o.name))
	}
	sort.Strings(got)
	want := []string{
		"ClusterRole /podres-proxy",
		"ClusterRoleBinding /podres-proxy",
		"DaemonSet podres-proxy/podres-proxy",
		"Namespace /podres-proxy",
		"ResourceQuota podres-proxy/podres-proxy-critical-pods",
		"ServiceAccount podres-proxy/podres-proxy",
	}
	if !slices.Equal(got, want) {
		t.Errorf("base objects:\n got %q\nwant %q", got, want)
	}
}

func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	// The decoder every other test relies on must catch a misspelt field.
	_, err := decodeStrict([]byte(`{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"x"},"spec":{"template":{"spec":{"hostNetwrok":true}}}}`))
	if err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
		t.Errorf("decoding a DaemonSet with hostNetwrok: err = %v, want an unknown-field error", err)
	}
	// Field names are case-sensitive, as in the API server.
	_, err = decodeStrict([]byte(`{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"x"},"spec":{"template":{"spec":{"HostNetwork":true}}}}`))
	if err == nil || !strings.Contains(err.Error(), "HostNetwork") {
		t.Errorf("decoding a DaemonSet with HostNetwork: err = %v, want an unknown-field error", err)
	}
	// A Secret only as a service account token's shell, which the API
	// server fills: the manifests carry no secret material.
	_, err = decodeStrict([]byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"},"type":"Opaque","data":{"password":"aHVudGVyMg=="}}`))
	if err == nil || !strings.Contains(err.Error(), "data") {
		t.Errorf("decoding a Secret with data: err = %v, want an unknown-field error: the manifests must carry no secret material", err)
	}
	_, err = decodeStrict([]byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"},"type":"Opaque"}`))
	if err == nil || !strings.Contains(err.Error(), "Opaque") {
		t.Errorf("decoding an Opaque Secret: err = %v, want it refused: only a service account token's shell", err)
	}
}

func TestNamespaceAllowsHostNetworkAndHostPath(t *testing.T) {
	ns := find[corev1.Namespace](t, renderDir(t, "base"), "Namespace", "podres-proxy")
	// Baseline forbids host namespaces and hostPath volumes; without the
	// privileged level the DaemonSet's pods are rejected at admission.
	if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
		t.Errorf("namespace enforce level = %q, want privileged", got)
	}
}

func TestCriticalPriorityIsCoveredByTheQuota(t *testing.T) {
	objs := renderDir(t, "base")
	ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "podres-proxy")
	q := find[corev1.ResourceQuota](t, objs, "ResourceQuota", "podres-proxy-critical-pods")
	pc := ds.Spec.Template.Spec.PriorityClassName
	if pc != "system-node-critical" {
		t.Errorf("priorityClassName = %q, want system-node-critical", pc)
	}
	if q.Namespace != ds.Namespace {
		t.Errorf("quota in namespace %q, DaemonSet in %q", q.Namespace, ds.Namespace)
	}
	sel := q.Spec.ScopeSelector
	ok := sel != nil && len(sel.MatchExpressions) == 1 &&
		sel.MatchExpressions[0].ScopeName == corev1.ResourceQuotaScopePriorityClass &&
		sel.MatchExpressions[0].Operator == corev1.ScopeSelectorOpIn &&
		slices.Contains(sel.MatchExpressions[0].Values, pc)
	if !ok {
		t.Errorf("quota scope %+v does not select priority class %s", sel, pc)
	}
	if pods := q.Spec.Hard[corev1.ResourcePods]; pods.Value() < 5000 {
		t.Errorf("quota allows %s pods, want one per node of the largest cluster (5000)", pods.String())
	}
}

func TestImageCanBeOverridden(t *testing.T) {
	image := func(dir string) string {
		ds := find[appsv1.DaemonSet](t, renderDir(t, dir), "DaemonSet", "podres-proxy")
		return ds.Spec.Template.Spec.Containers[0].Image
	}
	if got := image("base"); got != "podres-proxy:latest" {
		t.Errorf("base image = %q, want podres-proxy:latest", got)
	}
	if got := image("testdata/all-components"); got != "registry.example.com/podres-proxy:v0.1.0" {
		t.Errorf("image with an images: override = %q, want registry.example.com/podres-proxy:v0.1.0", got)
	}
}
