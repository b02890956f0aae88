package plans

import (
	"maps"
	"slices"
	"sync"

	"github.com/podres-proxy/podres-proxy/model"
)

// holds runs the device-info writes of the pods' plans with at most one
// goroutine per pod: every change of the inventory, the holders or the
// shared GPUs decides every plan again, and while one pod's write is
// stalled (a hung filesystem) a goroutine per decision would pile up
// without bound, each waiting for the same path. A plan decided while its
// pod's write runs waits for the write after it instead, which a later
// decision takes over; only the latest is written.
type holds struct {
	w DeviceInfoWriter

	mu   sync.Mutex
	pods map[string]*podHold // by UID, while its goroutine runs
}

// podHold is the plan one pod's goroutine writes next, if any.
type podHold struct {
	ref  model.PodRef
	next *Plan
}

// hold has the files of plan's devices written, in start's goroutine for
// the pod when none runs; plan.written is closed once they are. It is
// called by the builder before plan is published, so that a plan waiting
// behind another can take over that one's written channel.
func (h *holds) hold(ref model.PodRef, plan *Plan, start func(func())) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ph, ok := h.pods[ref.UID]; ok {
		if ph.next != nil {
			// ph.next was never written and is no longer current: its
			// answers are done with the files of plan, which follow.
			plan.written = ph.next.written
		}
		ph.ref, ph.next = ref, plan
		return
	}
	if h.pods == nil {
		h.pods = map[string]*podHold{}
	}
	ph := &podHold{ref: ref, next: plan}
	h.pods[ref.UID] = ph
	start(func() { h.run(ph) })
}

// run writes the next plan of a pod until none is left.
func (h *holds) run(ph *podHold) {
	for {
		h.mu.Lock()
		ref, p := ph.ref, ph.next
		ph.next = nil
		if p == nil {
			delete(h.pods, ref.UID)
			h.mu.Unlock()
			return
		}
		h.mu.Unlock()
		for _, name := range slices.Sorted(maps.Keys(p.Containers)) {
			h.w.Hold(ref, p.Containers[name])
		}
		close(p.written)
	}
}
