package proxy_test

import (
	"os"
	"testing"
	"time"
)

func TestTmpOneConn(t *testing.T) {
	os.Setenv("PODRES_BENCH_POD", "two-gpu")
	for _, n := range []int{110, 250, 500} {
		e := newBenchEnv(t, n)
		for _, one := range []bool{false, true} {
			start := time.Now()
			r := concurrentListsOn(t, e.proxy, e.k, 64, 20, one)
			el := time.Since(start)
			t.Logf("pods %d oneConn %v: %.3f calls/List, %v, %.0f Lists/s, %.0f calls/s", n, one, r, el.Round(time.Millisecond), 1280/el.Seconds(), r*1280/el.Seconds())
		}
	}
}
