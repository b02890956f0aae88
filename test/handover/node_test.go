package handover

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/nriruntime"
)

// The node: the fake kubelet (PodResources and /pods) and the NRI runtime,
// with pods placed by koord-scheduler as test/churn places them (the
// scheduler's device-allocated annotation; one steady pod has a device of
// the kubelet's own device manager too). Names are never reused and no
// device is ever given to two pods, so every answer about a name has one
// right set of devices.

const (
	namespace = "handover"
	koordKey  = "scheduling.koordinator.sh/device-allocated"
	gpuRes    = "nvidia.com/gpu"      // serve's default --gpu-resource-name
	rdmaRes   = "koordinator.sh/rdma" // and --rdma-resource-name
	nicRes    = "example.com/nic"     // a device plugin's, through the kubelet
	steady    = 6                     // pods that run the whole test
)

// pod is one pod under its (never reused) name.
type pod struct {
	name, uid string
	fk        fk.Pod
	devices   []string // "resource=id", sorted: what every answer gives it
	steady    bool     // running for the whole test: owed in every answer
	sandbox   *api.PodSandbox
	ctr       *api.Container
}

type node struct {
	k  *fk.Kubelet
	rt *nriruntime.Runtime

	mu     sync.Mutex
	listed []*pod          // what the kubelet lists, in admission order
	known  map[string]*pod // every pod ever listed, by name
	made   int             // devices handed out
	uids   int
}

func newNode(k *fk.Kubelet, rt *nriruntime.Runtime) *node {
	return &node{k: k, rt: rt, known: map[string]*pod{}}
}

// gpu is the n-th GPU's UUID and koord-scheduler's entry for it.
func gpu(n int) (id, entry string) {
	id = fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", n, n)
	return id, fmt.Sprintf(`"gpu":[{"minor":%d,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"},"id":"%s"}]`, n, id)
}

// vf is the n-th RDMA VF's PCI address and koord-scheduler's entry for it.
func vf(n int) (id, entry string) {
	pf := fmt.Sprintf("0000:%02x:00.0", 0x3b+n/16)
	id = fmt.Sprintf("0000:%02x:%02x.%d", 0x3b+n/16, 2+n%16/8, n%8)
	return id, fmt.Sprintf(`"rdma":[{"minor":%d,"resources":{"koordinator.sh/rdma":"100"},"id":"%s","extension":{"vfs":[{"minor":-1,"busID":"%s"}]}}]`, n/16, pf, id)
}

// newPod makes a pending pod under name with a GPU of its own, and an RDMA
// VF when withVF; the caller lists it.
func (n *node) newPod(name string, withVF bool, opts ...fk.PodOption) *pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.uids++
	uid := fmt.Sprintf("%s-uid-%d", name, n.uids)
	gid, gEntry := gpu(n.made)
	devices := []string{gpuRes + "=" + gid}
	entries := []string{gEntry}
	if withVF {
		vid, vEntry := vf(n.made)
		devices = append(devices, rdmaRes+"="+vid)
		entries = append(entries, vEntry)
	}
	n.made++
	opts = append([]fk.PodOption{fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, "{"+strings.Join(entries, ",")+"}"),
		fk.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "100"}),
		fk.WithPhase(corev1.PodPending)}, opts...)
	p := &pod{name: name, uid: uid, fk: fk.NewPod(namespace, name, uid, opts...), devices: devices}
	for _, ds := range p.fk.Devices {
		for _, d := range ds {
			for _, id := range d.GetDeviceIds() {
				p.devices = append(p.devices, d.GetResourceName()+"="+id)
			}
		}
	}
	sort.Strings(p.devices)
	return p
}

// populate lists and starts the steady pods and the named others before
// serve starts.
func (n *node) populate(ctx context.Context, others ...string) map[string]*pod {
	out := map[string]*pod{}
	for i := range steady {
		var opts []fk.PodOption
		if i == 0 {
			opts = append(opts, fk.WithKubeletDevices("app", nicRes, 0, "nic-0"))
		}
		p := n.newPod(fmt.Sprintf("steady-%d", i), true, opts...)
		p.steady = true
		n.admit(p)
		n.start(ctx, p)
	}
	for _, name := range others {
		p := n.newPod(name, true)
		n.admit(p)
		n.start(ctx, p)
		out[name] = p
	}
	return out
}

// admit has the kubelet list p, pending.
func (n *node) admit(p *pod) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.known[p.name] = p
	n.listed = append(n.listed, p)
	n.publish()
}

// start has the kubelet start a pending pod: its log directory, its
// sandbox and container through NRI, then Running.
func (n *node) start(ctx context.Context, p *pod) {
	n.k.BeginSandbox(namespace, p.name, p.uid)
	p.sandbox, p.ctr = nriruntime.SandboxOf(namespace, p.name, p.uid, p.fk.Annotations)
	n.rt.RunSandbox(ctx, p.sandbox, p.ctr)
	n.mu.Lock()
	defer n.mu.Unlock()
	p.fk.Status.Phase = corev1.PodRunning
	n.publish()
}

// remove deletes a running pod as the kubelet does: its container and
// sandbox stop, the kubelet forgets it, the runtime removes the sandbox,
// its log directory goes.
func (n *node) remove(ctx context.Context, p *pod) error {
	n.rt.StopSandbox(ctx, p.sandbox, p.ctr)
	n.mu.Lock()
	n.listed = slices.DeleteFunc(n.listed, func(l *pod) bool { return l == p })
	n.publish()
	n.mu.Unlock()
	n.rt.RemoveSandbox(ctx, p.sandbox, p.ctr)
	if err := os.RemoveAll(filepath.Join(n.k.PodLogsDir, namespace+"_"+p.name+"_"+p.uid)); err != nil {
		return fmt.Errorf("removing the log directory of %s: %w", p.name, err)
	}
	return nil
}

// publish gives the kubelet what it lists now; n.mu is held.
func (n *node) publish() {
	pods := make([]fk.Pod, 0, len(n.listed))
	for _, p := range n.listed {
		pods = append(pods, p.fk)
	}
	n.k.SetPods(pods...)
}

// pod is the pod ever listed under name, nil if none.
func (n *node) pod(name string) *pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.known[name]
}

// steadyPods are the pods owed in every answer.
func (n *node) steadyPods() []*pod {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*pod
	for _, p := range n.listed {
		if p.steady {
			out = append(out, p)
		}
	}
	return out
}

// newest is the name of the pod admitted last, for a Get of a pod being
// created (Multus's question).
func (n *node) newest() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.listed[len(n.listed)-1].name
}

// load keeps the runtime relaying events until ctx ends, as a busy node
// does: a pod admitted, its sandbox and container started, and once four
// such pods run the oldest deleted: seven NRI events a round, a step every
// 5 ms or so (a pace, not a synchronization).
func (n *node) load(ctx context.Context, errs chan<- error) {
	var running []*pod
	for i := 0; ctx.Err() == nil; i++ {
		p := n.newPod(fmt.Sprintf("load-%d", i), false)
		n.admit(p)
		if !pause(ctx) {
			return
		}
		n.start(ctx, p)
		running = append(running, p)
		if len(running) > 4 {
			if !pause(ctx) {
				return
			}
			if err := n.remove(ctx, running[0]); err != nil {
				errs <- err
				return
			}
			running = running[1:]
		}
		if !pause(ctx) {
			return
		}
	}
}

// pause waits 5 ms, and reports false if ctx ended first.
func pause(ctx context.Context) bool {
	t := time.NewTimer(5 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
