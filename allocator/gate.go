package allocator

import (
	"slices"

	"github.com/podres-proxy/podres-proxy/model"
)

// The trust gate (package trust) asks what it must know of one scheduler's
// format through the optional interfaces below, which formats implement and
// the Set answers for, so that the gate never names a format.

// Scheduled is implemented by formats whose annotations are believed only on
// the pods of known schedulers.
type Scheduled interface {
	// SchedulerNames returns the spec.schedulerName of the pods the format's
	// scheduler places by default.
	SchedulerNames() []string
}

// SchedulerNames returns the default scheduler names of the allocator named
// (Scheduled); nil when the set has no such format or it names none.
func (s *Set) SchedulerNames(allocator string) []string {
	if f, ok := s.byName[allocator].(Scheduled); ok {
		return slices.Clone(f.SchedulerNames())
	}
	return nil
}

// CoWritten is implemented by formats some of whose annotations another
// allocator's scheduler writes too (HAMi's Ascend keys, which Volcano's vNPU
// support writes on Volcano's pods).
type CoWritten interface {
	// AlsoWrittenBy returns the other allocators whose schedulers write the
	// annotation dev was decoded from; nil for none.
	AlsoWrittenBy(dev model.Device) []string
}

// AlsoWrittenBy returns the other allocators whose schedulers write dev's
// annotation (CoWritten).
func (s *Set) AlsoWrittenBy(dev model.Device) []string {
	if f, ok := s.byName[dev.Allocator].(CoWritten); ok {
		return f.AlsoWrittenBy(dev)
	}
	return nil
}

// Exclusive is implemented by formats whose allocator gives some devices to
// one pod only (Koordinator's whole GPU, VF, PF, FPGA), so that a later pod
// naming one of them is contesting it. Shares, and every other allocator's
// devices, are never contested.
type Exclusive interface {
	// Exclusive reports whether dev, one of the format's devices, is the
	// pod's alone.
	Exclusive(dev model.Device) bool
}

// Exclusive reports whether dev can be one pod's only (Exclusive).
func (s *Set) Exclusive(dev model.Device) bool {
	f, ok := s.byName[dev.Allocator].(Exclusive)
	return ok && f.Exclusive(dev)
}

// Capped is implemented by formats whose allocator allocates per pod from
// the sum of its containers' requests (Koordinator), so that an annotation
// naming more pod-level devices of a kind than that sum names devices nobody
// was given. Allocators that list devices per container (HAMi, Volcano vGPU)
// or whose share may span several GPUs (TensorFusion) are not capped.
type Capped interface {
	// Cap returns how many pod-level devices of dev's kind the pod may
	// hold; asks counts what the pod's containers ask for of a kind of
	// device (Set.Asks).
	Cap(dev model.Device, asks func(model.Device) int64) int64
}

// Cap returns how many pod-level devices of dev's kind the pod of spec may
// hold; capped is false when dev's allocator does not cap them (Capped).
func (s *Set) Cap(spec *model.PodSpec, dev model.Device) (n int64, capped bool) {
	f, ok := s.byName[dev.Allocator].(Capped)
	if !ok {
		return 0, false
	}
	return f.Cap(dev, func(d model.Device) int64 { return s.Asks(spec, d) }), true
}

// Carver is implemented by formats whose MIG instances a device plugin
// carves, as the containers are created, out of the GPUs the scheduler gave
// the pod, and which name them where the scheduler did not write them
// (TensorFusion's partition-uuids in a container's annotations, which a
// runtime's pass-through of pod annotations may let the pod's owner write).
// The instance's parent is then the only link to the scheduler's decision,
// so the trust gate believes an instance only on one of the pod's GPUs.
type Carver interface {
	// CarvedFrom returns the GPUs the pod's annotations say its scheduler
	// gave it, of which dev (one of the format's devices) must be a slice;
	// confined is false when the format does not confine dev's parent (a
	// whole GPU, a MIG instance the scheduler itself named).
	CarvedFrom(dev model.Device, annotations map[string]string) (gpus []string, confined bool)
}

// CarvedFrom asks dev's allocator which GPUs dev must be carved from, given
// the pod's annotations (Carver); confined is false when the allocator does
// not say.
func (s *Set) CarvedFrom(dev model.Device, annotations map[string]string) (gpus []string, confined bool) {
	c, ok := s.byName[dev.Allocator].(Carver)
	if !ok {
		return nil, false
	}
	return c.CarvedFrom(dev, annotations)
}
