package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/test/promexpr"
)

// prometheusRule is Prometheus Operator's PrometheusRule
// (monitoring.coreos.com/v1), with the fields its CRD documents, so that
// strict decoding refuses a misspelt one. Prometheus Operator's Go types are
// not a dependency of this module.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              prometheusRuleSpec `json:"spec"`
}

type prometheusRuleSpec struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name                    string            `json:"name"`
	Interval                string            `json:"interval,omitempty"`
	QueryOffset             string            `json:"query_offset,omitempty"`
	Limit                   *int              `json:"limit,omitempty"`
	PartialResponseStrategy string            `json:"partial_response_strategy,omitempty"`
	Labels                  map[string]string `json:"labels,omitempty"`
	Rules                   []rule            `json:"rules"`
}

type rule struct {
	Record        string            `json:"record,omitempty"`
	Alert         string            `json:"alert,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// monitoringDir is the component with the alerts and the dashboard; the
// chart renders them from its copies in chartFilesDir.
var (
	monitoringDir = filepath.Join(deployDir, "components", "monitoring")
	chartFilesDir = filepath.Join(chartDir, "files")
)

// chartMonitoring are the chart's values that render the component.
var chartMonitoring = map[string]any{
	"prometheusRule": map[string]any{"enabled": true},
	"dashboard":      map[string]any{"enabled": true},
}

// servedMetrics returns the names of the series /metrics serves, from a
// registry built as serve builds it (the Go and process collectors, then
// metrics.New, WatchStore and WatchReady), with every metric given a value so that each
// family is gathered with its type: a histogram serves name_bucket,
// name_sum and name_count, a summary name, name_sum and name_count.
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec := &describing{Registerer: reg}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(rec)
	m.WatchStore(func() metrics.StoreStats { return metrics.StoreStats{} })
	m.WatchReady(func() bool { return false })

	// Every method once, so that every family, labelled ones included, has
	// a series to gather.
	failed := fmt.Errorf("failed")
	m.NRIEvent("RunPodSandbox", time.Millisecond)
	m.NRIConnected(true)
	m.NRIReconnect()
	m.CRIReconciled(time.Millisecond, nil)
	m.DRAUnfolded("no-resourceslice")
	m.EventEmitted("AllocationRefused")
	m.EventDropped("AllocationRefused")
	m.PodsAPIEvent("ADDED")
	m.PodsAPIRelisted(1, 1, time.Millisecond)
	m.PodsAPIReconnect(failed)
	m.PodsAPIInitializing()
	m.DRAPodsRead()
	m.PodSourceRead("pods")
	m.PodsRead(time.Millisecond, failed)
	m.AnnotationError("koordinator")
	m.ListPods(1, 1)
	m.Shared("List", 1)
	m.AllocationRefused("koordinator", "no-request")
	m.ConnectionRejected()
	m.Upstream("List", codes.OK, time.Millisecond)
	for _, method := range []string{"List", "Get", "GetAllocatableResources"} {
		m.Request("v1", method, true)
		m.Answered("v1", method, "topology", nil, time.Millisecond)
	}
	m.RateLimited()
	m.UnreadRefused()

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	gathered := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		gathered[name] = true
		switch f.GetType().String() {
		case "HISTOGRAM":
			served[name+"_bucket"], served[name+"_sum"], served[name+"_count"] = true, true, true
		case "SUMMARY":
			served[name], served[name+"_sum"], served[name+"_count"] = true, true, true
		default:
			served[name] = true
		}
	}
	for _, name := range rec.names {
		if !gathered[name] {
			t.Errorf("metric %s is registered but has no series here: give it a value in servedMetrics", name)
		}
	}
	if len(rec.names) < 50 || !served["podres_proxy_state_writer"] || !served["process_resident_memory_bytes"] || !served["go_goroutines"] {
		t.Fatalf("the registry serves %d names, without the state store's, the process's or Go's: %v", len(served), rec.names)
	}
	return served
}

// describing is a Registerer that records the names of the metrics
// registered through it, from their descriptions.
type describing struct {
	prometheus.Registerer
	names []string
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describing) Register(c prometheus.Collector) error {
	descs := make(chan *prometheus.Desc)
	go func() { c.Describe(descs); close(descs) }()
	for desc := range descs {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1])
		}
	}
	return d.Registerer.Register(c)
}

func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

// seriesNames parses expr and returns the metric names its selectors name,
// and the selectors, each with its matchers. A regular expression on
// __name__ must match at least one name in served; the names it matches are
// returned.
func seriesNames(expr string, served map[string]bool) ([]string, []*parser.VectorSelector, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	var sels []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		sels = append(sels, vs)
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel {
				continue
			}
			if m.Type == labels.MatchEqual {
				names = append(names, m.Value)
				continue
			}
			matched := 0
			for name := range served {
				if m.Matches(name) {
					names = append(names, name)
					matched++
				}
			}
			if matched == 0 {
				names = append(names, fmt.Sprintf("(none matches %s)", m))
			}
		}
		return nil
	})
	return names, sels, nil
}

// monitoringObjects returns the PrometheusRule and the dashboard's ConfigMap
// of one rendering.
func monitoringObjects(t *testing.T, objs []object) (*prometheusRule, *corev1.ConfigMap) {
	t.Helper()
	return find[prometheusRule](t, objs, "PrometheusRule", "podres-proxy"),
		find[corev1.ConfigMap](t, objs, "ConfigMap", "podres-proxy-dashboard")
}

// dashboard is the part of a Grafana dashboard's JSON model the checks read.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Query      json.RawMessage `json:"query"`
			Definition string          `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

// kubeStateMetrics are the series of kube-state-metrics the alerts name,
// for the daemon's absence from nodes, which no series of its own shows.
var kubeStateMetrics = map[string]bool{
	"kube_daemonset_status_desired_number_scheduled": true,
	"kube_daemonset_status_number_available":         true,
}

func TestMonitoringNamesOnlyServedMetrics(t *testing.T) {
	// Every expression of the alerts and of the dashboard parses, and every
	// metric it names is one the daemon serves (or up, Prometheus' own, or
	// kube-state-metrics' DaemonSet status in the alerts): a
	// renamed metric fails here, not silently on a cluster.
	served := servedMetrics(t)
	rule, cm := monitoringObjects(t, renderDir(t, "testdata/monitoring"))
	check := func(where, expr string) []*parser.VectorSelector {
		t.Helper()
		names, sels, err := seriesNames(expr, served)
		if err != nil {
			t.Errorf("%s: %v\n%s", where, err, expr)
			return nil
		}
		if len(names) == 0 {
			t.Errorf("%s names no metric: %s", where, expr)
		}
		for _, n := range names {
			if !served[n] && n != "up" && !kubeStateMetrics[n] {
				t.Errorf("%s names %s, which the daemon does not serve", where, n)
			}
		}
		return sels
	}

	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			check("alert "+r.Alert, r.Expr)
		}
	}

	var d dashboard
	if err := json.Unmarshal([]byte(cm.Data["podres-proxy.json"]), &d); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	queries, err := promexpr.DashboardQueries([]byte(cm.Data["podres-proxy.json"]))
	if err != nil {
		t.Fatalf("the dashboard: %v", err)
	}
	targets := len(queries)
	for _, q := range queries {
		for _, vs := range check(q.Where, q.Expr) {
			// Every selector follows the node variable.
			if !slices.ContainsFunc(vs.LabelMatchers, func(m *labels.Matcher) bool {
				return m.Name == "instance" && m.Type == labels.MatchRegexp && m.Value == ".*"
			}) || !strings.Contains(q.Raw, `instance=~"$node"`) {
				t.Errorf("%s: selector %s does not select instance=~\"$node\"", q.Where, vs)
			}
		}
	}
	if targets < 20 {
		t.Errorf("the dashboard has %d queries, want its panels' (at least 20)", targets)
	}

	// The node variable lists the daemons' instances, from a served metric.
	labelValues := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	var node bool
	for _, v := range d.Templating.List {
		if v.Name != "node" {
			continue
		}
		node = true
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("node variable's query: %v", err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if v.Type != "query" || m == nil || m[2] != "instance" || q.Query != v.Definition {
			t.Fatalf("node variable = %+v, want a query label_values(<metric>, instance)", v)
		}
		check("the node variable", m[1])
	}
	if !node {
		t.Error("the dashboard has no node variable")
	}
}

