package promexpr

import (
	"net/http/httptest"
	"slices"
	"sort"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Served reads what a real registry's handler serves, histograms as their
// three series.
func TestServedReadsAScrape(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "podres_proxy_calls_total", Help: "h"}, []string{"method"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "podres_proxy_took_seconds", Help: "h"})
	reg.MustRegister(c, h, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "podres_proxy_never_total", Help: "h"}, []string{"x"}))
	c.WithLabelValues("List").Inc()
	h.Observe(1)
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	served, err := Served(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for n := range served {
		got = append(got, n)
	}
	sort.Strings(got)
	want := []string{"podres_proxy_calls_total", "podres_proxy_took_seconds_bucket", "podres_proxy_took_seconds_count", "podres_proxy_took_seconds_sum"}
	if !slices.Equal(got, want) {
		t.Errorf("Served = %q, want %q (a labelled family without a series is not served)", got, want)
	}
}

// Load reads the repository's alerts and dashboard, and every query names
// at least one series.
func TestLoadReadsTheMonitoringComponent(t *testing.T) {
	qs, err := Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 30 {
		t.Fatalf("%d queries, want the alerts' and the panels'", len(qs))
	}
	for _, q := range qs {
		names, patterns, err := Names(q.Expr)
		if err != nil || len(names)+len(patterns) == 0 {
			t.Errorf("%s: names %v, patterns %v, %v", q.Where, names, patterns, err)
		}
	}
}
