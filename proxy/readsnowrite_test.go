package proxy_test

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/devinfo"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/state"
	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/poll"
)

// A query waits for no write but the device-info file of a VF its answer
// hands out, the first time (docs/design.md, "The answer path").

// stalledDeviceInfo is a device-info writer whose writes for one pod hang
// until released, as on a disk that stalls: the rest it passes to w.
type stalledDeviceInfo struct {
	*devinfo.Writer
	uid      string
	holding  chan struct{} // closed when the stalled pod's write began
	release  chan struct{}
	once     sync.Once
	released sync.Once
}

func (s *stalledDeviceInfo) Hold(pod model.PodRef, devices []model.Device) {
	if pod.UID == s.uid && slices.ContainsFunc(devices, s.Wants) {
		s.once.Do(func() { close(s.holding) })
		<-s.release
	}
	s.Writer.Hold(pod, devices)
}

func (s *stalledDeviceInfo) free() { s.released.Do(func() { close(s.release) }) }

// Another pod's device-info write, stalled, holds up no answer but those
// that hand its VF out (a List does), which come with the file in place.
func TestAStalledDeviceInfoWriteHoldsUpOnlyTheAnswerWithItsVF(t *testing.T) {
	w := &stalledDeviceInfo{
		Writer: devinfo.New(devinfo.Options{Dir: shortDir(t), SysfsRoot: shortDir(t)}),
		uid:    "uid-vf", holding: make(chan struct{}), release: make(chan struct{}),
	}
	h := newHarness(t, withProviders(func(d *proxy.Providers) { d.DeviceInfo = w }))
	t.Cleanup(w.free) // registered after the harness's stop: runs first
	gpu := fk.NewPod("team", "gpu-pod", "uid-gpu", byKoord, koordApp, fk.WithAnnotation(koordKey, `{"gpu":[{"minor":1,"resources":{"koordinator.sh/gpu-core":"100"},"id":"`+gpuUUID2+`"}]}`))
	vf := fk.NewPod("team", "rdma-pod", "uid-vf", byKoord, koordApp, fk.WithAnnotation(koordKey, gpuAndVF))
	h.k.SetPods(gpu, vf)
	h.markLive(gpu, "sb-gpu")
	if got := devicesOf(h.get("team", "gpu-pod"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID2}) {
		t.Fatalf("gpu-pod got GPUs %v, want %s", got, gpuUUID2)
	}

	// The VF's pod starts; its spec is read in the background and its
	// device-info write begins, and stalls.
	h.markLive(vf, "sb-vf")
	<-w.holding
	if got := devicesOf(h.get("team", "gpu-pod"), "app")["nvidia.com/gpu"]; !slices.Equal(got, []string{gpuUUID2}) {
		t.Errorf("gpu-pod got GPUs %v while another pod's device-info stalled, want %s", got, gpuUUID2)
	}

	// Multus's Get of the VF's pod is answered once the file is there.
	type answer struct {
		ids  []string
		file error
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := h.v1().Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "team", PodName: "rdma-pod"})
		if err != nil {
			got <- answer{err: err}
			return
		}
		_, file := os.Stat(w.Path("koordinator.sh/rdma", vfAddr))
		got <- answer{ids: devicesOf(resp.GetPodResources(), "app")["koordinator.sh/rdma"], file: file}
	}()
	w.free()
	a := <-got
	if a.err != nil || !slices.Equal(a.ids, []string{vfAddr}) {
		t.Fatalf("rdma-pod got VFs %v, %v; want %s", a.ids, a.err, vfAddr)
	}
	if a.file != nil {
		t.Errorf("rdma-pod was answered with its VF before its device-info file was written: %v", a.file)
	}
}

// A device-info write that never ends (a hung filesystem) costs the
// answers with its VF a bounded wait, never the answer: Multus treats the
// file as optional, and failing every List with that pod would fail every
// consumer's.
func TestAStalledDeviceInfoWriteFailsNoAnswer(t *testing.T) {
	w := &stalledDeviceInfo{
		Writer: devinfo.New(devinfo.Options{Dir: shortDir(t), SysfsRoot: shortDir(t)}),
		uid:    "uid-vf", holding: make(chan struct{}), release: make(chan struct{}),
	}
	h := newHarness(t, withViews(merge.Plain), withProviders(func(d *proxy.Providers) { d.DeviceInfo = w }))
	t.Cleanup(w.free) // registered after the harness's stop: runs first
	vf := fk.NewPod("team", "rdma-pod", "uid-vf", byKoord, koordApp, fk.WithAnnotation(koordKey, gpuAndVF))
	h.k.SetPods(vf)
	h.markLive(vf, "sb-vf")
	<-w.holding

	for _, sock := range []string{h.socket, h.views[merge.Plain]} {
		c := v1.NewPodResourcesListerClient(h.connTo(sock))
		resp, err := c.Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "team", PodName: "rdma-pod"})
		if got := devicesOf(resp.GetPodResources(), "app")["koordinator.sh/rdma"]; err != nil || !slices.Equal(got, []string{vfAddr}) {
			t.Errorf("Get on %s while the VF's device-info write stalled: VFs %v, %v; want %s", sock, got, err, vfAddr)
		}
		list, err := c.List(ctx(t), &v1.ListPodResourcesRequest{})
		if err != nil || len(list.GetPodResources()) != 1 {
			t.Fatalf("List on %s while the VF's device-info write stalled: %v, %v; want the VF's pod", sock, list, err)
		}
		if got := devicesOf(list.GetPodResources()[0], "app")["koordinator.sh/rdma"]; !slices.Equal(got, []string{vfAddr}) {
			t.Errorf("List on %s while the VF's device-info write stalled: VFs %v, want %s", sock, got, vfAddr)
		}
	}
}

