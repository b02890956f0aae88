package deploy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/ext"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/podres-proxy/podres-proxy/allocator/hami"
	koordfmt "github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
)

// This file checks deploy/components/admission-policy: that it renders into
// a policy, its binding and the writers' ConfigMap that refer to each other,
// and that its CEL, evaluated as the API server evaluates a
// ValidatingAdmissionPolicy (variables in order, then each validation),
// denies what a tenant could forge and allows what the schedulers write.

const (
	tenant        = "system:serviceaccount:team-a:default"
	koordinator   = "system:serviceaccount:koordinator-system:koord-scheduler"
	hamiScheduler = "system:serviceaccount:kube-system:hami-scheduler"
	hamiPlugin    = "system:serviceaccount:kube-system:hami-device-plugin"
	rsController  = "system:serviceaccount:kube-system:replicaset-controller"
)

// admissionPolicy is the rendered component.
type admissionPolicy struct {
	policy  *admissionregistrationv1.ValidatingAdmissionPolicy
	binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	writers *corev1.ConfigMap
}

func renderAdmissionPolicy(t *testing.T) admissionPolicy {
	t.Helper()
	objs := renderDir(t, "testdata/admission-policy")
	return admissionPolicy{
		policy:  find[admissionregistrationv1.ValidatingAdmissionPolicy](t, objs, "ValidatingAdmissionPolicy", "podres-proxy-allocation-annotations"),
		binding: find[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, objs, "ValidatingAdmissionPolicyBinding", "podres-proxy-allocation-annotations"),
		writers: find[corev1.ConfigMap](t, objs, "ConfigMap", "podres-proxy-allocation-writers"),
	}
}

func TestAdmissionPolicyPartsReferToEachOther(t *testing.T) {
	ap := renderAdmissionPolicy(t)
	b := ap.binding.Spec
	if b.PolicyName != ap.policy.Name {
		t.Errorf("binding names policy %q, the policy is %q", b.PolicyName, ap.policy.Name)
	}
	if !slices.Equal(b.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding's validationActions = %v, want [Deny]: anything else lets forged annotations in", b.ValidationActions)
	}
	// kustomize's namespace transformer does not rewrite paramRef: the
	// binding must name the namespace the ConfigMap is rendered into.
	if b.ParamRef == nil || b.ParamRef.Name != ap.writers.Name || b.ParamRef.Namespace != ap.writers.Namespace {
		t.Errorf("binding's paramRef = %+v, want the ConfigMap %s/%s", b.ParamRef, ap.writers.Namespace, ap.writers.Name)
	}
	if b.ParamRef == nil || b.ParamRef.ParameterNotFoundAction == nil || *b.ParamRef.ParameterNotFoundAction != admissionregistrationv1.DenyAction {
		t.Error("a missing writers ConfigMap must deny (fail closed), not allow")
	}
	pk := ap.policy.Spec.ParamKind
	if pk == nil || pk.APIVersion != "v1" || pk.Kind != "ConfigMap" {
		t.Errorf("paramKind = %+v, want v1 ConfigMap", pk)
	}
	if fp := ap.policy.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Fail {
		t.Error("failurePolicy must be Fail: an evaluation error must not let a forged annotation in")
	}
	var resources []string
	for _, r := range ap.policy.Spec.MatchConstraints.ResourceRules {
		resources = append(resources, r.Resources...)
	}
	for _, want := range []string{"pods", "pods/status", "pods/binding"} {
		if !slices.Contains(resources, want) {
			t.Errorf("the policy does not match %s: annotations can be written through it", want)
		}
	}
}

// celPolicy is the policy's CEL, compiled the way the API server runs it.
type celPolicy struct {
	variables   []namedProgram
	validations []validation
}

type namedProgram struct {
	name string
	prg  cel.Program
}

type validation struct {
	expr, message cel.Program
}

func compileCEL(t *testing.T, env *cel.Env, expr string) cel.Program {
	t.Helper()
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		t.Fatalf("compiling %q: %v", expr, iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatalf("program %q: %v", expr, err)
	}
	return prg
}

