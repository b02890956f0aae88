package proxy_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/proxy"
)

// TestStuckPodBenchmarkReport measures, side by side in one run, a List on
// a node with one pod stuck before its sandbox, without the Pods API: the
// proxy as serve wires it (the kubelet's pod logs directory read, package
// podlogs) against the same proxy without it (a /pods read per List, as
// before). benchPods' realistic pods, the rate limit off, one connection
// each, the two Lists of a round one after another so that they share the
// machine's load of the moment.
//
// `PODRES_BENCH=1 go test -count=1 -run '^TestStuckPodBenchmarkReport$' -v ./proxy`.
func TestStuckPodBenchmarkReport(t *testing.T) {
	if os.Getenv("PODRES_BENCH") == "" {
		t.Skip("set PODRES_BENCH=1 to run the benchmark report")
	}
	sizes, rounds := []int{110, 250}, 301
	if os.Getenv("PODRES_BENCH") == "quick" {
		sizes, rounds = []int{10}, 5
	}
	var b strings.Builder
	b.WriteString("\nA List with one pod stuck before its sandbox, without the Pods API (median µs, p90 µs, /pods reads)\n")
	b.WriteString("| pods | with the pod logs directory | without (a read per List) | ratio of medians |\n|---|---|---|---|\n")
	for _, n := range sizes {
		pods := append(benchPods(n), stuckPod("uid-stuck", gpuUUID2))
		with := newHarness(t, withRateLimit(0, 0))
		without := newHarness(t, withRateLimit(0, 0), withProviders(func(p *proxy.Providers) { p.PodLogs = nil }))
		var times [2][]float64
		var reads [2]int64
		for i, h := range []*harness{with, without} {
			h.k.SetPods(pods...)
			h.list() // the first read, which both make
			reads[i] = h.k.PodsReads()
		}
		clients := []v1.PodResourcesListerClient{
			v1.NewPodResourcesListerClient(dialBench(t, with.socket)),
			v1.NewPodResourcesListerClient(dialBench(t, without.socket)),
		}
		for range rounds {
			for i, c := range clients {
				start := time.Now()
				resp, err := c.List(ctx(t), &v1.ListPodResourcesRequest{})
				times[i] = append(times[i], float64(time.Since(start).Microseconds()))
				if err != nil {
					t.Fatal(err)
				}
				if got := devicesOf(findPod(resp, "ml", "stuck"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID2}) {
					t.Fatalf("the stuck pod shows %v, want [%s]", got, gpuUUID2)
				}
			}
		}
		for i, h := range []*harness{with, without} {
			reads[i] = h.k.PodsReads() - reads[i]
		}
		fmt.Fprintf(&b, "| %d | %.0f, %.0f, %d reads | %.0f, %.0f, %d reads | %.1fx |\n", n,
			median(times[0]), percentile(times[0], 90), reads[0],
			median(times[1]), percentile(times[1], 90), reads[1], median(times[1])/median(times[0]))
	}
	t.Log(b.String())
}
