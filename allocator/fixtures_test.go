package allocator_test

import (
	"io"
	"slices"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
)

// TestSchedulersOwnAnnotations runs every fixture written by a scheduler's
// own encoding code (test/allocfixture/testdata/allocators, and those derived from
// the writers' code paths in test/allocfixture/testdata) through the
// decoders, the containers' annotations included, the inventory
// translation and the attribution policy, and checks what
// each container is shown: position by position where the annotation says
// which container gets what ("exact"), as a set per container where the
// policy chooses ("policy"). A fixture added to the folder is tested here
// without a code change.
func TestSchedulersOwnAnnotations(t *testing.T) {
	cases, err := allocfixture.Load()
	if err != nil {
		t.Fatal(err)
	}
	decoders, err := registry.NewFormats(registry.Names(), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	set := allocator.NewSet(log, nil, decoders...)
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			ref := model.PodRef{Namespace: "fixtures", Name: c.Name, UID: c.Name}
			devices, errs := set.Decode(ref, c.Annotations)
			if len(errs) > 0 {
				t.Fatalf("%s: decode errors: %v", c.File, errs)
			}
			devices, errs = set.DecodeContainers(ref, devices, c.ContainerAnnotations())
			if len(errs) > 0 {
				t.Fatalf("%s: container annotations: %v", c.File, errs)
			}
			devices, problems := allocator.Translate(devices, c.Snapshot())
			if len(problems) > 0 {
				t.Fatalf("%s: translate: %v", c.File, problems)
			}

			var allocated []string
			for _, d := range devices {
				for _, id := range d.IDs {
					allocated = append(allocated, d.Resource+" "+allocfixture.BaseID(id))
				}
			}
			var wantAllocated []string
			for _, e := range c.Allocated {
				wantAllocated = append(wantAllocated, e.Resource+" "+e.ID)
			}
			if got, want := uniqueSorted(allocated), uniqueSorted(wantAllocated); !slices.Equal(got, want) {
				t.Errorf("%s: decoded devices\n got %q\nwant %q", c.File, got, want)
			}

			a, ok := set.Assign(c.Spec(), devices)
			if !ok {
				t.Fatalf("%s: no attribution for the pod spec", c.File)
			}
			got := map[string][]string{}
			for name, devs := range a {
				for _, d := range devs {
					for _, id := range d.IDs {
						got[name] = append(got[name], d.Resource+" "+allocfixture.BaseID(id))
					}
				}
			}
			want := map[string][]string{}
			for _, e := range c.Expect {
				want[e.Container] = append(want[e.Container], e.Resource+" "+e.ID)
			}
			for _, ctr := range c.Containers {
				g, w := got[ctr.Name], want[ctr.Name]
				if !c.Exact() {
					g, w = uniqueSorted(g), uniqueSorted(w)
				}
				if !slices.Equal(g, w) {
					t.Errorf("%s: container %q (%s)\n got %q\nwant %q", c.File, ctr.Name, ctr.Kind, g, w)
				}
			}
			for name := range got {
				if !slices.ContainsFunc(c.Containers, func(ctr allocfixture.Container) bool { return ctr.Name == name }) {
					t.Errorf("%s: devices for a container the pod does not have: %q", c.File, name)
				}
			}
		})
	}
}

func uniqueSorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