func compilePolicy(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) celPolicy {
	t.Helper()
	// The variables a ValidatingAdmissionPolicy's expressions see, and the
	// Kubernetes CEL environment's string extension (split, trim, join).
	env, err := cel.NewEnv(
		cel.Variable("object", cel.DynType),
		cel.Variable("oldObject", cel.DynType),
		cel.Variable("request", cel.DynType),
		cel.Variable("params", cel.DynType),
		cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)),
		ext.Strings(ext.StringsVersion(2)),
	)
	if err != nil {
		t.Fatal(err)
	}
	var cp celPolicy
	for _, v := range p.Spec.Variables {
		cp.variables = append(cp.variables, namedProgram{v.Name, compileCEL(t, env, v.Expression)})
	}
	for _, v := range p.Spec.Validations {
		cp.validations = append(cp.validations, validation{compileCEL(t, env, v.Expression), compileCEL(t, env, v.MessageExpression)})
	}
	if len(cp.validations) == 0 {
		t.Fatal("the policy has no validations")
	}
	return cp
}

// admissionRequest is what the API server hands the policy.
type admissionRequest struct {
	operation      string // CREATE or UPDATE
	subResource    string // "binding", "status"; "" (absent) for the pod itself
	user           string
	object, old    any // a Pod or a Binding; old is nil on CREATE
	writersMissing bool
}

