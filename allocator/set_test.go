package allocator

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/model"
)

// fakeDecoder returns fixed devices and error, or panics.
type fakeDecoder struct {
	name    string
	key     string
	devices []model.Device
	err     error
	panics  bool
}

func (f *fakeDecoder) Name() string             { return f.name }
func (f *fakeDecoder) Relevant(key string) bool { return key == f.key }
func (f *fakeDecoder) Decode(ann map[string]string) ([]model.Device, error) {
	if _, ok := ann[f.key]; !ok {
		return nil, nil
	}
	if f.panics {
		panic("assignment to entry in nil map") // a decoder bug
	}
	return append([]model.Device(nil), f.devices...), f.err
}
func (f *fakeDecoder) Wants(model.Device, map[string]string) (int64, bool) { return 0, false }

func quietLog() *logrus.Logger { l, _ := logtest.NewNullLogger(); return l }

var testPod = model.PodRef{UID: "u-1", Namespace: "ml", Name: "train-0"}

func TestSetRelevantIfAnyDecoderReadsTheKey(t *testing.T) {
	s := NewSet(nil, nil, koordinator.New(koordinator.Options{}), &fakeDecoder{name: "hami", key: "hami.io/vgpu-devices-allocated"})
	for key, want := range map[string]bool{
		koordinator.Annotation:           true,
		"hami.io/vgpu-devices-allocated": true,
		"kubernetes.io/config.seen":      false,
	} {
		if got := s.Relevant(key); got != want {
			t.Errorf("Relevant(%q) = %v; want %v", key, got, want)
		}
	}
}

func TestSetDecodeReturnsEveryDecodersDevicesInDecoderOrder(t *testing.T) {
	other := &fakeDecoder{name: "hami", key: "hami", devices: []model.Device{{Resource: "nvidia.com/gpu", IDs: []string{"GPU-h"}}}}
	s := NewSet(nil, onError(func(string) { t.Error("onError called without an error") }), other, koordinator.New(koordinator.Options{}))
	got, errs := s.Decode(testPod, map[string]string{"hami": "x", koordinator.Annotation: `{"gpu":[{"minor":0,"id":"GPU-k"}]}`})
	if errs != nil {
		t.Fatalf("errors: %v", errs)
	}
	want := []model.Device{
		{Allocator: "hami", Resource: "nvidia.com/gpu", IDs: []string{"GPU-h"}},
		gpu("GPU-k", 0),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Decode:\n got %+v\nwant %+v", got, want)
	}
}

func TestSetDecodeMalformedAnnotationWarnsCountsAndKeepsTheOthers(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	var counted []string
	other := &fakeDecoder{name: "hami", key: "hami", devices: []model.Device{{Resource: "nvidia.com/gpu", IDs: []string{"GPU-h"}}}}
	s := NewSet(log, onError(func(a string) { counted = append(counted, a) }), koordinator.New(koordinator.Options{}), other)

	got, errs := s.Decode(testPod, map[string]string{"hami": "x", koordinator.Annotation: `{"gpu":[null]}`})

	if want := []model.Device{{Allocator: "hami", Resource: "nvidia.com/gpu", IDs: []string{"GPU-h"}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("devices = %+v; want only the other allocator's %+v", got, want)
	}
	if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), "koordinator: decode "+koordinator.Annotation+": gpu[0]: null allocation") {
		t.Errorf("errors = %v; want one naming the allocator, annotation and entry", errs)
	}
	if !reflect.DeepEqual(counted, []string{"koordinator"}) {
		t.Errorf("onError calls = %v; want [koordinator]", counted)
	}
	entries := hook.AllEntries()
	if len(entries) != 1 {
		t.Fatalf("log entries = %d; want 1", len(entries))
	}
	e := entries[0]
	if e.Level != logrus.WarnLevel || e.Data["pod"] != "ml/train-0" || e.Data["uid"] != "u-1" || e.Data["allocator"] != "koordinator" || e.Data[logrus.ErrorKey] == nil {
		t.Errorf("log entry = %v %v; want a warning naming pod, uid, allocator and error", e.Level, e.Data)
	}
}

