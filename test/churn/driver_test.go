package churn

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/nriruntime"
)

// driver changes the node as a busy node changes: pods admitted (pending,
// then their log directory, sandbox and container), deleted, force-deleted
// (gone from the kubelet while their sandbox still runs a while) and
// recreated under their name at once with a new UID and another device,
// the old sandbox still running. It is the node's one writer; its random
// choices come from one seed.
type driver struct {
	n   *node
	rng *rand.Rand
	// free are the devices no pod holds: a device is taken back only once
	// the kubelet forgot its pod and the runtime removed its sandbox, as
	// the scheduler cannot give it to another pod sooner.
	free      []device
	byID      map[string]device
	made      int // names made
	uids      int
	pending   []*incarnation // listed, no sandbox yet
	running   []*incarnation // listed, sandbox running
	lingering []*incarnation // forgotten by the kubelet, sandbox still running
	actions   map[string]int
	steps     atomic.Int64
	errs      []error
}

// device is a GPU or an RDMA VF, and the annotation koord-scheduler
// writes for a pod it gives it (the shapes of the Koordinator fixtures in
// test/allocfixture/testdata/allocators).
type device struct {
	id         string
	annotation string
}

func devices() []device {
	var out []device
	for i := range 64 {
		uuid := fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", i, i)
		out = append(out, device{uuid, fmt.Sprintf(`{"gpu":[{"minor":%d,"resources":{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"},"id":"%s"}]}`, i, uuid)})
		pf := fmt.Sprintf("0000:%02x:00.0", 0x3b+i/16)
		vf := fmt.Sprintf("0000:%02x:%02x.%d", 0x3b+i/16, 2+i%16/8, i%8)
		out = append(out, device{vf, fmt.Sprintf(`{"rdma":[{"minor":%d,"resources":{"koordinator.sh/rdma":"100"},"id":"%s","extension":{"vfs":[{"minor":-1,"busID":"%s"}]}}]}`, i/16, pf, vf)})
	}
	return out
}

func newDriver(n *node, seed uint64) *driver {
	d := &driver{n: n, rng: rand.New(rand.NewPCG(seed, 0)), free: devices(), byID: map[string]device{}, actions: map[string]int{}}
	for _, dev := range d.free {
		d.byID[dev.id] = dev
	}
	return d
}

// populate admits and starts n pods at once.
func (d *driver) populate(ctx context.Context, n int) {
	for range n {
		d.admit(ctx, d.newName(), false)
		in := d.pending[len(d.pending)-1]
		d.pending = d.pending[:len(d.pending)-1]
		d.start(ctx, in)
	}
}