// toCEL turns a typed object into the JSON-shaped value CEL sees.
func toCEL(t *testing.T, obj any) any {
	t.Helper()
	if obj == nil {
		return nil
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// admit evaluates the policy on r and returns "" when it allows the
// request, else the denial message.
func (cp celPolicy) admit(t *testing.T, writers *corev1.ConfigMap, r admissionRequest) string {
	t.Helper()
	var params any
	if !r.writersMissing {
		params = toCEL(t, writers)
	}
	vars := map[string]any{}
	// The API server hands CEL the AdmissionRequest as JSON: an empty
	// subResource is absent, not "".
	request := map[string]any{"operation": r.operation, "userInfo": map[string]any{"username": r.user}}
	if r.subResource != "" {
		request["subResource"] = r.subResource
	}
	act := map[string]any{
		"object":    toCEL(t, r.object),
		"oldObject": toCEL(t, r.old),
		"request":   request,
		"params":    params,
		"variables": vars,
	}
	for _, v := range cp.variables {
		out, _, err := v.prg.Eval(act)
		if err != nil {
			t.Fatalf("variable %s: %v", v.name, err)
		}
		vars[v.name] = out
	}
	for _, v := range cp.validations {
		out, _, err := v.expr.Eval(act)
		if err != nil {
			t.Fatalf("validation: %v", err)
		}
		if out != types.True {
			msg, _, err := v.message.Eval(act)
			if err != nil {
				t.Fatalf("message: %v", err)
			}
			return fmt.Sprint(msg.Value())
		}
	}
	return ""
}

func podWith(annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metaPod,
		ObjectMeta: objectMeta("train-0", annotations),
		Spec: corev1.PodSpec{
			SchedulerName: "koord-scheduler",
			Containers:    []corev1.Container{{Name: "main", Image: "trainer:1"}},
		},
	}
}

func TestAdmissionPolicyDeniesForgedAllocationsAndAllowsTheSchedulers(t *testing.T) {
	ap := renderAdmissionPolicy(t)
	cp := compilePolicy(t, ap.policy)

	const koordValue = `{"gpu":[{"minor":0,"id":"GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11"}]}`
	const otherValue = `{"gpu":[{"minor":1,"id":"GPU-0b1c2d3e-52a1-4d0e-9b1e-0a5f3c2d9e22"}]}`
	const hamiValue = "GPU-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11,NVIDIA,1000,10:;"
	userInput := map[string]string{
		// The user's input to the schedulers stays writable.
		"scheduling.koordinator.sh/device-allocate-hint": `{"rdma":{"vfSelector":{}}}`,
		"hami.io/gpu-scheduler-policy":                   "binpack",
		"prometheus.io/scrape":                           "true",
	}
	withKoord := func(value string) map[string]string {
		m := map[string]string{koordfmt.Annotation: value}
		for k, v := range userInput {
			m[k] = v
		}
		return m
	}

	cases := []struct {
		name      string
		req       admissionRequest
		wantDeny  bool
		wantWords []string // in the denial message
	}{
		{
			name:      "a tenant creates a pod with a copied Koordinator allocation",
			req:       admissionRequest{operation: "CREATE", user: tenant, object: podWith(withKoord(koordValue))},
			wantDeny:  true,
			wantWords: []string{koordfmt.Annotation, tenant},
		},
		{
			name:      "a Deployment's template carries one: the ReplicaSet controller's create is denied",
			req:       admissionRequest{operation: "CREATE", user: rsController, object: podWith(withKoord(koordValue))},
			wantDeny:  true,
			wantWords: []string{koordfmt.Annotation},
		},
		{
			name: "a tenant creates a pod with only the user's input annotations",
			req:  admissionRequest{operation: "CREATE", user: tenant, object: podWith(userInput)},
		},
		{
			name: "koord-scheduler writes the allocation at PreBind",
			req:  admissionRequest{operation: "UPDATE", user: koordinator, old: podWith(userInput), object: podWith(withKoord(koordValue))},
		},
		{
			name:      "a tenant retargets a running pod's allocation (kubectl annotate --overwrite)",
			req:       admissionRequest{operation: "UPDATE", user: tenant, old: podWith(withKoord(koordValue)), object: podWith(withKoord(otherValue))},
			wantDeny:  true,
			wantWords: []string{koordfmt.Annotation},
		},
		{
			name:     "a tenant removes the allocation",
			req:      admissionRequest{operation: "UPDATE", user: tenant, old: podWith(withKoord(koordValue)), object: podWith(userInput)},
			wantDeny: true,
		},
		{
			name: "a tenant edits another annotation of an allocated pod",
			req: admissionRequest{operation: "UPDATE", user: tenant, old: podWith(withKoord(koordValue)),
				object: podWith(func() map[string]string { m := withKoord(koordValue); m["prometheus.io/scrape"] = "false"; return m }())},
		},
		{
			name:      "a tenant creates a pod with a HAMi allocation",
			req:       admissionRequest{operation: "CREATE", user: tenant, object: podWith(map[string]string{hami.NVIDIAAnnotation: hamiValue})},
			wantDeny:  true,
			wantWords: []string{hami.NVIDIAAnnotation},
		},
		{
			name: "hami-scheduler writes the allocation",
			req: admissionRequest{operation: "UPDATE", user: hamiScheduler, old: podWith(nil),
				object: podWith(map[string]string{hami.NVIDIAAnnotation: hamiValue, "hami.io/vgpu-devices-to-allocate": hamiValue})},
		},
		{
			name: "HAMi's device plugin clears devices-to-allocate",
			req: admissionRequest{operation: "UPDATE", user: hamiPlugin,
				old:    podWith(map[string]string{hami.NVIDIAAnnotation: hamiValue, "hami.io/vgpu-devices-to-allocate": hamiValue}),
				object: podWith(map[string]string{hami.NVIDIAAnnotation: hamiValue, "hami.io/vgpu-devices-to-allocate": ";"})},
		},
		{
			name:      "another vendor's HAMi key is guarded too",
			req:       admissionRequest{operation: "CREATE", user: tenant, object: podWith(map[string]string{"hami.io/dcu-devices-allocated": "DCU-1,DCU,1024,10:;"})},
			wantDeny:  true,
			wantWords: []string{"hami.io/dcu-devices-allocated"},
		},
		{
			name:      "Volcano's keys are guarded",
			req:       admissionRequest{operation: "CREATE", user: tenant, object: podWith(map[string]string{volcano.VGPUAnnotation: hamiValue, volcano.GPUShareAnnotation: "0"})},
			wantDeny:  true,
			wantWords: []string{volcano.VGPUAnnotation, volcano.GPUShareAnnotation},
		},
		{
			name: "TensorFusion's keys are guarded",
			req: admissionRequest{operation: "CREATE", user: tenant, object: podWith(map[string]string{
				tensorfusion.GPUIDsKey: "gpu-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11", tensorfusion.ContainerGPUsKey: "{}", tensorfusion.PartitionUUIDsKey: ""})},
			wantDeny:  true,
			wantWords: []string{tensorfusion.GPUIDsKey, tensorfusion.ContainerGPUsKey, tensorfusion.PartitionUUIDsKey},
		},
		{
			name: "TensorFusion's scheduler writes the GPUs",
			req: admissionRequest{operation: "UPDATE", user: "system:serviceaccount:tensor-fusion-sys:tensor-fusion-sys", old: podWith(nil),
				object: podWith(map[string]string{tensorfusion.GPUIDsKey: "gpu-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11"})},
		},
		{
			name: "a tenant binds with an allocation annotation on the Binding (merged into the pod)",
			req: admissionRequest{operation: "CREATE", subResource: "binding", user: tenant, object: &corev1.Binding{
				TypeMeta:   metaBinding,
				ObjectMeta: objectMeta("train-0", withKoord(koordValue)),
				Target:     corev1.ObjectReference{Kind: "Node", Name: "node-1"},
			}},
			wantDeny: true,
		},
		{
			name:     "without the writers ConfigMap even the scheduler is denied (fail closed)",
			req:      admissionRequest{operation: "UPDATE", user: koordinator, old: podWith(userInput), object: podWith(withKoord(koordValue)), writersMissing: true},
			wantDeny: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantAdmission(t, cp.admit(t, ap.writers, c.req), c.wantDeny, c.wantWords) })
	}
}

