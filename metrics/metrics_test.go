package metrics

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// report calls every method of m once, as each part of the daemon would.
func report(m *Metrics) {
	boom := errors.New("boom")
	m.Request("v1", "List", false)
	m.Request("v1", "Get", true)
	m.Request("v1", "GetAllocatableResources", false)
	m.Request("v1alpha1", "List", false)
	m.Answered("v1", "Get", "dcgm", status.Error(codes.Unavailable, "pods unreadable"), time.Millisecond)
	m.RateLimited()
	m.Upstream("List", codes.OK, time.Millisecond)
	m.Shared("List", 3)
	m.ListPods(5, 1)
	m.ConnectionRejected()
	m.AnnotationError("koordinator")
	m.AllocationRefused("koordinator", "wrong-scheduler")
	m.PodsRead(time.Millisecond, nil)
	m.PodsRead(time.Millisecond, boom)
	m.NRIEvent("RunPodSandbox", time.Microsecond)
	m.NRIConnected(true)
	m.NRIReconnect()
	m.CRIReconciled(time.Millisecond, nil)
	m.PodsAPIEvent("ADDED")
	m.PodsAPIRelisted(3, 1, time.Millisecond)
	m.PodsAPIReconnect(boom)
	m.PodsAPIInitializing()
	m.PodSourceRead("pods-api")
	m.WatchReady(func() bool { return true })
	m.WatchStore(func() StoreStats {
		return StoreStats{Records: 7, Writes: 9, WriteErrors: 1, CorruptFiles: 2}
	})
}

// scrape returns what /metrics serves for reg.
func scrape(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// Every series the docs and dashboards name is served by /metrics, with
// its labels, once the part that counts it has reported.
func TestMetricsServesEverySeriesThePartsReport(t *testing.T) {
	reg := prometheus.NewRegistry()
	report(New(reg))
	got := scrape(t, reg)
	for _, want := range []string{
		`podres_proxy_pod_resources_endpoint_requests_total{server_api_version="v1"} 3`,
		`podres_proxy_pod_resources_endpoint_requests_total{server_api_version="v1alpha1"} 1`,
		`podres_proxy_pod_resources_endpoint_requests_list{server_api_version="v1"} 1`,
		`podres_proxy_pod_resources_endpoint_requests_get{server_api_version="v1"} 1`,
		`podres_proxy_pod_resources_endpoint_requests_get_allocatable{server_api_version="v1"} 1`,
		`podres_proxy_pod_resources_endpoint_errors_get{server_api_version="v1"} 1`,
		`podres_proxy_request_duration_seconds_count{code="Unavailable",method="Get",server_api_version="v1",view="dcgm"} 1`,
		`podres_proxy_rate_limited_total 1`,
		`podres_proxy_upstream_request_duration_seconds_count{code="OK",method="List"} 1`,
		`podres_proxy_upstream_shared_calls_total{method="List"} 3`,
		`podres_proxy_list_pods_total{answer="reused"} 5`,
		`podres_proxy_list_pods_total{answer="rebuilt"} 1`,
		`podres_proxy_connections_rejected_total 1`,
		`podres_proxy_annotation_errors_total{allocator="koordinator"} 1`,
		`podres_proxy_allocations_refused_total{allocator="koordinator",reason="wrong-scheduler"} 1`,
		`podres_proxy_kubelet_pods_reads_total{result="ok"} 1`,
		`podres_proxy_kubelet_pods_reads_total{result="error"} 1`,
		`podres_proxy_kubelet_pods_read_duration_seconds_count 2`,
		`podres_proxy_nri_event_duration_seconds_count{event="RunPodSandbox"} 1`,
		`podres_proxy_nri_connected 1`,
		`podres_proxy_nri_reconnects_total 1`,
		`podres_proxy_cri_reconciles_total{result="ok"} 1`,
		`podres_proxy_cri_reconcile_duration_seconds_count 1`,
		`podres_proxy_pods_api_events_total{type="ADDED"} 1`,
		`podres_proxy_pods_api_relists_total 1`,
		`podres_proxy_pods_api_reconnects_total 1`,
		`podres_proxy_pods_api_initializing_total 1`,
		`podres_proxy_pod_source_reads_total{source="pods-api"} 1`,
		`podres_proxy_ready 1`,
		`podres_proxy_state_records 7`,
		`podres_proxy_state_writes_total 9`,
		`podres_proxy_state_write_errors_total 1`,
		`podres_proxy_state_corrupt_files_total 2`,
		`podres_proxy_state_pending_writes 0`,
		`podres_proxy_state_last_durable_seconds 0`,
		`podres_proxy_state_max_durable_seconds 0`,
	} {
		if !strings.Contains(got, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", got)
	}
}

// The kubelet counts v1alpha1 calls in requests_total only.
func TestV1alpha1CallsCountInRequestsTotalOnly(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(reg).Request("v1alpha1", "List", true)
	got := scrape(t, reg)
	if strings.Contains(got, `requests_list{server_api_version="v1alpha1"}`) || strings.Contains(got, `errors_list{server_api_version="v1alpha1"}`) {
		t.Errorf("a v1alpha1 call counted beyond requests_total:\n%s", got)
	}
}