// run changes the node every 50 to 150 ms until ctx ends.
func (d *driver) run(ctx context.Context) {
	for {
		t := time.NewTimer(time.Duration(50+d.rng.IntN(101)) * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		d.step(ctx)
	}
}

// step makes one change, keeping 20 to 60 pods listed (so at most 67
// devices held, of 128).
func (d *driver) step(ctx context.Context) {
	defer d.steps.Add(1)
	listed := len(d.pending) + len(d.running)
	r := d.rng.IntN(100)
	switch {
	case len(d.lingering) > 0 && (len(d.lingering) > 6 || len(d.free) < 4 || r < 15):
		d.act("teardown", func() { d.teardown(ctx, take(d.rng, &d.lingering)) })
	case listed < 20:
		d.act("admit", func() { d.admit(ctx, d.newName(), false) })
	case len(d.pending) > 0 && (len(d.running) == 0 || r < 25):
		d.act("start", func() { d.start(ctx, take(d.rng, &d.pending)) })
	case r < 50 && listed < 60:
		d.act("admit", func() { d.admit(ctx, d.newName(), false) })
	case r < 70:
		d.act("delete", func() { d.delete(ctx, take(d.rng, &d.running)) })
	case r < 82:
		d.act("force-delete", func() { d.forceDelete(ctx, take(d.rng, &d.running)) })
	default:
		d.act("recreate", func() { d.recreate(ctx, take(d.rng, &d.running)) })
	}
}

func (d *driver) act(name string, f func()) {
	d.actions[name]++
	f()
}

func take[T any](rng *rand.Rand, s *[]T) T {
	i := rng.IntN(len(*s))
	v := (*s)[i]
	*s = append((*s)[:i], (*s)[i+1:]...)
	return v
}

func (d *driver) newName() string {
	d.made++
	return fmt.Sprintf("pod-%d", d.made)
}

// admit has the kubelet admit a pod under name with a free device: it is
// listed, pending, before its sandbox. A recreated pod's sandbox begins
// at once, as a StatefulSet's successor's does.
func (d *driver) admit(ctx context.Context, name string, recreated bool) {
	if !recreated {
		d.n.begin(name)
		defer d.n.end(name)
	}
	dev := take(d.rng, &d.free)
	d.uids++
	uid := fmt.Sprintf("%s-uid-%d", name, d.uids)
	in := &incarnation{name: name, uid: uid, devices: []string{dev.id},
		pod: fk.NewPod(namespace, name, uid, fk.WithSchedulerName("koord-scheduler"), fk.WithAnnotation(koordKey, dev.annotation),
			fk.WithContainer("app", map[string]string{"koordinator.sh/gpu-core": "100", "koordinator.sh/rdma": "100"}),
			fk.WithPhase(corev1.PodPending))}
	d.n.list(in)
	if recreated {
		d.startPod(ctx, in)
		return
	}
	d.pending = append(d.pending, in)
}

// start has the kubelet start a pending pod: its log directory, then its
// sandbox and container through NRI, then Running.
func (d *driver) start(ctx context.Context, in *incarnation) {
	d.n.begin(in.name)
	defer d.n.end(in.name)
	d.startPod(ctx, in)
}

func (d *driver) startPod(ctx context.Context, in *incarnation) {
	d.n.k.BeginSandbox(namespace, in.name, in.uid)
	in.sandbox, in.ctr = nriruntime.SandboxOf(namespace, in.name, in.uid, in.pod.Annotations)
	d.n.rt.RunSandbox(ctx, in.sandbox, in.ctr)
	d.n.setRunning(in)
	d.running = append(d.running, in)
}

// delete deletes a running pod gracefully: its container and sandbox
// stop, the kubelet forgets it, the runtime removes the sandbox, the log
// directory goes.
func (d *driver) delete(ctx context.Context, in *incarnation) {
	d.n.begin(in.name)
	defer d.n.end(in.name)
	d.n.rt.StopSandbox(ctx, in.sandbox, in.ctr)
	d.n.unlist(in)
	d.n.rt.RemoveSandbox(ctx, in.sandbox, in.ctr)
	d.gone(in)
}

// forceDelete force-deletes a running pod: the kubelet forgets it at once,
// its sandbox runs on until a teardown.
func (d *driver) forceDelete(ctx context.Context, in *incarnation) {
	d.n.begin(in.name)
	defer d.n.end(in.name)
	d.n.unlist(in)
	d.lingering = append(d.lingering, in)
}

// recreate force-deletes a running pod and at once admits and starts a
// new pod under its name with another device, the old sandbox running on.
func (d *driver) recreate(ctx context.Context, in *incarnation) {
	d.n.begin(in.name)
	defer d.n.end(in.name)
	d.n.noteRecreated(in.name)
	d.n.unlist(in)
	d.lingering = append(d.lingering, in)
	d.admit(ctx, in.name, true)
}

// teardown stops and removes a force-deleted pod's sandbox.
func (d *driver) teardown(ctx context.Context, in *incarnation) {
	d.n.begin(in.name)
	defer d.n.end(in.name)
	d.n.rt.StopSandbox(ctx, in.sandbox, in.ctr)
	d.n.rt.RemoveSandbox(ctx, in.sandbox, in.ctr)
	d.gone(in)
}

// gone removes a pod's log directory and frees its device.
func (d *driver) gone(in *incarnation) {
	if err := d.n.removeLogDir(in); err != nil {
		d.errs = append(d.errs, err)
	}
	d.free = append(d.free, d.byID[in.devices[0]])
}