// wantAdmission checks an admission's denial message (empty: admitted)
// against whether it should be denied and the words the denial must name.
func wantAdmission(t *testing.T, msg string, wantDeny bool, wantWords []string) {
	t.Helper()
	if denied := msg != ""; denied != wantDeny {
		t.Fatalf("denied = %v (%q), want %v", denied, msg, wantDeny)
	}
	for _, w := range wantWords {
		if !strings.Contains(msg, w) {
			t.Errorf("denial %q does not name %q", msg, w)
		}
	}
}

func TestAdmissionPolicyWritersAreConfigurable(t *testing.T) {
	// An installation under other names lists its own scheduler: it is then
	// allowed, and the default name no longer is.
	ap := renderAdmissionPolicy(t)
	cp := compilePolicy(t, ap.policy)
	const mine = "system:serviceaccount:scheduling:my-koord-scheduler"
	ap.writers.Data["writers"] = "  " + mine + "  \n"
	req := admissionRequest{operation: "UPDATE", old: podWith(nil),
		object: podWith(map[string]string{koordfmt.Annotation: `{"gpu":[{"minor":0}]}`})}
	req.user = mine
	if msg := cp.admit(t, ap.writers, req); msg != "" {
		t.Errorf("a listed writer was denied: %s", msg)
	}
	req.user = koordinator
	if msg := cp.admit(t, ap.writers, req); msg == "" {
		t.Error("a writer no longer listed was allowed")
	}
}

// boundPod is a pod created already bound to node-1 (spec.nodeName) under
// scheduler's name, asking for one whole GPU, without any annotation.
func boundPod(scheduler string) *corev1.Pod {
	p := podWith(nil)
	p.Spec.SchedulerName = scheduler
	p.Spec.NodeName = "node-1"
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"koordinator.sh/gpu-core": resource.MustParse("100")}
	return p
}

