package allocator

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/model"
)

// Format decodes one scheduler's annotation format.
type Format interface {
	// Name names the allocator in devices, logs and metrics ("koordinator").
	Name() string
	// Relevant reports whether the decoder reads the annotation key; the
	// store keeps only relevant annotations.
	Relevant(key string) bool
	// Decode returns the devices the pod's annotations allocate; (nil, nil)
	// when the decoder's annotations are absent. With an error, the devices
	// returned are those still trusted: none for a malformed annotation,
	// unless its format confines the damage (a HAMi container entry); the
	// others when only a part the decoder does not know was skipped.
	Decode(annotations map[string]string) ([]model.Device, error)
	// Wants says how much of dev a container with these requests asks for:
	// whole devices (>0), or share=true for a fraction; (0,false) = nothing
	// dev provides. It must depend only on dev's Type, Resource and
	// CountsRequests, not on the particular device: Assign asks once per
	// kind of device.
	Wants(dev model.Device, requests map[string]string) (whole int64, share bool)
}

// DefaultMaxAnnotationBytes bounds the value of an allocator annotation a
// pod source keeps (see MaxAnnotationBytes). DefaultMaxDevicesPerPod device
// ids are about 52 KiB in the wordiest format, Koordinator's GPU entries
// with their resources, as /pods encodes them (JSON in a JSON string);
// nothing larger is an allocation.
const DefaultMaxAnnotationBytes = 64 << 10

// Bounded is implemented by a Format some of whose annotations are far
// smaller than DefaultMaxAnnotationBytes, such as an input the pod's owner
// writes of which the decoder reads a word.
type Bounded interface {
	// MaxAnnotationBytes returns the bound of the key's value; 0 means
	// DefaultMaxAnnotationBytes.
	MaxAnnotationBytes(key string) int
}

// Set is the decoders of every allocator the daemon understands. It is the
// decode.Decoder the store calls and holds the attribution policy (Assign).
// It is safe for concurrent use if its decoders and Metrics are.
type Set struct {
	log        logrus.FieldLogger
	metrics    Metrics
	decoders   []Format
	byName     map[string]Format
	maxDevices int
}

// DefaultMaxDevicesPerPod bounds the device ids one pod's annotations may
// name. A node has a few dozen devices, a NIC at most a few hundred VFs; an
// annotation naming more is not an allocation, and every id costs memory in
// the store and in every List answer.
const DefaultMaxDevicesPerPod = 256

// Metrics receives what a Set counts; the daemon passes its one
// metrics.Metrics, so this package imports no Prometheus. The store decodes
// with its lock held, so it must be quick and must not call back into the
// store.
type Metrics interface {
	// AnnotationError counts one malformed annotation, by allocator.
	AnnotationError(allocator string)
}

// NewSet returns a set of decoders, consulted in the order given. log gets a
// warning per malformed annotation (nil: logrus's standard logger), and m,
// if not nil, counts it. Two decoders with one name are a wiring mistake and
// panic.
func NewSet(log logrus.FieldLogger, m Metrics, decoders ...Format) *Set {
	if log == nil {
		log = logrus.StandardLogger()
	}
	s := &Set{log: log, metrics: m, byName: map[string]Format{}, maxDevices: DefaultMaxDevicesPerPod}
	for _, d := range decoders {
		if d == nil {
			panic("allocator.NewSet: nil decoder")
		}
		if _, dup := s.byName[d.Name()]; dup {
			panic(fmt.Sprintf("allocator.NewSet: two decoders named %q", d.Name()))
		}
		s.byName[d.Name()] = d
		s.decoders = append(s.decoders, d)
	}
	return s
}

// LimitDevicesPerPod sets how many device ids one pod's annotations may name
// (DefaultMaxDevicesPerPod unless set); n must be positive. Call it before
// the set is used.
func (s *Set) LimitDevicesPerPod(n int) {
	if n <= 0 {
		panic(fmt.Sprintf("allocator.Set.LimitDevicesPerPod(%d): want a positive limit", n))
	}
	s.maxDevices = n
}

// formatOf returns the first decoder that reads the annotation key, nil when
// none does.
func (s *Set) formatOf(key string) Format {
	for _, d := range s.decoders {
		if d.Relevant(key) {
			return d
		}
	}
	return nil
}

// Relevant reports whether some decoder reads the annotation key.
func (s *Set) Relevant(key string) bool { return s.formatOf(key) != nil }

