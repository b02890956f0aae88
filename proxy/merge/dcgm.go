package merge

import (
	"cmp"
	"slices"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
	"github.com/podres-proxy/podres-proxy/proxy/reuse"
)

// OrderForDCGM moves the pods that anchor a shared GPU to the end of a
// DCGM view's List answer, by namespace and name, the other fields and
// pods keeping the kubelet's order. DCGM exporter's default mode labels a
// GPU with the last pod listing it ("<uuid>::<n>" counts as <uuid>), and
// the kubelet lists pods in an order that changes from call to call: the
// GPU's pod label would flip between its sharers from scrape to scrape.
// This way it is the GPU's anchor, every time (or, when anchors of
// different GPUs share each other's, the same one every time). The
// kubelet promises no order, so no client can rely on another. An answer
// without an anchor is returned as it is.
func OrderForDCGM(out []byte, t *plans.Table) ([]byte, error) {
	if !t.SharesGPUs() {
		return out, nil
	}
	parts, err := reuse.Split(nil, out)
	if err != nil {
		return nil, err
	}
	type anchor struct {
		key   model.PodKey
		field []byte
	}
	var last []anchor
	rest := make([]byte, 0, len(out))
	for _, p := range parts {
		if p.Pod != nil {
			key, err := reuse.PodKey(p.Pod)
			if err != nil {
				return nil, err
			}
			if anchors(t, key) {
				last = append(last, anchor{key, p.Field})
				continue
			}
		}
		rest = append(rest, p.Field...)
	}
	if len(last) == 0 {
		return out, nil
	}
	slices.SortStableFunc(last, func(a, b anchor) int {
		return cmp.Or(cmp.Compare(a.key.Namespace, b.key.Namespace), cmp.Compare(a.key.Name, b.key.Name))
	})
	for _, a := range last {
		rest = append(rest, a.field...)
	}
	return rest, nil
}

// anchors reports whether the pod under key anchors a shared GPU: its plan
// in t (the table its answer was just built from) says so.
func anchors(t *plans.Table, key model.PodKey) bool {
	rec, ok := t.Pods().LiveWithoutRead(key)
	if !ok {
		rec, ok = t.Pods().KubeletNamed(key)
	}
	return ok && t.Plan(rec.UID).Anchors()
}