// A pod's spec.schedulerName is written by whoever creates it. Created with
// spec.nodeName set it is never scheduled: no scheduler allocated or
// counted its devices, yet podres-proxy believes the annotations of pods
// that name a device scheduler. Only the listed writers may create one.
func TestAdmissionPolicyDeniesBoundPodsNamingADeviceScheduler(t *testing.T) {
	ap := renderAdmissionPolicy(t)
	cp := compilePolicy(t, ap.policy)
	unbound := boundPod("koord-scheduler")
	unbound.Spec.NodeName = ""
	for _, c := range []struct {
		name      string
		req       admissionRequest
		wantDeny  bool
		wantWords []string
	}{
		{
			name:      "a tenant creates a pod bound to a node under koord-scheduler's name",
			req:       admissionRequest{operation: "CREATE", user: tenant, object: boundPod("koord-scheduler")},
			wantDeny:  true,
			wantWords: []string{"spec.nodeName", "koord-scheduler", tenant},
		},
		{
			name:      "... under hami-scheduler's",
			req:       admissionRequest{operation: "CREATE", user: tenant, object: boundPod("hami-scheduler")},
			wantDeny:  true,
			wantWords: []string{"hami-scheduler"},
		},
		{
			name:      "... under Volcano's",
			req:       admissionRequest{operation: "CREATE", user: rsController, object: boundPod("volcano")},
			wantDeny:  true,
			wantWords: []string{"volcano"},
		},
		{
			name: "koord-scheduler's service account creates one",
			req:  admissionRequest{operation: "CREATE", user: koordinator, object: boundPod("koord-scheduler")},
		},
		{
			name: "a tenant creates a bound pod under default-scheduler's name",
			req:  admissionRequest{operation: "CREATE", user: tenant, object: boundPod("default-scheduler")},
		},
		{
			name: "a tenant creates a pod for koord-scheduler to place",
			req:  admissionRequest{operation: "CREATE", user: tenant, object: unbound},
		},
		{
			name: "the kubelet creates the mirror pod of a static pod",
			req:  admissionRequest{operation: "CREATE", user: "system:node:node-1", object: boundPod("koord-scheduler")},
		},
		{
			name: "koord-scheduler binds a pod (a Binding has no spec)",
			req: admissionRequest{operation: "CREATE", subResource: "binding", user: koordinator, object: &corev1.Binding{
				TypeMeta: metaBinding, ObjectMeta: objectMeta("train-0", nil), Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}},
		},
		{
			name: "the kubelet updates a bound pod's status",
			req:  admissionRequest{operation: "UPDATE", subResource: "status", user: "system:node:node-1", old: boundPod("koord-scheduler"), object: boundPod("koord-scheduler")},
		},
	} {
		t.Run(c.name, func(t *testing.T) { wantAdmission(t, cp.admit(t, ap.writers, c.req), c.wantDeny, c.wantWords) })
	}
}

func TestAdmissionPolicyDeviceSchedulersAreConfigurable(t *testing.T) {
	// Where Koordinator runs under another name, the ConfigMap lists it:
	// that name is guarded, and the default no longer is. Without the key,
	// the defaults are.
	ap := renderAdmissionPolicy(t)
	cp := compilePolicy(t, ap.policy)
	ap.writers.Data["schedulers"] = " my-koord-scheduler \n\n"
	if msg := cp.admit(t, ap.writers, admissionRequest{operation: "CREATE", user: tenant, object: boundPod("my-koord-scheduler")}); msg == "" {
		t.Error("a bound pod under a listed scheduler's name was allowed")
	}
	if msg := cp.admit(t, ap.writers, admissionRequest{operation: "CREATE", user: tenant, object: boundPod("koord-scheduler")}); msg != "" {
		t.Errorf("a scheduler no longer listed is still guarded: %s", msg)
	}
	delete(ap.writers.Data, "schedulers")
	if msg := cp.admit(t, ap.writers, admissionRequest{operation: "CREATE", user: tenant, object: boundPod("tensor-fusion-scheduler")}); msg == "" {
		t.Error("without the schedulers key, a default device scheduler is not guarded")
	}
}

var (
	metaPod     = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	metaBinding = metav1.TypeMeta{APIVersion: "v1", Kind: "Binding"}
)

func objectMeta(name string, annotations map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "team-a", UID: "6b0c0000-1111-4222-8333-444455556666", Annotations: annotations}
}
