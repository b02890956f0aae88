package podsjson

import (
	"bytes"
	stdjson "encoding/json"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/podstest"
)

// decode decodes a whole /pods body as kubeletpods.Client.Pods does,
// keeping every annotation.
func decode(data []byte) ([]model.KubeletPod, error) {
	return DecodeFrom(bytes.NewReader(data), Bounds{})
}

func TestDecodeKeepsIdentityPhaseAndAnnotations(t *testing.T) {
	data := podstest.PodListJSON(3, func(i int) map[string]string {
		return map[string]string{"scheduling.koordinator.sh/device-allocated": fmt.Sprintf(`{"gpu":[{"minor":%d}]}`, i)}
	})
	pods, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 3 {
		t.Fatalf("got %d pods, want 3", len(pods))
	}
	for i, p := range pods {
		if p.UID != podstest.UID(i) || p.Namespace != podstest.Namespace(i) || p.Name != podstest.Name(i) {
			t.Errorf("pod %d: got %s/%s uid %s, want %s/%s uid %s", i, p.Namespace, p.Name, p.UID,
				podstest.Namespace(i), podstest.Name(i), podstest.UID(i))
		}
		if p.Phase != "Running" {
			t.Errorf("pod %d: phase %q, want Running", i, p.Phase)
		}
		want := fmt.Sprintf(`{"gpu":[{"minor":%d}]}`, i)
		if got := p.Annotations["scheduling.koordinator.sh/device-allocated"]; got != want {
			t.Errorf("pod %d: annotation %q, want %q", i, got, want)
		}
		if p.Annotations["prometheus.io/scrape"] != "true" {
			t.Errorf("pod %d: other annotations lost: %v", i, p.Annotations)
		}
	}
}

// A pod with a plain init container, a sidecar and two app containers, each
// asking for different resources.
func TestDecodeListsInitSidecarThenAppContainersWithExtendedResourcesOnly(t *testing.T) {
	pod := podstest.Pod(0, nil)
	always := corev1.ContainerRestartPolicyAlways
	rl := func(kv ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "setup", Resources: corev1.ResourceRequirements{Requests: rl("cpu", "100m", "example.com/foo", "1")}},
		{Name: "proxy", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Limits: rl("memory", "1Gi", "hugepages-2Mi", "1Gi")}},
	}
	pod.Spec.Containers = []corev1.Container{
		{Name: "trainer", Resources: corev1.ResourceRequirements{
			Requests: rl("cpu", "4", "ephemeral-storage", "1Gi", "nvidia.com/gpu", "1", "koordinator.sh/gpu-core", "100"),
			Limits:   rl("nvidia.com/gpu", "2", "koordinator.sh/rdma", "1"),
		}},
		{Name: "logger"},
	}
	data := listJSON(t, pod)

	pods, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []model.ContainerSpec{
		{Name: "setup", Kind: model.KindInit, Requests: map[string]string{"example.com/foo": "1"}},
		{Name: "proxy", Kind: model.KindSidecar},
		{Name: "trainer", Kind: model.KindApp, Requests: map[string]string{
			"nvidia.com/gpu":          "2", // the limit wins over the request
			"koordinator.sh/gpu-core": "100",
			"koordinator.sh/rdma":     "1",
		}},
		{Name: "logger", Kind: model.KindApp},
	}
	if got := pods[0].Spec.Containers; !reflect.DeepEqual(got, want) {
		t.Errorf("containers:\n got  %+v\n want %+v", got, want)
	}
}

func TestDecodeSortsPodsOldestFirst(t *testing.T) {
	list := podstest.PodList(4, nil)
	// The kubelet answers in map order; make it so here.
	list.Items[0], list.Items[3] = list.Items[3], list.Items[0]
	list.Items[1], list.Items[2] = list.Items[2], list.Items[1]
	data, err := stdjson.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	pods, err := decode(data)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range pods {
		if p.UID != podstest.UID(i) {
			t.Errorf("position %d: uid %s, want %s (pod %d is the %dth oldest)", i, p.UID, podstest.UID(i), i, i)
		}
	}
}

