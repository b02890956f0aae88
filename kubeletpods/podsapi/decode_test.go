package podsapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podres-proxy/podres-proxy/kubeletpods/podsjson"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
	"github.com/podres-proxy/podres-proxy/test/podstest"
)

func keepExample(k string) bool { return strings.HasPrefix(k, "example.com/") }

// keepWhole turns keep into bounds that keep its keys whole.
func keepWhole(keep func(string) bool) annotationbound.Bounds {
	if keep == nil {
		return annotationbound.Bounds{}
	}
	return annotationbound.Bounds{Annotation: func(k string) int {
		if keep(k) {
			return 1 << 20
		}
		return 0
	}}
}

func testDecoder(keep func(string) bool) *decoder {
	return &decoder{maxPod: DefaultMaxPodBytes, annotations: keepWhole(keep)}
}

func marshal(t testing.TB, p *corev1.Pod) []byte {
	t.Helper()
	data, err := p.Marshal()
	if err != nil {
		t.Fatalf("marshal pod: %v", err)
	}
	return data
}

// equivalencePods are podstest's realistic pods (init containers,
// sidecars, GPU requests, finished pods, allocator annotations on every
// other pod) and a few shapes they lack: limits without requests,
// quantities the API server canonicalizes, hugepages, a pod without
// annotations.
func equivalencePods() *corev1.PodList {
	list := podstest.PodList(40, func(i int) map[string]string {
		if i%2 == 0 {
			return map[string]string{"example.com/gpu": `{"ids":["GPU-` + podstest.UID(i) + `"]}`}
		}
		return nil
	})
	always := corev1.ContainerRestartPolicyAlways
	extra := podstest.Pod(40, nil)
	extra.Annotations = nil
	extra.Spec.InitContainers = []corev1.Container{{
		Name:          "sidecar",
		RestartPolicy: &always,
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
			"example.com/nic":  resource.MustParse("1000m"),
			"hugepages-2Mi":    resource.MustParse("64Mi"),
			"example.com/fpga": resource.MustParse("2"),
		}},
	}}
	extra.Spec.Containers[0].Resources.Requests["example.com/vgpu-memory"] = resource.MustParse("4096")
	extra.Spec.Containers[0].Resources.Limits["example.com/vgpu-memory"] = resource.MustParse("4Ki")
	// A DRA driver satisfied an extended resource (KEP-5004).
	extra.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{
		ResourceClaimName: "pod-40-extended-resources-x7k2p",
		RequestMappings: []corev1.ContainerExtendedResourceRequest{
			{ContainerName: "sidecar", ResourceName: "example.com/nic", RequestName: "container-0-request-0"},
		},
	}
	list.Items = append(list.Items, extra)
	return list
}

// The DRA folding (package dra) needs the pod's extended resource claim
// from either source.
func TestDecodeKeepsTheExtendedResourceClaim(t *testing.T) {
	list := equivalencePods()
	last := &list.Items[len(list.Items)-1]
	got, err := testDecoder(nil).decode(marshal(t, last))
	if err != nil {
		t.Fatal(err)
	}
	want := &model.ExtendedResourceClaim{ClaimName: "pod-40-extended-resources-x7k2p", Requests: []model.ExtendedResourceRequest{
		{Container: "sidecar", Resource: "example.com/nic", Request: "container-0-request-0"},
	}}
	if !reflect.DeepEqual(got.pod.ExtendedResourceClaim, want) {
		t.Errorf("extended resource claim %+v, want %+v", got.pod.ExtendedResourceClaim, want)
	}
}

// Both kubelet sources must give the same model for the same pod: which
// one answered must not change a PodResources answer.
func TestDecodeGivesWhatPodsjsonGivesFromSlashPods(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep func(string) bool
	}{{"allocator annotations only", keepExample}, {"every annotation", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			list := equivalencePods()
			body, err := json.Marshal(list)
			if err != nil {
				t.Fatal(err)
			}
			bounds := podsjson.Bounds{Bounds: keepWhole(tc.keep)}
			want, err := podsjson.DecodeFrom(bytes.NewReader(body), bounds)
			if err != nil {
				t.Fatalf("podsjson: %v", err)
			}
			if len(want) != len(list.Items) {
				t.Fatalf("podsjson decoded %d pods of %d", len(want), len(list.Items))
			}
			dec := testDecoder(tc.keep)
			for i := range list.Items {
				got, err := dec.decode(marshal(t, &list.Items[i]))
				if err != nil {
					t.Fatalf("pod %d: %v", i, err)
				}
				// podsjson returns pods oldest first, and podstest's pods
				// were created in order.
				if !reflect.DeepEqual(got.pod, want[i]) {
					t.Errorf("pod %d:\n from the Pods API %+v\n from /pods         %+v", i, got.pod, want[i])
				}
				if !got.created.Equal(list.Items[i].CreationTimestamp.Time) {
					t.Errorf("pod %d created %v, want %v", i, got.created, list.Items[i].CreationTimestamp.Time)
				}
			}
		})
	}
}