func TestSetDecodeKeepsTheDevicesOfAPartlyUnderstoodAnnotation(t *testing.T) {
	var counted int
	s := NewSet(quietLog(), onError(func(string) { counted++ }), koordinator.New(koordinator.Options{}))
	got, errs := s.Decode(testPod, map[string]string{koordinator.Annotation: `{"gpu":[{"minor":0,"id":"GPU-k"}],"xpu":[{"id":"X"}]}`})
	if want := []model.Device{gpu("GPU-k", 0)}; !reflect.DeepEqual(got, want) {
		t.Errorf("devices = %+v; want %+v", got, want)
	}
	if len(errs) != 1 || counted != 1 {
		t.Errorf("errors = %v, onError calls = %d; want 1 and 1", errs, counted)
	}
}

func TestSetDecodeTurnsADecoderPanicIntoAnError(t *testing.T) {
	s := NewSet(quietLog(), nil, &fakeDecoder{name: "buggy", key: "k", panics: true}, koordinator.New(koordinator.Options{}))
	got, errs := s.Decode(testPod, map[string]string{"k": "v", koordinator.Annotation: `{"gpu":[{"minor":0,"id":"GPU-k"}]}`})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "buggy: decoder panicked") {
		t.Errorf("errors = %v; want the panic as an error", errs)
	}
	if want := []model.Device{gpu("GPU-k", 0)}; !reflect.DeepEqual(got, want) {
		t.Errorf("devices = %+v; want %+v", got, want)
	}
}

func TestSetDecodeRejectsDevicesWithoutResourceOrWithEmptyIDs(t *testing.T) {
	for name, dev := range map[string]model.Device{
		"no resource": {IDs: []string{"a"}},
		"empty id":    {Resource: "r", IDs: []string{"a", ""}},
	} {
		t.Run(name, func(t *testing.T) {
			cause := errors.New("partly understood")
			s := NewSet(quietLog(), nil, &fakeDecoder{name: "bad", key: "k", devices: []model.Device{{Resource: "r", IDs: []string{"ok"}}, dev}, err: cause})
			got, errs := s.Decode(testPod, map[string]string{"k": "v"})
			if got != nil {
				t.Errorf("devices = %+v; want none from a decoder that produced an invalid device", got)
			}
			if len(errs) != 1 || !errors.Is(errs[0], cause) || !strings.Contains(errs[0].Error(), "device 1") {
				t.Errorf("errors = %v; want the decoder's error and the invalid device", errs)
			}
		})
	}
}

func TestNewSetPanicsOnTwoDecodersWithOneName(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("NewSet accepted two decoders named koordinator")
		}
	}()
	NewSet(nil, nil, koordinator.New(koordinator.Options{}), koordinator.New(koordinator.Options{GPUResource: "amd.com/gpu"}))
}

// vfAnnotation is a Koordinator allocation of one NIC with n VFs.
func vfAnnotation(n int) string {
	var b strings.Builder
	b.WriteString(`{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"100"},"id":"0000:01:00.0","extension":{"vfs":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"busID":"0000:%02x:%02x.%d"}`, 2+i/256, (i/8)%32, i%8)
	}
	b.WriteString(`]}}]}`)
	return b.String()
}

// An annotation naming thousands of VFs, still within Kubernetes' 256 KiB
// for all of a pod's annotations, is refused as malformed with an error
// naming the pod and the limit; the pod's other allocators keep theirs.
func TestDecodeRefusesAPodOverTheDeviceLimit(t *testing.T) {
	value := vfAnnotation(6000)
	if len(value) > 256<<10 {
		t.Fatalf("annotation of %d bytes: want it within 256 KiB", len(value))
	}
	s := NewSet(quietLog(), nil, hami.New(hami.Options{}), koordinator.New(koordinator.Options{}))
	devices, errs := s.Decode(testPod, map[string]string{
		koordinator.Annotation: value,
		hami.NVIDIAAnnotation:  hamiExample,
	})
	if len(errs) != 1 {
		t.Fatalf("errors = %v; want one, for the Koordinator annotation", errs)
	}
	want := fmt.Sprintf("koordinator: pod %s/%s: 6001 devices, 256 allowed per pod (--max-devices-per-pod): annotation refused as malformed", testPod.Namespace, testPod.Name)
	if errs[0].Error() != want {
		t.Errorf("error = %q; want %q", errs[0], want)
	}
	if len(devices) != 1 || devices[0].Allocator != hami.Name {
		t.Errorf("devices = %+v; want HAMi's one vGPU only", devices)
	}
}

