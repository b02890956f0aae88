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

	"github.com/podres-proxy/podres-proxy/kubeletpods/podstest"
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
	body := podstest.FinishedPodsJSON(35, 1300<<10, 3)
	if len(body) < 44<<20 {
		t.Fatalf("answer is %d bytes, want at least 44 MiB", len(body))
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	defer srv.Close()
	peak, out := runMemoryChild(t, srv.URL+"/pods")
	t.Logf("peak RSS while reading %d MiB of /pods: %d MiB (%s)", len(body)>>20, peak>>20, out)
	if !strings.Contains(out, "live=3 ") {
		t.Fatalf("the read did not give the 3 live pods with their annotations: %s", out)
	}
	if peak > 96<<20 {
		t.Fatalf("peak RSS %d MiB while reading %d MiB of /pods, want at most 96 MiB", peak>>20, len(body)>>20)
	}
}

// runMemoryChild runs this test again as a child reading url, with the
// DaemonSet's GOMEMLIMIT, and returns its peak RSS and what it printed.
func runMemoryChild(t *testing.T, url string) (int64, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestReadingFortyFourMiBOfFinishedPodsStaysWithinMemory$", "-test.count=1")
	cmd.Env = append(os.Environ(), "KUBELETPODS_MEMORY_CHILD="+url, "GOMEMLIMIT="+daemonSetMemLimit)
	outb, err := cmd.CombinedOutput()
	out := strings.TrimSpace(string(outb))
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "hwm="); ok {
			kb, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10, out
		}
	}
	t.Fatalf("child printed no hwm=: %s", out)
	return 0, ""
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
func vmHWM() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb
		}
	}
	return -1
}