func TestServedMetricsNoticesARename(t *testing.T) {
	// The check above must fail on a name the daemon does not serve, and see
	// through a regular expression on __name__.
	served := servedMetrics(t)
	for expr, want := range map[string]string{
		`rate(podres_proxy_rate_limited[5m])`:                                     "podres_proxy_rate_limited",
		`podres_proxy_state_writer`:                                               "",
		`rate(podres_proxy_upstream_request_duration_seconds_count[5m])`:          "",
		`podres_proxy_upstream_request_duration_seconds`:                          "podres_proxy_upstream_request_duration_seconds",
		`rate({__name__=~"podres_proxy_pod_resources_endpoint_errors_nope"}[5m])`: "(none matches",
	} {
		names, _, err := seriesNames(expr, served)
		if err != nil {
			t.Fatal(err)
		}
		var unserved []string
		for _, n := range names {
			if !served[n] {
				unserved = append(unserved, n)
			}
		}
		got := strings.Join(unserved, " ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("%s: not served %q, want %q", expr, got, want)
		}
	}
}

func TestAlertsHaveSeverityRunbookAndFor(t *testing.T) {
	// Each alert says how bad it is, what happened and where its runbook
	// is: an anchor of docs/metrics.md that exists.
	rule, _ := monitoringObjects(t, renderDir(t, "testdata/monitoring"))
	doc, err := os.ReadFile(filepath.Join("..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	// Alerts on a one-off event (a refusal, an undecodable annotation) fire
	// at once; the others wait.
	events := []string{"PodresProxyAllocationsRefused", "PodresProxyAnnotationErrors"}
	var alerts []string
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("rule %q is not an alert", r.Record)
				continue
			}
			alerts = append(alerts, r.Alert)
			if s := r.Labels["severity"]; s != "critical" && s != "warning" && s != "info" {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: no summary or description", r.Alert)
			}
			const prefix = "https://github.com/podres-proxy/podres-proxy/blob/main/docs/metrics.md#"
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], prefix)
			if !ok || anchor != strings.ToLower(r.Alert) || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q, want %s%s and a heading ### %s in docs/metrics.md", r.Alert, r.Annotations["runbook_url"], prefix, strings.ToLower(r.Alert), r.Alert)
			}
			if d, err := time.ParseDuration(r.For); (err != nil || d < time.Minute) && !slices.Contains(events, r.Alert) {
				t.Errorf("%s: for %q, want a duration of minutes", r.Alert, r.For)
			}
		}
	}
	for _, want := range []string{"PodresProxyDown", "PodresProxyAbsent", "PodresProxyNRIDisconnected", "PodresProxyKubeletPodsUnreadable",
		"PodresProxyAnswersFailing", "PodresProxyAllocationsRefused", "PodresProxyAnnotationErrors", "PodresProxyUpstreamErrors",
		"PodresProxyUpstreamSlow", "PodresProxyStateWritesFailing", "PodresProxyCallsRefused", "PodresProxyStateWriterWaiting"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no alert %s", want)
		}
	}
	// Every alert has a promtool test.
	tests, err := os.ReadFile(filepath.Join(monitoringDir, "prometheusrule.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		if !bytes.Contains(tests, []byte("alertname: "+a+"\n")) {
			t.Errorf("%s has no firing case in prometheusrule.test.yaml", a)
		}
	}
}

