package plans

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/report"
	"github.com/podres-proxy/podres-proxy/state/record"
	"github.com/podres-proxy/podres-proxy/trust"
)

// Reporter is told the pods' decisions, as Events (report.Reporter). Pod
// must not wait: the builder calls it between builds.
type Reporter interface {
	Pod(pod model.PodRef, reason, action, note string)
}

// reportRefused reports, as Events on the pod, each refusal of now that
// was not among before: the pod's refusals changed (Store.SetRefused said
// so), and only what is new is news to its owner. A pod not vetted yet
// (its spec not read: trust.ClassUnvetted) is no decision: it is decided
// once the spec is read, and a kubelet whose pods stay unreadable is
// reported on the Node.
func (b *Builder) reportRefused(rec *record.Record, before, now []model.Refused) {
	if b.o.Report == nil {
		return
	}
	for _, r := range now {
		if r.Class == trust.ClassUnvetted || slices.ContainsFunc(before, func(o model.Refused) bool { return sameRefusal(o, r) }) {
			continue
		}
		ids := strings.Join(r.IDs, ",")
		note := fmt.Sprintf("%s device %s%s from the %s annotation refused (rule %s, %s): %s; the pod is answered without it",
			r.Resource, ids, containerOf(rec, r), r.Allocator, r.Reason, r.Class, r.Detail)
		pod := model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}
		b.o.Report.Pod(pod, report.ReasonAllocationRefused, "Refuse "+r.Resource+" "+ids, note)
	}
}

// containerOf returns " for container NAME" when the allocator gave the
// refused device to a named container (per-container allocators), "" for
// a pod-level allocation, which goes to the containers that request it.
func containerOf(rec *record.Record, r model.Refused) string {
	for _, d := range rec.Devices {
		if d.Container != "" && d.Resource == r.Resource && slices.Equal(d.IDs, r.IDs) {
			return " for container " + d.Container
		}
	}
	return ""
}

// sameRefusal reports whether two refusals refuse the same device for the
// same rule.
func sameRefusal(a, b model.Refused) bool {
	return a.Allocator == b.Allocator && a.Resource == b.Resource && a.Reason == b.Reason && slices.Equal(a.IDs, b.IDs)
}

// reportUndecodable reports, as Events on the pod, each decode error of a
// record that the last build did not have: annotations that changed into
// something no allocator understands. At the builder's first build, a
// record whose annotations were learned before the builder started (by an
// earlier run of the daemon, which reported them) is not reported again.
func (b *Builder) reportUndecodable(records []*record.Record) {
	if b.o.Report == nil {
		return
	}
	first := b.undecodable == nil
	now := make(map[string][]string)
	for _, rec := range records {
		if len(rec.DecodeErrors) == 0 {
			continue
		}
		now[rec.UID] = rec.DecodeErrors
		before, had := b.undecodable[rec.UID]
		if first && seenAt(rec.Provenance.Annotations).Before(b.started) {
			continue
		}
		if had && slices.Equal(before, rec.DecodeErrors) {
			continue
		}
		pod := model.PodRef{UID: rec.UID, Namespace: rec.Namespace, Name: rec.Name}
		for _, msg := range rec.DecodeErrors {
			if slices.Contains(before, msg) {
				continue
			}
			key := annotationOf(msg, rec.Annotations)
			note := fmt.Sprintf("annotation %s could not be decoded: %s; the pod is answered without its devices",
				key, report.Truncate(msg, report.MaxExcerpt))
			b.o.Report.Pod(pod, report.ReasonAnnotationUndecodable, "Decode "+key, note)
		}
	}
	b.undecodable = now
}

// annotationOf returns the annotation key a decode error names (the
// longest of the record's keys it contains), or "of an allocator" when it
// names none.
func annotationOf(msg string, annotations map[string]string) string {
	key := ""
	for _, k := range slices.Sorted(maps.Keys(annotations)) {
		if strings.Contains(msg, k) && len(k) > len(key) {
			key = k
		}
	}
	if key == "" {
		return "of an allocator"
	}
	return key
}