// MaxAnnotationBytes returns how large the annotation key's value may be for
// a pod source to keep it (kubeletpods.Config.MaxAnnotationBytes for /pods,
// podsapi.Options.MaxAnnotationBytes for the Pods API, and the store for the
// runtime's copy, as decode.Decoder): 0 when no decoder reads the key, else
// its decoder's bound (Bounded), by default DefaultMaxAnnotationBytes. A
// value over its bound reaches Decode as model.OversizedAnnotation and is
// refused as malformed.
func (s *Set) MaxAnnotationBytes(key string) int {
	d := s.formatOf(key)
	if d == nil {
		return 0
	}
	if b, ok := d.(Bounded); ok {
		if n := b.MaxAnnotationBytes(key); n > 0 {
			return n
		}
	}
	return DefaultMaxAnnotationBytes
}

// AllocatorOf returns the name of the first decoder that reads the
// annotation key, "" when none does.
func (s *Set) AllocatorOf(key string) string {
	if d := s.formatOf(key); d != nil {
		return d.Name()
	}
	return ""
}

// Decode implements decode.Decoder: it runs every decoder and returns the
// devices they trust, in decoder order. For each annotation a decoder could
// not (fully) understand it logs a warning naming the pod and the allocator,
// counts it in Metrics, and returns an error prefixed with the allocator's name; the
// pod is then answered without those devices, never refused.
//
// A decoder whose devices would take the pod past the limit on device ids
// (LimitDevicesPerPod) is refused as malformed, all its devices dropped: a
// partial list could hand a consumer an arbitrary subset of them.
//
// An annotation a pod source did not read because it was over its bound
// (model.OversizedAnnotation) is refused as malformed too: its decoder
// decodes the pod as if it were absent, and reports it. Koordinator's
// allocation is then not shown; its over-long hint only makes the
// allocation's requests read in percent, as an unreadable hint does.
func (s *Set) Decode(pod model.PodRef, annotations map[string]string) ([]model.Device, []error) {
	annotations, oversized := withoutOversized(annotations)
	var devices []model.Device
	var errs []error
	total := 0 // device ids so far
	for _, d := range s.decoders {
		got, err := decodeSafely(nil, func() ([]model.Device, error) {
			devs, err := d.Decode(annotations)
			for i := range devs {
				devs[i].Allocator = d.Name()
			}
			return devs, err
		})
		for _, key := range oversized {
			if d.Relevant(key.name) {
				err = errors.Join(fmt.Errorf("annotation %s refused as malformed: %s", key.name, key.detail), err)
			}
		}
		if n := countIDs(got); total+n > s.maxDevices {
			err = errors.Join(err, fmt.Errorf("pod %s/%s: %d devices, %d allowed per pod (--max-devices-per-pod): annotation refused as malformed",
				pod.Namespace, pod.Name, total+n, s.maxDevices))
			got = nil
		} else {
			total += n
		}
		if err != nil {
			s.report(pod, d.Name(), logrus.Fields{"kept": len(got)}, err, "allocator annotation not understood; the pod is answered without those devices")
			errs = append(errs, fmt.Errorf("%s: %w", d.Name(), err))
		}
		devices = append(devices, got...)
	}
	return devices, errs
}

// report logs a warning about an annotation of the pod that allocator could
// not (fully) understand, and counts it in Metrics.
func (s *Set) report(pod model.PodRef, allocator string, fields logrus.Fields, err error, msg string) {
	fields["pod"] = pod.Namespace + "/" + pod.Name
	fields["uid"] = pod.UID
	fields["allocator"] = allocator
	s.log.WithFields(fields).WithError(err).Warn(msg)
	if s.metrics != nil {
		s.metrics.AnnotationError(allocator)
	}
}

// oversizedKey is an annotation withoutOversized took out.
type oversizedKey struct{ name, detail string }

// withoutOversized returns annotations without the values a pod source
// left unread (model.OversizedAnnotation), and those keys, sorted. When
// there are none it returns annotations itself.
func withoutOversized(annotations map[string]string) (map[string]string, []oversizedKey) {
	var out []oversizedKey
	for k, v := range annotations {
		if detail, ok := model.Oversized(v); ok {
			out = append(out, oversizedKey{k, detail})
		}
	}
	if out == nil {
		return annotations, nil
	}
	slices.SortFunc(out, func(a, b oversizedKey) int { return strings.Compare(a.name, b.name) })
	rest := maps.Clone(annotations)
	for _, k := range out {
		delete(rest, k.name)
	}
	return rest, out
}

// countIDs counts the device ids of devices; a device named by minor or
// index only counts as one.
func countIDs(devices []model.Device) int {
	n := 0
	for _, d := range devices {
		n += max(1, len(d.IDs))
	}
	return n
}

