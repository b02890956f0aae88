package state

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// BenchmarkEventToDurable measures, on the real file system, the time from
// a change to a record (an NRI event) to the record being durable on disk,
// as OnDurable reports it. burst=1 is a lone event; burst=100 is a
// Synchronize or a /pods read that changes 100 pods at once. Each iteration
// waits until the burst is durable, so latencies do not include a queue
// built up by the benchmark itself. The target is p99 <= 100 ms.
func BenchmarkEventToDurable(b *testing.B) {
	for _, burst := range []int{1, 100} {
		b.Run(fmt.Sprintf("burst=%d", burst), func(b *testing.B) {
			dir, err := os.MkdirTemp("", "podres-state-bench-")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(dir)
			var mu sync.Mutex
			var latencies []time.Duration
			durable := make(chan struct{}, burst)
			s, err := Open(dir, Options{Log: quietLog(), OnDurable: func(d time.Duration) {
				mu.Lock()
				latencies = append(latencies, d)
				mu.Unlock()
				durable <- struct{}{}
			}})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			uid := func(i int) string { return fmt.Sprintf("pod-%04d", i) }
			for i := range burst {
				s.ObserveSandbox(record.OriginNRI, readySandbox(uid(i), "ns", uid(i), "sb-"+uid(i), nil))
			}
			if err := s.Flush(context.Background()); err != nil {
				b.Fatal(err)
			}
			for range burst {
				<-durable
			}
			mu.Lock()
			latencies = latencies[:0]
			mu.Unlock()

			b.ResetTimer()
			for n := range b.N {
				state := model.ContainerRunning
				if n%2 == 1 {
					state = model.ContainerStopped
				}
				for i := range burst {
					s.ObserveContainer(record.OriginNRI, model.RuntimeContainer{ID: "c-" + uid(i), SandboxID: "sb-" + uid(i), Name: "app", State: state})
				}
				for range burst {
					<-durable
				}
			}
			b.StopTimer()

			mu.Lock()
			defer mu.Unlock()
			slices.Sort(latencies)
			pct := func(p int) float64 {
				i := min(len(latencies)*p/100, len(latencies)-1)
				return float64(latencies[i]) / float64(time.Millisecond)
			}
			b.ReportMetric(pct(50), "p50-ms")
			b.ReportMetric(pct(99), "p99-ms")
			b.ReportMetric(float64(latencies[len(latencies)-1])/float64(time.Millisecond), "max-ms")
		})
	}
}
