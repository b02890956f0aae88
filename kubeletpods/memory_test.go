package kubeletpods

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/podstest"
)

// The DaemonSet's GOMEMLIMIT (deploy/base), under its 128 MiB memory limit.
const daemonSetMemLimit = "100MiB"

// TestReadingFortyFourMiBOfFinishedPodsStaysWithinMemory reads a /pods of
// 35 finished pods of about 1.25 MiB each (44 MiB) in a child process with
// the DaemonSet's GOMEMLIMIT and checks the child's peak RSS (VmHWM): the
// read must succeed for the live pods without holding the answer.
func TestReadingFortyFourMiBOfFinishedPodsStaysWithinMemory(t *testing.T) {
	if url := os.Getenv("KUBELETPODS_MEMORY_CHILD"); url != "" {
		memoryChild(url)
		return
	}
	if testing.Short() {
		t.Skip("builds 44 MiB and runs a child process")
	}
	const name = "TestReadingFortyFourMiBOfFinishedPodsStaysWithinMemory"
	body := podstest.FinishedPodsJSON(35, 1300<<10, 3)
	if len(body) < 44<<20 {
		t.Fatalf("answer is %d bytes, want at least 44 MiB", len(body))
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	defer srv.Close()
	peak, out := runMemoryChild(t, name, srv.URL+"/pods")
	t.Logf("peak RSS while reading %d MiB of /pods: %d MiB (%s)", len(body)>>20, peak>>20, out)
	if !strings.Contains(out, "live=3 ") {
		t.Fatalf("the read did not give the 3 live pods with their annotations: %s", out)
	}
	if peak > 96<<20 {
		t.Fatalf("peak RSS %d MiB while reading %d MiB of /pods, want at most 96 MiB", peak>>20, len(body)>>20)
	}
}

// TestTenantsLargeHintsFailNoReadAndStayWithinMemory is issue 23: 105
// running pods each with a 255 KiB Koordinator device-allocate-hint (an
// allocator key, which the pod's owner writes) failed every /pods read
// ("larger than the limit (26214400 bytes)"), so another tenant's new pod
// got Unavailable. Read as the daemon reads (the DaemonSet's GOMEMLIMIT,
// the allocators' bounds) in a child process, the read must succeed, the
// new pod's allocation decode, and the child's peak RSS stay far under the
// DaemonSet's 128 MiB.
func TestTenantsLargeHintsFailNoReadAndStayWithinMemory(t *testing.T) {
	if url := os.Getenv("KUBELETPODS_HINTS_CHILD"); url != "" {
		hintsChild(url)
		return
	}
	if testing.Short() {
		t.Skip("builds 27 MiB and runs a child process")
	}
	const name = "TestTenantsLargeHintsFailNoReadAndStayWithinMemory"
	body := podstest.LargeHintsJSON(105, 255<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	defer srv.Close()
	peak, out := runMemoryChild(t, name, srv.URL+"/pods")
	t.Logf("peak RSS while reading %d MiB of /pods with 105 hints of 255 KiB: %d MiB (%s)", len(body)>>20, peak>>20, out)
	if !strings.Contains(out, " new="+podstest.NewPodGPU+" ") || !strings.Contains(out, " refusedHints=105 ") {
		t.Fatalf("the read did not give the new pod's GPU and the 105 hints refused: %s", out)
	}
	// The hints alone are 26 MiB: a read that grows by less holds none
	// of them. The race detector (CI) doubles the child's RSS: about
	// 7 MiB of growth without it, 18 MiB with it, on a 2-core machine.
	base := childField(t, out, "base=")
	if grew := peak - base; grew > 24<<20 {
		t.Errorf("the read grew the child's RSS by %d MiB (from %d to %d MiB), want at most 24 MiB", grew>>20, base>>20, peak>>20)
	}
	if peak > 96<<20 {
		t.Errorf("peak RSS %d MiB while reading %d MiB of /pods, want at most 96 MiB", peak>>20, len(body)>>20)
	}
}

// hintsChild reads url once as the daemon does, with the bounds of every
// allocator, and prints the devices the new pod's annotations decode to,
// how many pods' hints were refused, and its peak RSS.
func hintsChild(url string) {
	set := allocator.NewSet(nil, nil, must(registry.NewFormats(registry.Names(), registry.Options{}))...)
	base := procStatus("VmRSS:")
	c, err := NewClient(Config{URL: url, Timeout: time.Minute, MaxAnnotationBytes: set.MaxAnnotationBytes})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	pods, err := c.Pods(context.Background())
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	var ids []string
	refused := 0
	for _, p := range pods {
		if _, ok := model.Oversized(p.Annotations[koordinator.HintAnnotation]); ok {
			refused++
		}
		if p.Name != podstest.Name(105) {
			continue
		}
		devs, errs := set.Decode(model.PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}, p.Annotations)
		if errs != nil {
			fmt.Println("error: new pod:", errs)
			os.Exit(1)
		}
		for _, d := range devs {
			ids = append(ids, d.IDs...)
		}
	}
	fmt.Printf("pods=%d new=%s refusedHints=%d base=%d hwm=%d\n", len(pods), strings.Join(ids, ","), refused, base, vmHWM())
	os.Exit(0)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// runMemoryChild runs the test name again as a child reading url, with the
// DaemonSet's GOMEMLIMIT, and returns its peak RSS and what it printed.
func runMemoryChild(t *testing.T, name, url string) (int64, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KUBELETPODS_MEMORY_CHILD="+url, "KUBELETPODS_HINTS_CHILD="+url, "GOMEMLIMIT="+daemonSetMemLimit)
	outb, err := cmd.CombinedOutput()
	out := strings.TrimSpace(string(outb))
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	return childField(t, out, "hwm="), out
}

// childField returns the figure in KiB that the child printed after
// prefix, in bytes.
func childField(t *testing.T, out, prefix string) int64 {
	t.Helper()
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, prefix); ok {
			kb, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("child printed no %s: %s", prefix, out)
	return 0
}

// memoryChild reads url once and prints what it got and its peak RSS.
func memoryChild(url string) {
	c, err := NewClient(Config{URL: url, Timeout: time.Minute})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	pods, err := c.Pods(context.Background())
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	live := 0
	for _, p := range pods {
		if !p.Terminal() && len(p.Annotations) == 1 {
			live++
		}
	}
	fmt.Printf("pods=%d live=%d hwm=%d\n", len(pods), live, vmHWM())
	os.Exit(0)
}

// vmHWM is this process's peak resident set size in KiB.
func vmHWM() int64 { return procStatus("VmHWM:") }

// procStatus returns a field of /proc/self/status in KiB, -1 if missing.
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return -1
}
