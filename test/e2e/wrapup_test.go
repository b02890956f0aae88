package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/test/promexpr"
)

// This file sorts last, and go test runs a package's files in name order:
// its check wants the series the suite's scenarios made.

// notFromTheDaemon are the names the alerts and the dashboard take from
// elsewhere: Prometheus' own, and kube-state-metrics' DaemonSet status.
var notFromTheDaemon = map[string]bool{
	"up": true,
	"kube_daemonset_status_desired_number_scheduled": true,
	"kube_daemonset_status_number_available":         true,
}

// seriesOnlyOnEvent are the labelled families that have no series until
// what they count happens, which this suite does not always cause; each is
// registered by metrics.New (deploy's tests check that), and a rename still
// fails here whenever the suite did cause it.
var seriesOnlyOnEvent = map[string]string{
	"podres_proxy_dra_unfolded_total":                            "a DRA device the legacy view could not fold: the cluster suite",
	"podres_proxy_annotation_errors_total":                       "an undecodable annotation",
	"podres_proxy_pod_resources_endpoint_errors_list":            "a List answered with an error",
	"podres_proxy_pod_resources_endpoint_errors_get_allocatable": "a GetAllocatableResources answered with an error",
	"podres_proxy_pod_resources_endpoint_errors_get":             "a Get answered with an error",
	"podres_proxy_kubelet_pods_reads_total":                      "a read of the kubelet's /pods (none where the Pods API answers every query)",
	"podres_proxy_events_emitted_total":                          "an Event, which needs an API server: the cluster suite",
	"podres_proxy_events_dropped_total":                          "an Event dropped, which needs an API server",
	"podres_proxy_upstream_shared_calls_total":                   "a kubelet call shared by concurrent callers",
	"podres_proxy_pod_source_reads_total":                        "a read of every pod for a query (none while the store answers every query)",
	"podres_proxy_allocations_refused_total":                     "a pod's refusals changing: a serve restarted by an earlier test finds them in its store, unchanged",
}

// Every metric the shipped alerts and dashboard name is one that the real
// serve of this node serves: a scrape of its /metrics at the suite's end,
// not a registry built as serve builds it.
func TestEveryMetricTheAlertsAndTheDashboardNameIsInServesScrape(t *testing.T) {
	requireProxy(t)
	// One call of each method first: serve may have been restarted by a
	// test before, and a method's labelled series start at its first call.
	listed, err := list(h.proxySocket, multus)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	namespace, name := "default", "no-such-pod"
	if pods := listed.GetPodResources(); len(pods) > 0 {
		namespace, name = pods[0].GetNamespace(), pods[0].GetName()
	}
	_, _ = get(h.proxySocket, namespace, name) // an error is counted too
	if _, err := allocatable(h.proxySocket); err != nil {
		t.Fatalf("GetAllocatableResources: %v", err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + h.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	served, err := promexpr.Served(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	queries, err := promexpr.Load(h.repo)
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) < 30 {
		t.Fatalf("read %d queries from the monitoring component, want its alerts and panels", len(queries))
	}
	var unseen []string
	for _, q := range queries {
		names, patterns, err := promexpr.Names(q.Expr)
		if err != nil {
			t.Errorf("%s: %v", q.Where, err)
			continue
		}
		for _, n := range names {
			switch {
			case served[n] || notFromTheDaemon[n]:
			case seriesOnlyOnEvent[familyOf(n)] != "":
				unseen = append(unseen, n)
			default:
				t.Errorf("%s names %s, which serve's /metrics does not serve", q.Where, n)
			}
		}
		for _, p := range patterns {
			matched := false
			for n := range served {
				matched = matched || p.MatchString(n)
			}
			for n := range seriesOnlyOnEvent {
				matched = matched || p.MatchString(n)
			}
			if !matched {
				t.Errorf("%s selects %s, which matches nothing serve serves", q.Where, p)
			}
		}
	}
	t.Logf("%d queries checked against %d served names; without a series in this run (nothing here caused them): %s",
		len(queries), len(served), strings.Join(unseen, ", "))
}

// familyOf is the family a histogram's or summary's series belongs to.
func familyOf(name string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if f, ok := strings.CutSuffix(name, s); ok {
			return f
		}
	}
	return name
}
