package churn

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/nriruntime"
	"github.com/podres-proxy/podres-proxy/test/podsapitest"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

const clients = 8

func TestMain(m *testing.M) {
	code := m.Run()
	serveBinary.Remove()
	os.Exit(code)
}

func TestUnderChurnAndAKillEveryAnswerReadingPodsIsWhatTheNodeHeld(t *testing.T) {
	churn(t, false)
}

func TestUnderChurnAndAKillEveryAnswerWatchingThePodsAPIIsWhatTheNodeHeld(t *testing.T) {
	churn(t, true)
}

// churn runs the node's churn for PODRES_CHURN (default 15 s) under 8
// polling clients, serve killed with SIGKILL and started again on its
// state directory halfway, and fails on any answer the node never held.
func churn(t *testing.T, podsAPI bool) {
	length, seed := settings(t)
	t.Logf("seed %d (PODRES_CHURN_SEED=%d replays the node's changes), %v of churn", seed, seed, length)

	dir, err := os.MkdirTemp("", "churn-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := fk.Start(t, dir)
	var api *podsapitest.Server
	apiSocket := ""
	if podsAPI {
		api = podsapitest.New(filepath.Join(dir, "pods-api.sock"))
		if err := api.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(api.Stop)
		apiSocket = api.Socket()
	}
	rt := nriruntime.Start(t, dir, "churn-runtime")
	n := newNode(k, api, rt)
	d := newDriver(n, seed)
	ctx, cancel := context.WithCancel(context.Background())
	d.populate(ctx, 30) // the pods the node runs when serve starts

	socket := filepath.Join(dir, "proxy", "kubelet.sock")
	srv := startServe(t, dir, podsAPI,
		"--socket", socket,
		"--kubelet-socket", k.Socket,
		"--kubelet-pods-url", k.PodsURL,
		"--kubelet-token-file", k.TokenFile,
		"--kubelet-ca-file", k.CAFile,
		"--kubelet-pods-api-socket", apiSocket,
		"--kubelet-pod-logs-dir", k.PodLogsDir,
		"--state-dir", filepath.Join(dir, "state"),
		"--device-info-dir", filepath.Join(dir, "devinfo"),
		"--nri-socket", rt.Socket,
		"--cri-socket", "",
		"--rate-limit-qps", "0", // 8 clients polling without pause
		"--device-cr=false",
		"--sysfs-root", "",
	)
	poll.Until(t, "serve's NRI plugin to connect", func() bool { return rt.Plugins() == 1 })

	c := &checker{n: n, seed: seed, socket: socket}
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { d.run(ctx) })
	for i := range clients {
		wg.Go(func() { c.client(ctx, i) })
	}

	<-time.After(length / 2) // the run's length, not a synchronization
	c.outages.Add(1)
	srv.kill(t)
	before := d.steps.Load()
	poll.Until(t, "the node to change while serve is down", func() bool { return d.steps.Load() >= before+3 })
	srv.start(t)
	c.outages.Add(1)
	<-time.After(length - length/2)
	cancel()
	wg.Wait()

	source := "/pods"
	if podsAPI {
		source = "the Pods API"
	}
	t.Logf("churn, serve reading %s: %s; %d node changes %v, %d NRI events lost to the kill; serve killed (SIGKILL) and restarted once; seed %d",
		source, c.summary(), d.steps.Load(), d.actions, rt.Failed(), seed)
	if c.checked.Load() == 0 {
		t.Error("no answer was checked")
	}
	if err := c.failures(); err != nil {
		t.Errorf("%d wrong answers of %d; the first:\n%v\nserve's log:\n%s", c.wrong.Load(), c.checked.Load(), err, srv.logTail())
	}
	if len(d.errs) > 0 {
		t.Errorf("the node: %v", d.errs)
	}
	if log := srv.logTail(); strings.Contains(log, "DATA RACE") {
		t.Errorf("serve raced:\n%s", log)
	}
}

// settings are the run's length (PODRES_CHURN, a duration) and seed
// (PODRES_CHURN_SEED; else the clock's).
func settings(t *testing.T) (time.Duration, uint64) {
	length := 15 * time.Second
	if v := os.Getenv("PODRES_CHURN"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("PODRES_CHURN=%q: %v", v, err)
		}
		length = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("PODRES_CHURN_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("PODRES_CHURN_SEED=%q: %v", v, err)
		}
		seed = s
	}
	return length, seed
}
