package podsjson

import (
	"bytes"
	stdjson "encoding/json"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/model/annotationbound"
	"github.com/podres-proxy/podres-proxy/test/podstest"
)

const (
	allocatedKey = "scheduling.koordinator.sh/device-allocated"
	hintKey      = "scheduling.koordinator.sh/device-allocate-hint"
	gpuAlloc     = `{"gpu":[{"minor":0,"resources":{"koordinator.sh/gpu-core":"100"},"id":"GPU-new"}]}`
)

// allocatorBounds bounds the keys as allocator.Set does with Koordinator
// and HAMi: the hint to 4 KiB, allocations to 64 KiB, a pod to 64 KiB.
var allocatorBounds = Bounds{Bounds: annotationbound.Bounds{
	Annotation: func(key string) int {
		switch {
		case key == hintKey:
			return 4 << 10
		case key == allocatedKey, strings.HasPrefix(key, "hami.io/"):
			return 64 << 10
		}
		return 0
	},
	Pod: 64 << 10,
}}

// largeHint is a Koordinator hint of about n bytes: a real strategy and a
// selector padded with what the pod's owner likes.
func largeHint(n int) string {
	return `{"rdma":{"allocateStrategy":"RequestsAsCount","vfSelector":{"matchLabels":{"pad":"` + strings.Repeat("x", n) + `"}}}}`
}

func byName(pods []model.KubeletPod, name string) *model.KubeletPod {
	for i := range pods {
		if pods[i].Name == name {
			return &pods[i]
		}
	}
	return nil
}

func TestAnAnnotationOverItsBoundIsRefusedOnItsPodAndTheReadGoesOn(t *testing.T) {
	list := podstest.PodList(3, func(i int) map[string]string {
		switch i {
		case 0: // an allocation too large to be one
			return map[string]string{allocatedKey: `{"gpu":[` + strings.Repeat(`{"minor":0,"id":"GPU-x"},`, 4000) + `{"minor":0,"id":"GPU-x"}]}`}
		case 1: // a tenant's padded hint next to a real allocation
			return map[string]string{hintKey: largeHint(255 << 10), allocatedKey: gpuAlloc}
		}
		return map[string]string{allocatedKey: gpuAlloc}
	})
	pods, err := DecodeFrom(bytes.NewReader(listJSON(t, list.Items...)), allocatorBounds)
	if err != nil {
		t.Fatalf("one pod's oversized annotations failed the read: %v", err)
	}
	big := byName(pods, podstest.Name(0))
	if detail, ok := model.Oversized(big.Annotations[allocatedKey]); !ok || !strings.Contains(detail, "over the bound of 65536 for this annotation") {
		t.Errorf("pod 0's 100 KiB allocation was kept as %.80q; want it refused", big.Annotations[allocatedKey])
	}
	hinted := byName(pods, podstest.Name(1))
	if detail, ok := model.Oversized(hinted.Annotations[hintKey]); !ok || !strings.Contains(detail, "over the bound of 4096") {
		t.Errorf("pod 1's 255 KiB hint was kept as %.80q; want it refused", hinted.Annotations[hintKey])
	}
	if hinted.Annotations[allocatedKey] != gpuAlloc {
		t.Errorf("pod 1's allocation = %q; want it kept beside its refused hint", hinted.Annotations[allocatedKey])
	}
	if other := byName(pods, podstest.Name(2)); other.Annotations[allocatedKey] != gpuAlloc || len(other.Annotations) != 1 {
		t.Errorf("pod 2's annotations = %v; want its allocation alone", other.Annotations)
	}
}

