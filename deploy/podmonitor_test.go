package deploy_test

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
)

// podMonitor is Prometheus Operator's PodMonitor (monitoring.coreos.com/v1)
// with the fields its CRD documents that the manifests use, so that strict
// decoding refuses a misspelt one.
type podMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		PodMetricsEndpoints []podMetricsEndpoint `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

type podMetricsEndpoint struct {
	Port          string `json:"port,omitempty"`
	Path          string `json:"path,omitempty"`
	Scheme        string `json:"scheme,omitempty"`
	Interval      string `json:"interval,omitempty"`
	Authorization *struct {
		Type        string                    `json:"type,omitempty"`
		Credentials *corev1.SecretKeySelector `json:"credentials,omitempty"`
	} `json:"authorization,omitempty"`
	TLSConfig *struct {
		InsecureSkipVerify bool   `json:"insecureSkipVerify,omitempty"`
		ServerName         string `json:"serverName,omitempty"`
	} `json:"tlsConfig,omitempty"`
	Relabelings []struct {
		SourceLabels []string `json:"sourceLabels,omitempty"`
		Separator    string   `json:"separator,omitempty"`
		Regex        string   `json:"regex,omitempty"`
		TargetLabel  string   `json:"targetLabel,omitempty"`
		Replacement  string   `json:"replacement,omitempty"`
		Action       string   `json:"action,omitempty"`
	} `json:"relabelings,omitempty"`
}

// tokenSecret is the only Secret the manifests may create: a service
// account token's shell, which the API server's token controller fills. It
// has no data or stringData field, so strict decoding refuses a manifest
// that carries secret material, and UnmarshalJSON refuses another type.
type tokenSecret struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Type              corev1.SecretType `json:"type"`
}

func (s *tokenSecret) UnmarshalJSON(data []byte) error {
	type plain tokenSecret
	var p plain
	strict, err := kjson.UnmarshalStrict(data, &p)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		return err
	}
	if p.Type != corev1.SecretTypeServiceAccountToken || p.Annotations[corev1.ServiceAccountNameKey] == "" {
		return fmt.Errorf("Secret of type %q (account %q): the manifests create only %s Secrets naming their account", p.Type, p.Annotations[corev1.ServiceAccountNameKey], corev1.SecretTypeServiceAccountToken)
	}
	*s = tokenSecret(p)
	return nil
}

// chartScraped are the chart's values that render deploy/components/monitoring
// and deploy/components/podmonitor.
var chartScraped = map[string]any{
	"prometheusRule": map[string]any{"enabled": true},
	"dashboard":      map[string]any{"enabled": true},
	"podMonitor":     map[string]any{"enabled": true},
}

// scrapeRenderings are the renderings with a PodMonitor: the kustomizations
// that add deploy/components/podmonitor and the chart with its value.
func scrapeRenderings(t *testing.T) map[string][]object {
	t.Helper()
	out := map[string][]object{
		"testdata/podmonitor":     renderDir(t, "testdata/podmonitor"),
		"testdata/all-components": renderDir(t, "testdata/all-components"),
	}
	for name, values := range map[string]map[string]any{
		"chart":                 {"monitoring": chartScraped},
		"chart with port 19478": {"monitoring": map[string]any{"podMonitor": map[string]any{"enabled": true, "port": 19478}}},
	} {
		objs, err := renderChart(values)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = objs
	}
	return out
}

// secureMetricsPort returns the port of the DaemonSet's
// --metrics-secure-addr, which must listen on every node address.
func secureMetricsPort(t *testing.T, objs []object) string {
	t.Helper()
	c := proxyContainer(t, find[appsv1.DaemonSet](t, objs, "DaemonSet", "podres-proxy"))
	addr, ok := argValues(t, c.Args)["metrics-secure-addr"]
	if !ok {
		t.Fatal("the DaemonSet serves no --metrics-secure-addr")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host != "" {
		t.Fatalf("--metrics-secure-addr=%q, want :<port> (every node address, for the cluster's Prometheus)", addr)
	}
	return port
}

func TestPodMonitorScrapesTheDaemonsHTTPSPortWithTheGrantedToken(t *testing.T) {
	for name, objs := range scrapeRenderings(t) {
		t.Run(name, func(t *testing.T) {
			port := secureMetricsPort(t, objs)
			ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "podres-proxy")
			pm := find[podMonitor](t, objs, "PodMonitor", "podres-proxy")
			// Named podres-proxy in the DaemonSet's namespace: the job
			// <namespace>/podres-proxy, which the alerts select.
			if pm.Namespace != ds.Namespace || pm.Spec.JobLabel != "" || !regexp.MustCompile(`^(.+/)?podres-proxy$`).MatchString(pm.Namespace+"/"+pm.Name) {
				t.Errorf("PodMonitor %s/%s (jobLabel %q): its job does not match the alerts' job=~\"(.+/)?podres-proxy\"", pm.Namespace, pm.Name, pm.Spec.JobLabel)
			}
			if pm.Spec.NamespaceSelector != nil || !labelsMatch(pm.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) || len(pm.Spec.Selector.MatchExpressions) != 0 {
				t.Errorf("selector %+v does not select the DaemonSet's pods %v", pm.Spec.Selector, ds.Spec.Template.Labels)
			}
			if len(pm.Spec.PodMetricsEndpoints) != 1 {
				t.Fatalf("%d endpoints, want 1", len(pm.Spec.PodMetricsEndpoints))
			}
			ep := pm.Spec.PodMetricsEndpoints[0]
			if ep.Scheme != "https" || ep.Path != "/metrics" || ep.Port != "" {
				t.Errorf("endpoint scheme %q path %q port %q, want https, /metrics and no port name (the pod declares none)", ep.Scheme, ep.Path, ep.Port)
			}
			// The address is the pod's IP (the node's, on the host network)
			// and the flag's port, IPv6 in brackets.
			for ip, want := range map[string]string{"10.0.0.7": "10.0.0.7:" + port, "fd00::7": "[fd00::7]:" + port} {
				if got := relabelAddress(t, ep, ip); got != want {
					t.Errorf("a pod at %s is scraped at %q, want %q", ip, got, want)
				}
			}
			// Self-signed: not verified, so the token sent is one that may
			// only get /metrics.
			if ep.TLSConfig == nil || !ep.TLSConfig.InsecureSkipVerify {
				t.Errorf("tlsConfig %+v: the daemon's certificate is self-signed (no --metrics-cert-file), so insecureSkipVerify is needed", ep.TLSConfig)
			}
			if _, ok := argValues(t, proxyContainer(t, ds).Args)["metrics-cert-file"]; ok {
				t.Error("--metrics-cert-file is set: verify the certificate instead of insecureSkipVerify")
			}
			if ep.Authorization == nil || ep.Authorization.Type != "Bearer" || ep.Authorization.Credentials == nil || ep.Authorization.Credentials.Key != "token" {
				t.Fatalf("authorization %+v, want a Bearer token from a Secret's key token", ep.Authorization)
			}
			secret := find[tokenSecret](t, objs, "Secret", ep.Authorization.Credentials.Name)
			sa := secret.Annotations[corev1.ServiceAccountNameKey]
			if secret.Type != corev1.SecretTypeServiceAccountToken || secret.Namespace != pm.Namespace || sa == "" {
				t.Fatalf("Secret %s/%s (type %s, account %q): want a service account token in the PodMonitor's namespace", secret.Namespace, secret.Name, secret.Type, sa)
			}
			find[corev1.ServiceAccount](t, objs, "ServiceAccount", sa)
			if sa == ds.Spec.Template.Spec.ServiceAccountName {
				t.Error("the scraper's token is the daemon's own service account")
			}
			// That account, and no other of the rendering, may get /metrics,
			// and nothing else.
			grants := metricsReaders(t, objs)
			want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: pm.Namespace}
			if len(grants) != 1 || grants[0] != want {
				t.Errorf("get /metrics is granted to %+v, want only %+v", grants, want)
			}
		})
	}
}

// relabelAddress applies ep's relabelings that set __address__ to a target
// whose pod IP is ip, as Prometheus does (anchored regular expressions,
// ${1} replaced), and returns the address.
func relabelAddress(t *testing.T, ep podMetricsEndpoint, ip string) string {
	t.Helper()
	labels := map[string]string{"__meta_kubernetes_pod_ip": ip, "__address__": ip}
	for _, r := range ep.Relabelings {
		if r.Action != "" && r.Action != "replace" {
			continue
		}
		var vals []string
		for _, l := range r.SourceLabels {
			vals = append(vals, labels[l])
		}
		re := regexp.MustCompile("^(?:" + r.Regex + ")$")
		src := strings.Join(vals, ";")
		if !re.MatchString(src) {
			continue
		}
		labels[r.TargetLabel] = re.ReplaceAllString(src, r.Replacement)
	}
	return labels["__address__"]
}

// metricsReaders returns the subjects the rendering's bindings grant get on
// the non-resource URL /metrics; it fails on a rule granting more than that
// beside it.
func metricsReaders(t *testing.T, objs []object) []rbacv1.Subject {
	t.Helper()
	roles := map[string]bool{}
	for _, o := range objs {
		role, ok := o.value.(*rbacv1.ClusterRole)
		if !ok {
			continue
		}
		for _, r := range role.Rules {
			if len(r.NonResourceURLs) == 0 {
				continue
			}
			if !slices.Equal(r.NonResourceURLs, []string{"/metrics"}) || !slices.Equal(r.Verbs, []string{"get"}) || len(r.Resources) != 0 || len(r.APIGroups) != 0 {
				t.Errorf("ClusterRole %s grants %v on %v, want only get on /metrics", role.Name, r.Verbs, r.NonResourceURLs)
			}
			if len(role.Rules) != 1 {
				t.Errorf("ClusterRole %s grants more than get /metrics: %+v", role.Name, role.Rules)
			}
			roles[role.Name] = true
		}
	}
	var out []rbacv1.Subject
	for _, o := range objs {
		if b, ok := o.value.(*rbacv1.ClusterRoleBinding); ok && roles[b.RoleRef.Name] {
			out = append(out, b.Subjects...)
		}
	}
	return out
}

func TestTheDaemonMayOnlyCreateReviewsWhereItServesHTTPS(t *testing.T) {
	// Where the HTTPS listener is on, the daemon's service account may
	// create TokenReviews and SubjectAccessReviews, nothing more but the
	// Events every install creates; the base
	// serves no such listener and asks for no such right.
	reviews := func(objs []object, sa, ns string) [][]string {
		var got [][]string
		for _, o := range objs {
			b, ok := o.value.(*rbacv1.ClusterRoleBinding)
			if !ok || !slices.Contains(b.Subjects, rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}) {
				continue
			}
			role := find[rbacv1.ClusterRole](t, objs, "ClusterRole", b.RoleRef.Name)
			for _, r := range role.Rules {
				// Events are the daemon's on every install (daemonset_test.go).
				if slices.Contains(r.Verbs, "create") && !slices.Equal(r.APIGroups, []string{"events.k8s.io"}) {
					got = append(got, []string{strings.Join(r.APIGroups, ","), strings.Join(r.Resources, ","), strings.Join(r.Verbs, ",")})
				}
			}
		}
		return got
	}
	want := [][]string{{"authentication.k8s.io", "tokenreviews", "create"}, {"authorization.k8s.io", "subjectaccessreviews", "create"}}
	for name, objs := range scrapeRenderings(t) {
		ds := find[appsv1.DaemonSet](t, objs, "DaemonSet", "podres-proxy")
		if got := reviews(objs, ds.Spec.Template.Spec.ServiceAccountName, ds.Namespace); !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("%s: the daemon may create %q, want exactly %q", name, got, want)
		}
	}
	for dir, ds := range proxyDaemonSets(t, renderAll(t)) {
		if strings.Contains(dir, "podmonitor") || strings.Contains(dir, "all-components") {
			continue
		}
		if v, ok := argValues(t, proxyContainer(t, ds).Args)["metrics-secure-addr"]; ok {
			t.Errorf("%s serves --metrics-secure-addr=%s without deploy/components/podmonitor", dir, v)
		}
	}
	base := renderDir(t, "base")
	if got := reviews(base, "podres-proxy", "podres-proxy"); len(got) != 0 {
		t.Errorf("the base's daemon may create %q; the base serves no HTTPS /metrics", got)
	}
}

func TestChartBindsPrometheusServiceAccountWhenNamed(t *testing.T) {
	objs, err := renderChart(map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{
		"enabled":                  true,
		"labels":                   map[string]any{"release": "kube-prometheus-stack"},
		"prometheusServiceAccount": map[string]any{"name": "prometheus-k8s", "namespace": "monitoring"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	got := metricsReaders(t, objs)
	want := []rbacv1.Subject{
		{Kind: rbacv1.ServiceAccountKind, Name: "podres-proxy-scraper", Namespace: chartNamespace},
		{Kind: rbacv1.ServiceAccountKind, Name: "prometheus-k8s", Namespace: "monitoring"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("get /metrics granted to %+v, want %+v", got, want)
	}
	if pm := find[podMonitor](t, objs, "PodMonitor", "podres-proxy"); pm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PodMonitor labels %v, want the podMonitorSelector's release label", pm.Labels)
	}
	if _, err := renderChart(map[string]any{"monitoring": map[string]any{"podMonitor": map[string]any{
		"enabled": true, "prometheusServiceAccount": map[string]any{"name": "prometheus-k8s"},
	}}}); err == nil || !strings.Contains(err.Error(), "namespace is required") {
		t.Errorf("a Prometheus service account without its namespace: %v, want the chart's refusal", err)
	}
	// Off by default: no listener, no rights, no objects.
	objs, err = renderChart(map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.kind == "PodMonitor" || o.kind == "Secret" || strings.HasPrefix(o.name, "podres-proxy-metrics") || o.name == "podres-proxy-scraper" {
			t.Errorf("the chart renders %s %s by default", o.kind, o.name)
		}
	}
}