func TestOversizePodIsRefusedUndecodedButNamed(t *testing.T) {
	p := podstest.Pod(1, map[string]string{"example.com/gpu": "x"})
	p.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = strings.Repeat("a", 64<<10)
	dec := &decoder{maxPod: 32 << 10, annotations: keepWhole(keepExample)}

	got, err := dec.decode(marshal(t, &p))
	if !errors.Is(err, ErrPodTooLarge) {
		t.Fatalf("err %v, want ErrPodTooLarge", err)
	}
	if !strings.Contains(err.Error(), "more than 32768") {
		t.Errorf("error %q does not give the limit", err)
	}
	want := model.KubeletPod{UID: podstest.UID(1), Namespace: podstest.Namespace(1), Name: podstest.Name(1)}
	if !reflect.DeepEqual(got.pod, want) {
		t.Errorf("refused pod reads as %+v, want its identity %+v", got.pod, want)
	}
}

// hintKey and allocatedKey are Koordinator's, bounded as allocator.Set
// bounds them (allocatorBounds).
const (
	hintKey      = "scheduling.koordinator.sh/device-allocate-hint"
	allocatedKey = "scheduling.koordinator.sh/device-allocated"
	gpuAlloc     = `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"GPU-new"}]}`
)

// allocatorBounds bounds the keys as allocator.Set does with Koordinator
// and HAMi: the hint to 4 KiB, allocations to 64 KiB.
func allocatorBounds(key string) int {
	switch {
	case key == hintKey:
		return 4 << 10
	case key == allocatedKey, strings.HasPrefix(key, "hami.io/"):
		return 64 << 10
	}
	return 0
}

// oversizedPods are pods whose allocator annotations cross the bounds: a
// tenant's 255 KiB hint next to a real allocation, an allocation too large
// to be one (with quotes, which /pods escapes), HAMi keys that together
// cross the pod's bound, and a value a tenant dressed as a refusal.
func oversizedPods() []corev1.Pod {
	hint := `{"rdma":{"vfSelector":{"matchLabels":{"pad":"` + strings.Repeat("x", 255<<10) + `"}}}}`
	huge := `{"gpu":[` + strings.Repeat(`{"minor":0,"id":"GPU-x"},`, 2600) + `{"minor":0,"id":"GPU-x"}]}` // 60 KiB raw, 70 KiB escaped
	return []corev1.Pod{
		podstest.Pod(0, map[string]string{hintKey: hint, allocatedKey: gpuAlloc}),
		podstest.Pod(1, map[string]string{allocatedKey: huge}),
		podstest.Pod(2, map[string]string{"hami.io/a": strings.Repeat("a", 40<<10), "hami.io/b": strings.Repeat("b", 30<<10), "hami.io/c": "c"}),
		podstest.Pod(3, map[string]string{allocatedKey: model.OversizedAnnotation(strings.Repeat("z", 60<<10)), "hami.io/z": strings.Repeat("z", 8<<10)}),
		podstest.Pod(4, map[string]string{allocatedKey: gpuAlloc}),
	}
}

// An allocator annotation over its bound is kept as a refusal on its pod,
// with the marker /pods gives the same pod, and the pod is kept: it costs
// its own allocation, not its identity, and not other pods' reads.
func TestAnAnnotationOverItsBoundIsMarkedAsSlashPodsMarksIt(t *testing.T) {
	pods := oversizedPods()
	body, err := json.Marshal(corev1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}, Items: pods})
	if err != nil {
		t.Fatal(err)
	}
	bounds := annotationbound.Allocators(allocatorBounds)
	want, err := podsjson.DecodeFrom(bytes.NewReader(body), podsjson.Bounds{Bounds: bounds})
	if err != nil {
		t.Fatalf("podsjson: %v", err)
	}
	dec := &decoder{maxPod: DefaultMaxPodBytes, annotations: bounds}
	marked := 0
	for i := range pods {
		got, err := dec.decode(marshal(t, &pods[i]))
		if err != nil {
			t.Fatalf("pod %d refused: %v", i, err)
		}
		if !reflect.DeepEqual(got.pod.Annotations, want[i].Annotations) {
			t.Errorf("pod %d annotations:\n from the Pods API %.300v\n from /pods         %.300v", i, got.pod.Annotations, want[i].Annotations)
		}
		for _, v := range got.pod.Annotations {
			if _, ok := model.Oversized(v); ok {
				marked++
			}
		}
	}
	// The hint, the huge allocation, hami.io/b, and the tenant's lookalike
	// (which is kept, as its own value, and counts against its pod).
	if marked != 4 {
		t.Errorf("%d annotations read as refused, want 4", marked)
	}
}