// decodeSafely runs one decoder on untrusted input, and returns fallback,
// with an error, when it panics or returns an invalid device. Annotations are
// written by other programs and decoded inside NRI handlers, where a panic
// would take the daemon (and every consumer's answer) down, so a decoder's
// panic becomes an error like any malformed value. It also enforces what
// every consumer relies on, whatever the decoder: devices carry their
// allocator's name and a resource name, and no device id is empty.
func decodeSafely(fallback []model.Device, decode func() ([]model.Device, error)) (devices []model.Device, err error) {
	defer func() {
		if p := recover(); p != nil {
			devices, err = fallback, fmt.Errorf("decoder panicked: %v", p)
		}
	}()
	devices, err = decode()
	for i, dev := range devices {
		switch {
		case dev.Allocator == "":
			return fallback, errors.Join(err, fmt.Errorf("device %d (%s) has no allocator", i, dev.Resource))
		case dev.Resource == "":
			return fallback, errors.Join(err, fmt.Errorf("device %d (%s) has no resource name", i, dev.Type))
		case slices.Contains(dev.IDs, ""):
			return fallback, errors.Join(err, fmt.Errorf("device %d (%s) has an empty id", i, dev.Resource))
		}
	}
	return devices, err
}

// ContainerFormat is implemented by formats whose allocator writes some of
// an allocation per container, in the annotations the runtime creates the
// container with (a device plugin's AllocateResponse annotations), which
// never reach the pod's metadata: TensorFusion's MIG partitions.
type ContainerFormat interface {
	// RelevantToContainer reports whether the format reads a container
	// annotation key; the store keeps only those.
	RelevantToContainer(key string) bool
	// DecodeContainer returns devices, the pod's allocation so far, with
	// what one container's annotations say applied (devices added for that
	// container, or ones they supersede taken out). With an error it
	// returns the devices still trusted, usually devices unchanged. It must
	// not modify devices' elements.
	DecodeContainer(devices []model.Device, container string, annotations map[string]string) ([]model.Device, error)
}

// RelevantToContainer reports whether some decoder reads the container
// annotation key (ContainerFormat).
func (s *Set) RelevantToContainer(key string) bool {
	for _, d := range s.decoders {
		if c, ok := d.(ContainerFormat); ok && c.RelevantToContainer(key) {
			return true
		}
	}
	return false
}

// DecodeContainers implements decode.ContainerDecoder: it applies each
// container's annotations (by container name, in name order) to devices,
// the pod's decoded allocation, with every ContainerFormat, and returns the
// result. A decoder's panic, or a result past the limit on device ids,
// leaves devices as they were, reported like a malformed annotation.
func (s *Set) DecodeContainers(pod model.PodRef, devices []model.Device, containers map[string]map[string]string) ([]model.Device, []error) {
	var errs []error
	names := slices.Sorted(maps.Keys(containers))
	for _, d := range s.decoders {
		c, ok := d.(ContainerFormat)
		if !ok {
			continue
		}
		for _, name := range names {
			got, err := decodeSafely(devices, func() ([]model.Device, error) {
				return c.DecodeContainer(slices.Clip(devices), name, containers[name])
			})
			if n := countIDs(got); err == nil && n > s.maxDevices {
				got, err = devices, fmt.Errorf("pod %s/%s container %s: %d devices, %d allowed per pod (--max-devices-per-pod): annotation refused as malformed",
					pod.Namespace, pod.Name, name, n, s.maxDevices)
			}
			if err != nil {
				s.report(pod, d.Name(), logrus.Fields{"container": name}, err, "allocator container annotation not understood; the pod is answered without what it says")
				errs = append(errs, fmt.Errorf("%s: %w", d.Name(), err))
			}
			devices = got
		}
	}
	return devices, errs
}

// Replacer is implemented by decoders whose ids replace what the kubelet
// reports for their resources, because the allocator's device plugin gives
// the kubelet ids that name no real device (HAMi, Volcano vGPU).
type Replacer interface {
	// ReplacedResources lists the resource names whose kubelet ids are not
	// real device ids.
	ReplacedResources() []string
}

// ReplacedResources returns the resource names whose kubelet-reported ids
// some decoder of the set replaces. GetAllocatableResources must list the
// real devices under those names instead of the kubelet's ids, or NFD and
// resource-topology-exporter, which subtract List from allocatable per
// resource, would find List's ids unknown and count the fake ones as free.
func (s *Set) ReplacedResources() map[string]bool {
	out := map[string]bool{}
	for _, d := range s.decoders {
		if r, ok := d.(Replacer); ok {
			for _, name := range r.ReplacedResources() {
				out[name] = true
			}
		}
	}
	return out
}