// withStateDir persists the harness's store in dir, as serve's is.
func withStateDir(dir string) option {
	return func(h *harness) {
		h.providers = append(h.providers, func(p *proxy.Providers) {
			s, err := state.Open(dir, state.Options{Decoder: p.Allocators})
			if err != nil {
				h.t.Fatal(err)
			}
			// Closed after the proxy stopped (cleanups run last first).
			h.t.Cleanup(func() {
				if err := s.Close(); err != nil {
					h.t.Errorf("close the store: %v", err)
				}
			})
			h.store, p.Store = s, s
		})
	}
}

// watchWrites reports every file created, written, renamed, removed or
// changed in dirs from now on (inotify): changes() returns the paths of
// those made before it was called and not yet returned.
func watchWrites(t *testing.T, dirs ...string) (changes func() []string) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	names := map[int32]string{}
	for _, dir := range dirs {
		wd, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MODIFY|unix.IN_CLOSE_WRITE|
			unix.IN_MOVED_TO|unix.IN_MOVED_FROM|unix.IN_DELETE|unix.IN_ATTRIB)
		if err != nil {
			t.Fatalf("watch %s: %v", dir, err)
		}
		names[int32(wd)] = dir
	}
	return func() []string {
		var out []string
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if errors.Is(err, unix.EAGAIN) {
				return out
			}
			if err != nil {
				t.Fatalf("read inotify events: %v", err)
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				wd := int32(binary.NativeEndian.Uint32(buf[off:]))
				size := int(binary.NativeEndian.Uint32(buf[off+12:]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+size]), "\x00")
				out = append(out, filepath.Join(names[wd], name))
				off += unix.SizeofInotifyEvent + size
			}
		}
	}
}

// Once the node's pods are known, answering them writes nothing: no record
// file of the state directory, no device-info file, whatever the view and
// the API version asked.
func TestListsAndGetsOfKnownPodsWriteNothing(t *testing.T) {
	stateDir, infoDir := shortDir(t), shortDir(t)
	info := devinfo.New(devinfo.Options{Dir: infoDir, SysfsRoot: shortDir(t)})
	h := newHarness(t, withStateDir(stateDir), withViews(merge.DCGM, merge.Plain, merge.Kata),
		withProviders(func(d *proxy.Providers) { d.DeviceInfo = info }))
	vf := fk.NewPod("team", "rdma-pod", "uid-vf", byKoord, koordApp, fk.WithAnnotation(koordKey, gpuAndVF))
	// Claims the VF pod's GPU: refused, and the refusal recorded.
	thief := fk.NewPod("team", "thief", "uid-thief", byKoord, koordApp, fk.WithAnnotation(koordKey, oneGPU))
	// Known from /pods only: no sandbox yet.
	waiting := fk.NewPod("team", "waiting", "uid-waiting", byKoord, koordApp, fk.WithAnnotation(koordKey, twoGPUs))
	h.k.SetPods(vf, thief, waiting)
	h.markLive(vf, "sb-vf")
	h.markLive(thief, "sb-thief")
	if got := devicesOf(h.get("team", "rdma-pod"), "app")["koordinator.sh/rdma"]; !slices.Equal(got, []string{vfAddr}) {
		t.Fatalf("rdma-pod got VFs %v, want %s", got, vfAddr)
	}
	h.get("team", "thief")
	h.get("team", "waiting")
	poll.Until(t, "the refusal of the thief's GPU to be recorded", func() bool {
		r, ok := h.store.Get("uid-thief")
		return ok && len(r.Refused) > 0
	})
	if err := h.store.Flush(ctx(t)); err != nil {
		t.Fatal(err)
	}
	changes := watchWrites(t, filepath.Join(stateDir, "pods"), infoDir)

	for range 3 {
		for _, sock := range []string{h.socket, h.views[merge.DCGM], h.views[merge.Plain], h.views[merge.Kata]} {
			c := v1.NewPodResourcesListerClient(h.connTo(sock))
			if _, err := c.List(ctx(t), &v1.ListPodResourcesRequest{}); err != nil {
				t.Fatalf("List on %s: %v", sock, err)
			}
			for _, name := range []string{"rdma-pod", "thief", "waiting"} {
				if _, err := c.Get(ctx(t), &v1.GetPodResourcesRequest{PodNamespace: "team", PodName: name}); err != nil {
					t.Fatalf("Get %s on %s: %v", name, sock, err)
				}
			}
			if _, err := v1alpha1.NewPodResourcesListerClient(h.connTo(sock)).List(ctx(t), &v1alpha1.ListPodResourcesRequest{}); err != nil {
				t.Fatalf("v1alpha1 List on %s: %v", sock, err)
			}
		}
	}
	// Whatever the queries changed is on disk now.
	if err := h.store.Flush(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if got := changes(); len(got) > 0 {
		t.Errorf("Lists and Gets of known pods wrote %d times: %v", len(got), got)
	}
}