// The kubelet encodes a node without pods as "items": null.
func TestDecodeReadsNullItemsAsNoPods(t *testing.T) {
	pods, err := decode([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":null}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 0 {
		t.Errorf("got %d pods, want none", len(pods))
	}
}

func TestDecodeRejectsBadAnswersWithAClearError(t *testing.T) {
	valid := string(podstest.PodListJSON(2, nil))
	for _, tc := range []struct {
		name, data, want string
	}{
		{"empty", ``, "decode kubelet pods"},
		{"truncated", valid[:len(valid)/2], "decode kubelet pods"},
		{"trailing garbage", valid + `}`, "decode kubelet pods"},
		{"html", `<html>502 Bad Gateway</html>`, "decode kubelet pods"},
		{"not an object", `[1,2,3]`, "decode kubelet pods"},
		{"a Status", `{"kind":"Status","apiVersion":"v1","status":"Failure","message":"forbidden"}`, `not a PodList (kind "Status")`},
		{"no kind", `{"items":[]}`, `not a PodList (kind "")`},
		{"items not a list", `{"kind":"PodList","items":{}}`, "decode kubelet pods"},
		{"null item", `{"kind":"PodList","items":[null]}`, "item 0 has no uid, namespace or name"},
		{"item without name", `{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"ns"}}]}`, "item 0 has no uid"},
		{"annotation not a string", `{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"n","name":"p","annotations":{"a":1}}}]}`, "decode kubelet pods"},
		{"quantity not a string", `{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"n","name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"x.io/y":[]}}}]}}]}`, "decode kubelet pods"},
		{"containers not a list", `{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"n","name":"p"},"spec":{"containers":"c"}}]}`, "decode kubelet pods"},
		{"phase not a string", `{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"n","name":"p"},"status":{"phase":true}}]}`, "decode kubelet pods"},
		{"deeply nested skipped field", `{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"n","name":"p"},"x":` +
			strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}]}`, "decode kubelet pods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pods, err := decode([]byte(tc.data))
			if err == nil {
				t.Fatalf("decoded %d pods, want an error", len(pods))
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// decodeWithEncodingJSON is the decoder built on encoding/json: the
// reference the chosen decoder must agree with, and a benchmark candidate.
func decodeWithEncodingJSON(data []byte) (int, error) {
	var l podList
	err := stdjson.Unmarshal(data, &l)
	return len(l.Items), err
}

func FuzzDecodePods(f *testing.F) {
	f.Add([]byte(`{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"ml","name":"p"},"status":{"phase":"Pending","extendedResourceClaimStatus":{"resourceClaimName":"c","requestMappings":[{"containerName":"main","resourceName":"example.com/gpu","requestName":"container-0-request-0"}]}}}]}`))
	// Small seeds: the fuzzer minimizes every input that finds new
	// coverage, and on a podstest list of several KB that takes it minutes.
	f.Add([]byte(`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"p","namespace":"n",` +
		`"uid":"u","creationTimestamp":"2026-11-01T08:00:00Z","annotations":{"a":"{\"gpu\":[{\"minor\":0}]}","b":"\u00e9"},` +
		`"managedFields":[{"manager":"m","fieldsV1":{"f:spec":{"k:{\"name\":\"c\"}":{".":{},"f:x":[1,2.5e3,true,null]}}}}]},` +
		`"spec":{"containers":[{"name":"c","env":[{"name":"E","value":"v"}],"resources":{"limits":{"cpu":"1","nvidia.com/gpu":"1"}}}]},` +
		`"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}]}`))
	f.Add([]byte(`{"kind":"PodList","items":null}`))
	f.Add([]byte(`{"kind":"PodList","items":[{"metadata":{"uid":"u","namespace":"n","name":"p","creationTimestamp":null},` +
		`"spec":{"initContainers":[{"name":"i","restartPolicy":"Always","resources":{"limits":{"a.b/c":"1"}}}],` +
		`"containers":[{"name":"c","resources":{"requests":{"cpu":"1","x.y/z":"2"}}}]},"status":{"phase":"Pending"}}]}`))
	f.Add([]byte(`{"kind":"PodList","items":[null]}`))
	f.Add([]byte(`{"kind":"PodList","items":[{"metadata":{"annotations":{"a":1}}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		pods, err := decodePodStream(bytes.NewReader(data), Bounds{}) // without the recover: a panic fails the fuzz
		if err != nil {
			if pods != nil {
				t.Fatalf("pods and an error")
			}
			return
		}
		// What go-json accepts, encoding/json reads the same way.
		var ref podList
		if stdjson.Unmarshal(data, &ref) == nil {
			want, err := ref.kubeletPods()
			if err != nil || !reflect.DeepEqual(pods, want) {
				t.Fatalf("go-json decoded\n%+v\nencoding/json\n%+v (%v)", pods, want, err)
			}
		}
		for i, p := range pods {
			if p.UID == "" || p.Name == "" || p.Namespace == "" {
				t.Fatalf("pod %d without identity: %+v", i, p)
			}
			for _, c := range p.Spec.Containers {
				if c.Kind != model.KindInit && c.Kind != model.KindSidecar && c.Kind != model.KindApp {
					t.Fatalf("container %q of kind %q", c.Name, c.Kind)
				}
				for r := range c.Requests {
					if !model.ExtendedResource(r) {
						t.Fatalf("container %q keeps %q", c.Name, r)
					}
				}
			}
		}
	})
}

// BenchmarkDecodePods compares, on the same realistic answers, the decoder
// in use with encoding/json into the same small structs and with
// encoding/json into the full k8s.io/api PodList, which is what koordlet
// does. Besides MB/s (wall clock) it reports MB/cpu-s, MB per second of
// the process's CPU time, which stays meaningful on a busy machine.
func BenchmarkDecodePods(b *testing.B) {
	for _, n := range []int{10, 110, 250} {
		data := podstest.PodListJSON(n, nil)
		for _, d := range benchDecoders {
			b.Run(fmt.Sprintf("%d/%s", n, d.name), func(b *testing.B) {
				b.SetBytes(int64(len(data)))
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					if _, err := d.decode(data); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(data))*float64(b.N)/1e6/(cpuTime()-cpu0).Seconds(), "MB/cpu-s")
			})
		}
	}
}

type benchDecoder struct {
	name   string
	decode func([]byte) (int, error)
}

var benchDecoders = []benchDecoder{
	{"go-json", func(b []byte) (int, error) { p, err := decode(b); return len(p), err }},
	{"encoding-json", decodeWithEncodingJSON},
	{"k8s-PodList", func(b []byte) (int, error) {
		var l corev1.PodList
		err := stdjson.Unmarshal(b, &l)
		return len(l.Items), err
	}},
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func listJSON(t *testing.T, pods ...corev1.Pod) []byte {
	t.Helper()
	data, err := stdjson.Marshal(corev1.PodList{
		TypeMeta: podstest.PodList(0, nil).TypeMeta,
		Items:    pods,
	})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// kubeletPods turns the decoded list into KubeletPods as Decode does: the
// reference decoder's way in (see FuzzDecodePods).
func (list *podList) kubeletPods() ([]model.KubeletPod, error) {
	pods := make([]kept, 0, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		kp, err := p.kubeletPod(&Bounds{})
		if err != nil {
			return nil, fmt.Errorf("decode kubelet pods: item %d: %w", i, err)
		}
		pods = append(pods, kept{p.Metadata.CreationTimestamp, kp})
	}
	return finish(list.Kind, pods)
}