// HAMi reads one key per vendor word: however many a pod has, it keeps at
// most Bounds.Pod of them.
func TestAPodsAllocatorAnnotationsAreBoundedTogether(t *testing.T) {
	ann := map[string]string{}
	for i := range 8 {
		// Values dressed as refusals count like any other.
		ann[fmt.Sprintf("hami.io/v%d-devices-allocated", i)] = model.OversizedAnnotation(strings.Repeat("y", 30<<10))
	}
	pods, err := DecodeFrom(bytes.NewReader(podstest.PodListJSON(1, func(int) map[string]string { return ann })), allocatorBounds)
	if err != nil {
		t.Fatal(err)
	}
	kept, refused := 0, 0
	for k, v := range pods[0].Annotations {
		if detail, ok := model.Oversized(v); ok && len(v) < 1024 {
			refused++
			if !strings.Contains(detail, "over their bound of 65536") {
				t.Errorf("%s refused with %q; want the pod's bound named", k, detail)
			}
			continue
		}
		kept += len(k) + len(v)
	}
	if kept > 64<<10 || refused != 6 {
		t.Errorf("kept %d bytes and refused %d keys; want at most 64 KiB kept and 6 of the 8 keys refused", kept, refused)
	}
}

// Issue 23: 105 running pods each with a 255 KiB device-allocate-hint, an
// allocator key, failed every read (they were kept whole, 26 MB, over what
// a read may keep). They must cost next to nothing, and the new pod's
// allocation must come through.
func TestTenantsLargeHintsAreNotKept(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 26 MiB of /pods")
	}
	body := podstest.LargeHintsJSON(105, 255<<10)
	b := allocatorBounds
	b.Kept = 25 << 20 // the DaemonSet's: a quarter of its GOMEMLIMIT
	var before, after runtime.MemStats
	// Twice: encoding/json's buffer in a sync.Pool outlives one GC.
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&before)
	pods, err := DecodeFrom(bytes.NewReader(body), b)
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("reading %d MiB of pods with large hints: %v", len(body)>>20, err)
	}
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d pods, %d MiB of /pods: %d KiB kept after the read", len(pods), len(body)>>20, retained>>10)
	if p := byName(pods, podstest.Name(105)); p == nil || p.Annotations[allocatedKey] != podstest.NewPodAllocation {
		t.Fatalf("the new pod's allocation did not come through: %+v", p)
	}
	if retained > 2<<20 {
		t.Errorf("the read keeps %d KiB of %d pods; want under 2 MiB (the hints are not kept)", retained>>10, len(pods))
	}
	runtime.KeepAlive(pods)
	runtime.KeepAlive(body)
}

// 110 pods at the API's 256 KiB of annotations each is a legal node: with
// every allocator annotation about as large as its bound lets it be kept
// (a hint of 4 KiB, an allocation of 56 KiB, as /pods encodes them: JSON
// in a JSON string, each quote escaped) and the rest in kubectl's
// last-applied-configuration, the read keeps every allocation within what
// the DaemonSet's read may keep.
func TestALegalNodeAtTheAPIsAnnotationLimitReadsWhole(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 28 MiB of /pods")
	}
	hint := largeHint(4<<10 - 200)
	alloc := `{"gpu":[` + strings.Repeat(`{"minor":0,"id":"GPU-x"},`, 56<<10/34) + `{"minor":0,"id":"GPU-x"}]}`
	// The padding is put in after encoding, which it would slow down.
	const pad = "@PADDING@"
	body := podstest.PodListJSON(110, func(int) map[string]string {
		return map[string]string{hintKey: hint, allocatedKey: alloc, "kubectl.kubernetes.io/last-applied-configuration": pad}
	})
	body = bytes.ReplaceAll(body, []byte(pad), bytes.Repeat([]byte("z"), 256<<10-len(hint)-len(alloc)-200))
	b := allocatorBounds
	b.Kept = 25 << 20
	pods, err := DecodeFrom(bytes.NewReader(body), b)
	if err != nil {
		t.Fatalf("reading %d MiB of /pods: %v", len(body)>>20, err)
	}
	for _, p := range pods {
		if !p.Terminal() && (p.Annotations[allocatedKey] != alloc || p.Annotations[hintKey] != hint || len(p.Annotations) != 2) {
			t.Fatalf("pod %s kept %d annotations, not its hint and allocation whole", p.Name, len(p.Annotations))
		}
	}
}

