package podsjson

import (
	"bytes"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/model/annotationbound"
	"github.com/podres-proxy/podres-proxy/test/podstest"
)

func TestLivePodsKeepingMoreThanTheLimitFailTheReadClearly(t *testing.T) {
	body := podstest.FinishedPodsJSON(0, 0, 50)
	_, err := DecodeFrom(bytes.NewReader(body), Bounds{Kept: 1000})
	if err == nil || !strings.Contains(err.Error(), "larger than the limit") {
		t.Fatalf("50 live pods against a limit of 1000 kept bytes: got %v, want a clear error", err)
	}
	pods, err := DecodeFrom(bytes.NewReader(body), Bounds{Kept: 1 << 20})
	if err != nil || len(pods) != 50 {
		t.Fatalf("within the limit: %d pods, %v", len(pods), err)
	}
}

func TestFinishedPodsKeepOnlyTheirIdentityAndPhase(t *testing.T) {
	pods, err := decode(podstest.FinishedPodsJSON(2, 10, 1))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Terminal() && (p.Annotations != nil || len(p.Spec.Containers) != 0) {
			t.Errorf("finished pod %s kept %d annotations and %d containers", p.Name, len(p.Annotations), len(p.Spec.Containers))
		}
		if !p.Terminal() && len(p.Spec.Containers) != 1 {
			t.Errorf("live pod %s lost its containers", p.Name)
		}
	}
}

func TestOnlyTheAnnotationsAskedForAreKept(t *testing.T) {
	body := []byte(`{"kind":"PodList","items":[{"metadata":{"name":"a","namespace":"d","uid":"u","annotations":` +
		`{"scheduling.koordinator.sh/device-allocated":"{}","kubectl.kubernetes.io/last-applied-configuration":"` +
		strings.Repeat("x", 4096) + `"}},"status":{"phase":"Running"}}]}`)
	keep := func(k string) int {
		if strings.HasPrefix(k, "scheduling.koordinator.sh/") {
			return 64
		}
		return 0
	}
	pods, err := DecodeFrom(bytes.NewReader(body), Bounds{Bounds: annotationbound.Bounds{Annotation: keep}, Kept: 1024})
	if err != nil {
		t.Fatalf("a 4 KiB annotation nobody needs counted against a limit of 1 KiB: %v", err)
	}
	if len(pods) != 1 || len(pods[0].Annotations) != 1 || pods[0].Annotations["scheduling.koordinator.sh/device-allocated"] != "{}" {
		t.Fatalf("annotations kept: %v", pods[0].Annotations)
	}
}