func TestDecodeLimitIsConfigurable(t *testing.T) {
	s := NewSet(quietLog(), nil, koordinator.New(koordinator.Options{}))
	s.LimitDevicesPerPod(4)
	if devices, errs := s.Decode(testPod, map[string]string{koordinator.Annotation: vfAnnotation(4)}); errs != nil || len(devices) != 1 || len(devices[0].IDs) != 4 {
		t.Errorf("4 VFs with a limit of 4: %+v, %v; want them all", devices, errs)
	}
	if devices, errs := s.Decode(testPod, map[string]string{koordinator.Annotation: vfAnnotation(5)}); len(errs) != 1 || devices != nil ||
		!strings.Contains(errs[0].Error(), "5 devices, 4 allowed per pod") {
		t.Errorf("5 VFs with a limit of 4: %+v, %v; want none and the limit's error", devices, errs)
	}
}

func BenchmarkDecodeOverTheLimit(b *testing.B) {
	s := NewSet(quietLog(), nil, koordinator.New(koordinator.Options{}))
	ann := map[string]string{koordinator.Annotation: vfAnnotation(6000)}
	for b.Loop() {
		s.Decode(testPod, ann)
	}
}

// fakeContainerDecoder adds, for each container whose annotations have its
// key, the devices it holds, or panics.
type fakeContainerDecoder struct {
	fakeDecoder
	add []model.Device
}

func (f *fakeContainerDecoder) RelevantToContainer(key string) bool { return key == f.key }
func (f *fakeContainerDecoder) DecodeContainer(devices []model.Device, container string, ann map[string]string) ([]model.Device, error) {
	if _, ok := ann[f.key]; !ok {
		return devices, nil
	}
	if f.panics {
		panic("index out of range") // a decoder bug
	}
	for _, d := range f.add {
		d.Container = container
		devices = append(devices, d)
	}
	return devices, f.err
}

// Container annotations are applied container by container, in name order,
// by the decoders that read them; a decoder's panic or a result past the
// device limit leaves the pod's devices as they were, reported.
func TestSetDecodeContainers(t *testing.T) {
	pod := []model.Device{gpu("GPU-pod", 0)}
	mig := model.Device{Allocator: "tf", Type: "gpu", Resource: "nvidia.com/gpu", IDs: []string{"MIG-a"}}
	in := func(d model.Device, c string) model.Device { d.Container = c; return d }
	ctrs := map[string]map[string]string{"b": {"k": "v"}, "a": {"k": "v"}, "plain": {"other": "x"}}

	s := NewSet(quietLog(), nil, koordinator.New(koordinator.Options{}), &fakeContainerDecoder{fakeDecoder: fakeDecoder{name: "tf", key: "k"}, add: []model.Device{mig}})
	if !s.RelevantToContainer("k") || s.RelevantToContainer(koordinator.Annotation) {
		t.Error("RelevantToContainer: want only the container decoder's key")
	}
	got, errs := s.DecodeContainers(testPod, pod, ctrs)
	if want := []model.Device{gpu("GPU-pod", 0), in(mig, "a"), in(mig, "b")}; len(errs) != 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("DecodeContainers = %+v, %v; want %+v", got, errs, want)
	}

	var counted []string
	buggy := NewSet(quietLog(), onError(func(a string) { counted = append(counted, a) }), &fakeContainerDecoder{fakeDecoder: fakeDecoder{name: "tf", key: "k", panics: true}})
	got, errs = buggy.DecodeContainers(testPod, pod, ctrs)
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "tf: decoder panicked") || !reflect.DeepEqual(got, pod) || len(counted) != 2 {
		t.Errorf("a panicking decoder: %+v, %v, counted %v; want the pod's devices and the panics as errors", got, errs, counted)
	}

	over := NewSet(quietLog(), nil, &fakeContainerDecoder{fakeDecoder: fakeDecoder{name: "tf", key: "k"}, add: []model.Device{mig, mig}})
	over.LimitDevicesPerPod(2)
	got, errs = over.DecodeContainers(testPod, pod, ctrs)
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "allowed per pod") || !reflect.DeepEqual(got, pod) {
		t.Errorf("past the limit: %+v, %v; want the pod's devices and errors", got, errs)
	}

	bad := NewSet(quietLog(), nil, &fakeContainerDecoder{fakeDecoder: fakeDecoder{name: "tf", key: "k"}, add: []model.Device{{Allocator: "tf", Resource: "nvidia.com/gpu", IDs: []string{""}}}})
	if got, errs = bad.DecodeContainers(testPod, pod, ctrs); len(errs) != 2 || !reflect.DeepEqual(got, pod) {
		t.Errorf("an empty id: %+v, %v; want the pod's devices and errors", got, errs)
	}
}