// A value with bytes that are not UTF-8 decodes to U+FFFD, three bytes for
// each: counted as one byte each, as they are written, it was kept at up to
// three times its bound (FuzzAnnotations found {"0":"\x91\x91\x91\x91\x91\x91"}:
// 18 bytes kept against a bound of 16). Each counts as the \ufffd Go's
// encoder writes for it, so the raw value is kept, or refused, as that
// escaped form is, and as annotationbound.EncodedSize counts the value a
// pod source reads from protobuf.
func TestInvalidUTF8IsCountedAsTheKubeletEncodesIt(t *testing.T) {
	const key = "hami.io/x-devices-allocated"
	b := Bounds{Bounds: annotationbound.Bounds{Annotation: func(string) int { return 16 }}}
	for _, tc := range []struct {
		name, raw string
		kept      bool
	}{
		{"six bytes not UTF-8", "\x91\x91\x91\x91\x91\x91", false},
		{"the same as the kubelet writes it", strings.Repeat(`\ufffd`, 6), false},
		{"two bytes not UTF-8", "\x91\x91", true},
		{"two as the kubelet writes them", `\ufffd\ufffd`, true},
		{"a cut-off rune and its rest", "ab\xe2\x82", true},
		{"three bytes not UTF-8: 18, over 16", "\xff\xfe\x91", false},
	} {
		got, err := b.annotations([]byte(`{"` + key + `":"` + tc.raw + `"}`))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		v := got[key]
		_, oversized := model.Oversized(v)
		if oversized == tc.kept {
			t.Errorf("%s: kept %q, oversized %v; want kept %v", tc.name, v, oversized, tc.kept)
		}
		if !oversized && (len(v) > 16 || annotationbound.EncodedSize(v) > 16) {
			t.Errorf("%s: kept %q, %d bytes (%d encoded), over the bound of 16", tc.name, v, len(v), annotationbound.EncodedSize(v))
		}
	}
}

// FuzzAnnotations checks the annotations scanner against encoding/json:
// unbounded, it keeps what a map[string]string decodes to, and fails where
// that fails; bounded, no value kept is over its bound, nor a pod's kept
// annotations over theirs.
func FuzzAnnotations(f *testing.F) {
	f.Add([]byte(`{"a":"b","scheduling.koordinator.sh/device-allocated":"{\"gpu\":[]}"}`))
	f.Add([]byte(`null`))
	f.Add([]byte(` { } `))
	f.Add([]byte(`{"a":null,"\u0062":"\ud800\u00e9\n","a":"dup"}`))
	f.Add([]byte(`{"a":1}`))
	f.Add([]byte("{\"k\xff\":\"v\xfe\"}"))
	f.Add([]byte(`{"hami.io/x-devices-allocated":"` + strings.Repeat("z", 70) + `"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := (&Bounds{}).annotations(raw)
		var want map[string]string
		werr := stdjson.Unmarshal(raw, &want)
		if (err == nil) != (werr == nil) && len(raw) > 0 {
			t.Fatalf("scanner error %v, encoding/json error %v", err, werr)
		}
		if err == nil && len(raw) > 0 && !maps.Equal(got, want) {
			t.Fatalf("scanner kept %q, encoding/json %q", got, want)
		}
		bounded := Bounds{Bounds: annotationbound.Bounds{Annotation: func(k string) int { return len(k) % 3 * 16 }, Pod: 64}}
		got, err = bounded.annotations(raw)
		if err != nil {
			return
		}
		podBytes := 0
		for k, v := range got {
			if _, ok := model.Oversized(v); ok {
				continue
			}
			if bound := bounded.Annotation(k); bound == 0 || len(v) > bound {
				t.Fatalf("kept %q (%d bytes) against a bound of %d", k, len(v), bound)
			}
			podBytes += len(k) + len(v)
		}
		if podBytes > bounded.Pod {
			t.Fatalf("kept %d bytes of annotations, over the pod's bound of %d", podBytes, bounded.Pod)
		}
	})
}