func TestUndecodablePodIsAnErrorNotAPanic(t *testing.T) {
	for _, data := range [][]byte{{0xff, 0x01, 0x02}, {0x0a, 0x05, 0x0a}, {0x0a, 0x02, 0x2a, 0x7f}} {
		if _, err := testDecoder(nil).decode(data); err == nil {
			t.Errorf("% x decoded without error", data)
		}
	}
}

func TestPodWithoutIdentityIsRefused(t *testing.T) {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}
	if _, err := testDecoder(nil).decode(marshal(t, &p)); err == nil || !strings.Contains(err.Error(), "no uid") {
		t.Fatalf("err %v, want a pod without uid refused", err)
	}
}

// FuzzDecode feeds the decoder arbitrary bytes: it must not panic, a pod
// it accepts must hold only what the model allows, within the bounds, and
// scanIdentity must read the identity Unmarshal does.
func FuzzDecode(f *testing.F) {
	for _, p := range equivalencePods().Items[:6] {
		f.Add(marshal(f, &p))
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})
	deleted := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: "ns", UID: "u"}}
	f.Add(marshal(f, &deleted))

	f.Fuzz(func(t *testing.T, data []byte) { _ = checkDecode(t, data) })
}

// fuzzDecoder is the decoder FuzzDecode and TestDecodeSurvivesMutatedPods
// check, with bounds small enough for mutated pods to cross them.
var fuzzDecoder = &decoder{maxPod: 64 << 10, annotations: annotationbound.Bounds{
	Annotation: func(k string) int {
		if keepExample(k) {
			return 512
		}
		return 0
	},
	Pod: 1024,
}}

// checkDecode decodes data, checks what an accepted pod holds, and
// reports whether it was accepted.
func checkDecode(t *testing.T, data []byte) bool {
	dec := fuzzDecoder
	got, err := dec.decodeUnsafe(data)
	id := scanIdentity(data)
	if err != nil {
		return false
	}
	p := got.pod
	if p.UID == "" || p.Namespace == "" || p.Name == "" {
		t.Fatalf("accepted a pod without identity: %+v", p)
	}
	if len(p.UID) <= maxIdentityBytes && len(p.Namespace) <= maxIdentityBytes && len(p.Name) <= maxIdentityBytes &&
		(id.UID != p.UID || id.Namespace != p.Namespace || id.Name != p.Name) {
		t.Fatalf("scanIdentity read %+v, Unmarshal %+v", podRef(&id), podRef(&p))
	}
	if p.Terminal() && (p.Annotations != nil || len(p.Spec.Containers) != 0) {
		t.Fatalf("a finished pod kept annotations or containers: %+v", p)
	}
	size := 0
	for k, v := range p.Annotations {
		if _, oversized := model.Oversized(v); oversized && len(v) < 256 {
			continue
		}
		if !keepExample(k) || annotationbound.EncodedSize(v) > 512 {
			t.Fatalf("kept annotation %q (%d bytes)", k, len(v))
		}
		size += len(k) + annotationbound.EncodedSize(v)
	}
	if size > 1024 {
		t.Fatalf("kept %d bytes of annotations, more than the pod's bound", size)
	}
	for _, c := range p.Spec.Containers {
		if c.Kind != model.KindInit && c.Kind != model.KindSidecar && c.Kind != model.KindApp {
			t.Fatalf("container %q of kind %q", c.Name, c.Kind)
		}
		for r := range c.Requests {
			if !model.ExtendedResource(r) {
				t.Fatalf("container %q kept %q", c.Name, r)
			}
		}
	}
	return true
}

// TestDecodeSurvivesMutatedPods runs checkDecode on deterministic
// mutations of real pods (bit flips, cuts, inserted and repeated bytes),
// so that every test run covers some of what FuzzDecode explores.
func TestDecodeSurvivesMutatedPods(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	seeds := equivalencePods().Items[:8]
	accepted := 0
	for i := range 5000 {
		data := marshal(t, &seeds[i%len(seeds)])
		for range 1 + rng.IntN(4) {
			switch pos := rng.IntN(len(data)); rng.IntN(4) {
			case 0:
				data[pos] ^= 1 << rng.IntN(8)
			case 1:
				data = data[:pos]
			case 2:
				data = slices.Insert(data, pos, byte(rng.IntN(256)))
			case 3:
				end := min(len(data), pos+1+rng.IntN(64))
				data = slices.Insert(data, pos, data[pos:end]...)
			}
			if len(data) == 0 {
				break
			}
		}
		if checkDecode(t, data) {
			accepted++
		}
	}
	// Both paths must have been taken for the test to mean anything.
	if accepted < 100 || accepted > 4900 {
		t.Errorf("%d of 5000 mutated pods accepted", accepted)
	}
	t.Logf("%d of 5000 mutated pods accepted", accepted)
}
