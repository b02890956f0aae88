package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/tabletest"
)

// TestServeShowsWhyAnAllocationIsRefused is what an operator sees when a
// tenant copies a Koordinator annotation onto a pod of default-scheduler,
// and when an annotation carries an id with a terminal escape: the query
// shows neither, inspect marks both refused with the reason and the class
// (forged, malformed), the metric counts them, the log names the pods, and
// the scheduler's own pod keeps its GPU.
func TestServeShowsWhyAnAllocationIsRefused(t *testing.T) {
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	alloc := func(id string) string {
		return `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"` + id + `"}]}`
	}
	const escaped = `GPU-5f1d6b3c-8a2e-4f0b-9c1d-2e3f4a5b6c7d\u001b[2J`
	k := fakekubelet.Start(t, dir)
	k.SetPods(
		fakekubelet.NewPod("ml", "trainer", "uid-1", fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated", alloc(gpuUUID)),
			fakekubelet.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"})),
		fakekubelet.NewPod("tenant", "copycat", "uid-2",
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated", alloc(gpuUUID)),
			fakekubelet.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100"})),
		fakekubelet.NewPod("tenant", "escape", "uid-3", fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated", alloc(escaped)),
			fakekubelet.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100"})))
	srv := startServe(t, k, dir, "--sysfs-root", "", "--device-cr=false")

	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"query", "list", "--socket", srv.socket}, &out, &errOut); code != 0 {
		t.Fatalf("query list exited %d: %s", code, errOut.String())
	}
	if !tabletest.HasLine(out.String(), "ml", "trainer", "train", "nvidia.com/gpu", gpuUUID) {
		t.Errorf("the scheduler's own pod lost its GPU:\n%s", out.String())
	}
	if tabletest.HasLine(out.String(), "tenant", "nvidia.com/gpu") {
		t.Errorf("a refused allocation is answered:\n%s", out.String())
	}

	poll.Until(t, "the refusals to be on disk", func() bool {
		out.Reset()
		return run(context.Background(), []string{"inspect", "--state-dir", srv.stateDir}, &out, io.Discard) == 0 &&
			strings.Count(out.String(), "[refused]") == 2
	})
	table := out.String()
	for _, words := range [][]string{
		{"tenant", "copycat", "nvidia.com/gpu=" + gpuUUID + "(koordinator)[refused]"},
		{"tenant/copycat", "koordinator nvidia.com/gpu=" + gpuUUID, "wrong-scheduler (forged)", `pod scheduled by "default-scheduler"`},
		{"tenant/escape", "koordinator nvidia.com/gpu=", `\x1b[2J"`, "unsafe-id (malformed)"},
	} {
		if !tabletest.HasLine(table, words...) {
			t.Errorf("inspect lacks a line with %q:\n%s", words, table)
		}
	}
	if strings.ContainsRune(table, '\x1b') {
		t.Errorf("inspect prints a tenant's terminal escape raw:\n%q", table)
	}
	if tabletest.HasLine(table, "ml", "trainer", "[refused]") {
		t.Errorf("inspect marks the scheduler's own pod refused:\n%s", table)
	}

	resp, err := http.Get("http://" + srv.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, m := range []string{
		`podres_proxy_allocations_refused_total{allocator="koordinator",reason="wrong-scheduler"} 1`,
		`podres_proxy_allocations_refused_total{allocator="koordinator",reason="unsafe-id"} 1`,
	} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if logs := srv.logs.String(); !strings.Contains(logs, "pod=tenant/copycat") || !strings.Contains(logs, "reason=wrong-scheduler") {
		t.Errorf("no warning names the copycat and the reason:\n%s", logs)
	}
}