func TestChartMonitoringFilesAreTheComponents(t *testing.T) {
	// The chart renders the component's rule and dashboard from its copies
	// (a chart cannot read files outside itself); TestChartRendersWhatTheKustomizationsDo
	// compares the renderings, this names the file to copy.
	for _, f := range []string{"prometheusrule.yaml", "dashboard.json"} {
		a, err := os.ReadFile(filepath.Join(monitoringDir, f))
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(chartFilesDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s: cp %[2]s %[1]s", filepath.Join(chartFilesDir, f), filepath.Join(monitoringDir, f))
		}
	}
	// Off by default; on, the chart's objects are the component's.
	objs, err := renderChart(map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.kind == "PrometheusRule" || o.name == "podres-proxy-dashboard" {
			t.Errorf("the chart renders %s %s by default", o.kind, o.name)
		}
	}
	objs, err = renderChart(map[string]any{"createNamespace": true, "monitoring": chartMonitoring})
	if err != nil {
		t.Fatal(err)
	}
	chartRule, chartDash := monitoringObjects(t, objs)
	rule, dash := monitoringObjects(t, renderDir(t, "testdata/monitoring"))
	if d := firstDiff("spec", mustJSON(t, rule.Spec), mustJSON(t, chartRule.Spec)); d != "" {
		t.Errorf("the chart's PrometheusRule differs from the component's: %s", d)
	}
	if chartDash.Data["podres-proxy.json"] != dash.Data["podres-proxy.json"] {
		t.Error("the chart's dashboard differs from the component's")
	}
	if chartDash.Labels["grafana_dashboard"] != "1" || dash.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels: chart %v, component %v; want grafana_dashboard: \"1\" for Grafana's sidecar", chartDash.Labels, dash.Labels)
	}

	// The labels a Prometheus' ruleSelector or a sidecar asks for.
	objs, err = renderChart(map[string]any{"monitoring": map[string]any{
		"prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}},
		"dashboard":      map[string]any{"enabled": true, "labels": map[string]any{"team": "nodes"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	chartRule, chartDash = monitoringObjects(t, objs)
	if chartRule.Labels["release"] != "kube-prometheus-stack" || chartDash.Labels["team"] != "nodes" || chartDash.Labels["grafana_dashboard"] != "1" {
		t.Errorf("labels values: rule %v, dashboard %v", chartRule.Labels, chartDash.Labels)
	}
}

// mustJSON turns v into a plain JSON value, for firstDiff.
func mustJSON(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
