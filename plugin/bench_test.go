package plugin

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/test/poll"
	"github.com/podres-proxy/podres-proxy/test/statetest"
)

func TestEventsReachDiskWithoutHandlersWaitingForIt(t *testing.T) {
	stateDir := t.TempDir()
	store, err := state.Open(stateDir, state.Options{Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	dir := shortTempDir(t)
	rt := startRuntime(t, dir, nil, nil)
	p := startPlugin(t, store, dir)
	poll.Until(t, "Synchronize", p.Synced)
	rt.waitPlugins(t, 1)

	pod := k8sPod("web")
	ctr := k8sCtr(pod, "app", api.ContainerState_CONTAINER_RUNNING)
	rt.mustSend(t, "RunPodSandbox", pod, nil)
	rt.mustSend(t, "PostStartContainer", pod, ctr)
	statetest.Wait(t, store, "container running", func() bool { return statetest.ContainerState(store, pod.Uid, ctr.Id) == model.ContainerRunning })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := store.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	// What a restarted daemon finds.
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := state.Open(stateDir, state.Options{Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if got := statetest.ContainerState(again, pod.Uid, ctr.Id); got != model.ContainerRunning || statetest.Phase(again, pod.Uid) != record.PhaseReady {
		t.Errorf("after reopening: pod %q, container %q; want ready, running:\n%s", statetest.Phase(again, pod.Uid), got, statetest.Dump(again))
	}
}

// BenchmarkHandlerLatency drives pod lifecycles (7 NRI events each) through
// nri's own runtime side over a real socket into the store, and reports:
//   - rtt-p50/p99-µs: each event as the runtime sees it, from the request
//     to the plugin's answer, socket and ttrpc included;
//   - handler-p50/p99-µs: the plugin's handler alone, store update included;
//   - durable-p50/p99-ms (stores on disk): from a record's first change not
//     yet on disk to its file being durable (the store's OnDurable), that
//     is, event to durable file.
//
// "memory" measures the plugin alone. "disk" sends events back to back, far
// faster than a node produces them, so the writer falls behind and the
// durable figures measure that backlog. "disk-paced" sends 100 events a
// second, a burst of about 14 pods started and deleted every second.
func BenchmarkHandlerLatency(b *testing.B) {
	b.Run("memory", func(b *testing.B) { benchmarkEvents(b, false, 0) })
	b.Run("disk", func(b *testing.B) { benchmarkEvents(b, true, 0) })
	b.Run("disk-paced", func(b *testing.B) { benchmarkEvents(b, true, 10*time.Millisecond) })
}

// benchmarkEvents sends b.N events, one every interval (0: back to back).
func benchmarkEvents(b *testing.B, onDisk bool, interval time.Duration) {
	var (
		mu      sync.Mutex
		durable []time.Duration
	)
	opts := state.Options{
		Decoder: statetest.NewDecoder(),
		Log:     testLog(),
		OnDurable: func(d time.Duration) {
			mu.Lock()
			durable = append(durable, d)
			mu.Unlock()
		},
	}
	store := state.New(opts)
	if onDisk {
		var err error
		if store, err = state.Open(b.TempDir(), opts); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { store.Close() })
	}
	dir := shortTempDir(b)
	rt := startRuntime(b, dir, nil, nil)
	p := startPlugin(b, store, dir)
	poll.Until(b, "Synchronize", p.Synced)
	rt.waitPlugins(b, 1)

	lifecycle := []string{"RunPodSandbox", "PostCreateContainer", "PostStartContainer",
		"StopContainer", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox"}
	rtt := make([]time.Duration, 0, b.N)
	ctx := context.Background()
	var pod *api.PodSandbox
	var ctr *api.Container
	var tick <-chan time.Time
	if interval > 0 {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		tick = ticker.C
	}
	b.ResetTimer()
	for i := range b.N {
		if tick != nil {
			<-tick
		}
		step := i % len(lifecycle)
		if step == 0 {
			pod = k8sPod("bench-" + strconv.Itoa(i))
			ctr = k8sCtr(pod, "app", api.ContainerState_CONTAINER_RUNNING)
		}
		took, err := rt.send(ctx, lifecycle[step], pod, ctr)
		if err != nil {
			b.Fatal(err)
		}
		rtt = append(rtt, took)
	}
	b.StopTimer()
	flushCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := store.Flush(flushCtx); err != nil {
		b.Fatal(err)
	}

	p.metrics.mu.Lock()
	handler := slices.Clone(p.metrics.took)
	p.metrics.mu.Unlock()
	mu.Lock()
	dur := slices.Clone(durable)
	mu.Unlock()
	b.ReportMetric(percentile(rtt, 50).Seconds()*1e6, "rtt-p50-µs")
	b.ReportMetric(percentile(rtt, 99).Seconds()*1e6, "rtt-p99-µs")
	b.ReportMetric(percentile(handler, 50).Seconds()*1e6, "handler-p50-µs")
	b.ReportMetric(percentile(handler, 99).Seconds()*1e6, "handler-p99-µs")
	if onDisk {
		b.ReportMetric(percentile(dur, 50).Seconds()*1e3, "durable-p50-ms")
		b.ReportMetric(percentile(dur, 99).Seconds()*1e3, "durable-p99-ms")
	}
}

func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}