func TestMaxAnnotationBytesBoundsEveryAllocatorKeyAndTheHintMost(t *testing.T) {
	s := NewSet(quietLog(), nil, koordinator.New(koordinator.Options{}), hami.New(hami.Options{}))
	for key, want := range map[string]int{
		koordinator.Annotation:           DefaultMaxAnnotationBytes,
		koordinator.HintAnnotation:       4 << 10,
		"hami.io/vgpu-devices-allocated": DefaultMaxAnnotationBytes,
		"kubernetes.io/config.seen":      0,
	} {
		if got := s.MaxAnnotationBytes(key); got != want {
			t.Errorf("MaxAnnotationBytes(%q) = %d; want %d", key, got, want)
		}
	}
}

// An allocation a pod source left unread for its size (kubeletpods keeps
// none over its bound) is refused on that pod, like any malformed one:
// warned, counted, shown; the other allocators' devices stay.
func TestSetDecodeRefusesAnOversizedAllocationAsMalformed(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	var counted []string
	other := &fakeDecoder{name: "hami", key: "hami", devices: []model.Device{{Resource: "nvidia.com/gpu", IDs: []string{"GPU-h"}}}}
	s := NewSet(log, onError(func(a string) { counted = append(counted, a) }), koordinator.New(koordinator.Options{}), other)

	got, errs := s.Decode(testPod, map[string]string{
		"hami":                 "x",
		koordinator.Annotation: model.OversizedAnnotation("300000 bytes in the kubelet's /pods, over the bound of 65536 for this annotation"),
	})

	if want := []model.Device{{Allocator: "hami", Resource: "nvidia.com/gpu", IDs: []string{"GPU-h"}}}; !reflect.DeepEqual(got, want) {
		t.Errorf("devices = %+v; want only the other allocator's %+v", got, want)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "koordinator: annotation "+koordinator.Annotation+" refused as malformed: 300000 bytes") {
		t.Errorf("errors = %v; want one saying the allocation was refused for its size", errs)
	}
	if !reflect.DeepEqual(counted, []string{"koordinator"}) || len(hook.AllEntries()) != 1 {
		t.Errorf("onError calls = %v, log entries %d; want [koordinator] and one warning", counted, len(hook.AllEntries()))
	}
}

// Of the hint only allocateStrategy is read: one too large to keep makes
// the allocation read as without a hint (requests in percent), reported,
// but the pod keeps its devices.
func TestSetDecodeKeepsTheAllocationOfAPodWhoseHintIsOversized(t *testing.T) {
	var counted int
	s := NewSet(quietLog(), onError(func(string) { counted++ }), koordinator.New(koordinator.Options{}))
	got, errs := s.Decode(testPod, map[string]string{
		koordinator.HintAnnotation: model.OversizedAnnotation("261120 bytes in the kubelet's /pods, over the bound of 4096 for this annotation"),
		koordinator.Annotation:     `{"gpu":[{"minor":0,"id":"GPU-k"}]}`,
	})
	if want := []model.Device{gpu("GPU-k", 0)}; !reflect.DeepEqual(got, want) {
		t.Errorf("devices = %+v; want %+v", got, want)
	}
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), koordinator.HintAnnotation+" refused as malformed") || counted != 1 {
		t.Errorf("errors = %v, onError calls = %d; want one about the hint", errs, counted)
	}
}

// onError counts a Set's malformed annotations with a func.
type onError func(allocator string)

func (f onError) AnnotationError(allocator string) { f(allocator) }
