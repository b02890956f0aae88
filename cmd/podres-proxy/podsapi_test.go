package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podres-proxy/podres-proxy/test/clients"
	"github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/podsapitest"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// metricsText returns serve's /metrics.
func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
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

// kubeletWithPodsAPI starts a fake kubelet and a fake Pods API in a new
// directory.
func kubeletWithPodsAPI(t *testing.T) (*fakekubelet.Kubelet, *podsapitest.Server, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := fakekubelet.Start(t, dir)
	api := podsapitest.New(filepath.Join(dir, "pods-api.sock"))
	if err := api.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Stop)
	return k, api, dir
}

// startServeWatching starts serve on the Pods API and waits for its watch
// to sync.
func startServeWatching(t *testing.T, k *fakekubelet.Kubelet, api *podsapitest.Server, dir string) served {
	t.Helper()
	srv := startServe(t, k, dir, "--kubelet-pods-api-socket", api.Socket())
	poll.Until(t, "the Pods API watch to sync", func() bool {
		return strings.Contains(metricsText(t, srv.metrics), `podres_proxy_pods_api_relists_total 1`)
	})
	return srv
}

func TestPodsBeingCreatedAreLearnedFromThePodsAPIWithoutReadingPods(t *testing.T) {
	// A kubelet with the PodsAPI gate on: new pods are learned from its
	// watch, with their annotations, before their sandboxes exist. Pods
	// being created are answered with their devices at CNI ADD time and
	// /pods is never read.
	k, api, dir := kubeletWithPodsAPI(t)
	srv := startServeWatching(t, k, api, dir)

	var pods []fakekubelet.Pod
	for i, gpu := range []string{gpuUUID, "GPU-2c1b5e0f-0000-4a4a-9b9b-123456789abc"} {
		name := []string{"a", "b"}[i]
		p := fakekubelet.NewPod("ml", name, "uid-"+name, fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
				`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+gpu+`"}]}`),
			fakekubelet.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
		pods = append(pods, p)
		k.SetPods(pods...) // the kubelet's PodResources (and /pods, which must not be read)
		api.Add(&p.Pod)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ids, err := clients.KataCDIDevices(ctx, srv.socket, "ml", name)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if want := "nvidia.com/gpu=" + gpu; !slices.Contains(ids, want) {
			t.Errorf("pod %s being created: Get gives %v, want %s", name, ids, want)
		}
	}
	if n := k.PodsReads(); n != 0 {
		t.Errorf("/pods was read %d times, want 0: the Pods API answers", n)
	}

	// The Pods API goes away (the gate turned off, a kubelet downgrade):
	// /pods takes over.
	api.Stop()
	third := "GPU-3d2c6f10-1111-4b4b-8c8c-23456789abcd"
	c := fakekubelet.NewPod("ml", "c", "uid-c", fakekubelet.WithSchedulerName("koord-scheduler"),
		fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
			`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+third+`"}]}`),
		fakekubelet.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
	k.SetPods(append(pods, c)...)
	poll.Until(t, "the new pod to be answered from /pods", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ids, err := clients.KataCDIDevices(ctx, srv.socket, "ml", "c")
		return err == nil && slices.Contains(ids, "nvidia.com/gpu="+third)
	})
	if k.PodsReads() == 0 {
		t.Error("with the Pods API gone, /pods was never read")
	}
}

func TestAPodStuckBeforeItsSandboxCostsNoReadPerListWithThePodsAPI(t *testing.T) {
	// A pod stuck in ContainerCreating (a missing Secret) and a finished
	// Job pod are in every List the kubelet answers. With the Pods API's
	// watch the store knows which pod each name is, so polling consumers
	// (DCGM exporter, NFD, RTE) cost the kubelet no read per List.
	k, api, dir := kubeletWithPodsAPI(t)
	stuck := fakekubelet.NewPod("ml", "stuck", "uid-stuck", fakekubelet.WithSchedulerName("koord-scheduler"),
		fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
			`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+gpuUUID+`"}]}`),
		fakekubelet.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
	stuck.Status.Phase = "Pending"
	done := fakekubelet.NewPod("batch", "job-x7k2p", "uid-job")
	done.Status.Phase = "Succeeded"
	k.SetPods(stuck, done)
	api.Add(&stuck.Pod)
	api.Add(&done.Pod)
	srv := startServeWatching(t, k, api, dir)
	lists := api.ListCalls()
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		owners, err := clients.DCGMDeviceToPod(ctx, srv.socket)
		cancel()
		if err != nil {
			t.Fatalf("List %d: %v", i, err)
		}
		if owners[gpuUUID].Pod != "stuck" {
			t.Fatalf("List %d: %s is labelled %+v, want the stuck pod that holds it", i, gpuUUID, owners[gpuUUID])
		}
	}
	if n := api.ListCalls() - lists; n != 0 {
		t.Errorf("10 Lists cost %d ListPods calls, want 0", n)
	}
	if n := k.PodsReads(); n != 0 {
		t.Errorf("10 Lists cost %d /pods reads, want 0", n)
	}
}

func TestAPodRecreatedAfterTheWatchDroppedIsNotAnsweredFromIt(t *testing.T) {
	// While the watch is synced, a List answers a pod not running from
	// what the watch said of it, and the answer is reused while nothing
	// changes. The Pods API goes away; the pod is deleted and recreated
	// under its name with another GPU, its PodResources entry the same
	// bytes (a pod without the kubelet's own devices). Nothing tells the
	// daemon which pod the name is now but a read: the reused answer
	// must not outlive the watch.
	k, api, dir := kubeletWithPodsAPI(t)
	pod := func(uid, gpu string) fakekubelet.Pod {
		p := fakekubelet.NewPod("ml", "a", uid, fakekubelet.WithSchedulerName("koord-scheduler"),
			fakekubelet.WithAnnotation("scheduling.koordinator.sh/device-allocated",
				`{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+gpu+`"}]}`),
			fakekubelet.WithContainer("train", map[string]string{"koordinator.sh/gpu-core": "100"}))
		p.Status.Phase = "Pending"
		return p
	}
	first := pod("uid-first", gpuUUID)
	k.SetPods(first)
	api.Add(&first.Pod)
	srv := startServeWatching(t, k, api, dir)
	owner := func(gpu string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		owners, err := clients.DCGMDeviceToPod(ctx, srv.socket)
		if err != nil {
			t.Fatal(err)
		}
		return owners[gpu].Pod
	}
	for range 2 {
		if got := owner(gpuUUID); got != "a" {
			t.Fatalf("%s is labelled %q, want pod a", gpuUUID, got)
		}
	}

	api.Stop()
	poll.Until(t, "the watch to end", func() bool {
		return !strings.Contains(metricsText(t, srv.metrics), `podres_proxy_pods_api_reconnects_total 0`)
	})
	second := "GPU-2c1b5e0f-0000-4a4a-9b9b-123456789abc"
	k.SetPods(pod("uid-second", second))
	k.BeginSandbox("ml", "a", "uid-second") // its CNI ADD: DCGM's List comes in between
	if got := owner(second); got != "a" {
		t.Errorf("after the watch dropped, the recreated pod's %s is labelled %q, want pod a", second, got)
	}
	if got := owner(gpuUUID); got != "" {
		t.Errorf("after the watch dropped, its predecessor's %s is still labelled %q", gpuUUID, got)
	}
}
