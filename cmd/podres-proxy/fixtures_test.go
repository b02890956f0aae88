package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/allocator/devids"
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/test/allocfixture"
	"github.com/podres-proxy/podres-proxy/test/fakekubelet"
)

// TestServeReportsWhatTheSchedulersWrote runs every allocation fixture
// (test/allocfixture/testdata, written by the schedulers' own code)
// through `podres-proxy serve` against the fake kubelet, and checks what
// v1 List shows for each container, as a consumer sees it. Where the
// allocator's device plugin gives the kubelet ids of its own (HAMi), the
// fake kubelet reports such ids for every container requesting the
// resource, and none of them may be left in the answer. Fixtures that
// share a device inventory share one serve, as long as none of them names
// a device another one does: each fixture is one scheduling run, and two
// pods of one node holding one whole device is what the proxy refuses
// (the later claimant gets none of it).
func TestServeReportsWhatTheSchedulersWrote(t *testing.T) {
	cases, err := allocfixture.Load()
	if err != nil {
		t.Fatal(err)
	}
	type group struct {
		inventory string
		ids       map[string]bool
		cases     []allocfixture.Case
	}
	var groups []*group
	for _, c := range cases {
		if c.ContainerAnnotations() != nil {
			// Only the runtime has a container's annotations, and this
			// serve has none: the plugin's tests run these through NRI.
			continue
		}
		b, err := json.Marshal(c.Inventory)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(groups, func(g *group) bool {
			return g.inventory == string(b) && !slices.ContainsFunc(c.Allocated, func(e allocfixture.Entry) bool { return g.ids[strings.ToLower(e.ID)] })
		})
		if i < 0 {
			groups = append(groups, &group{inventory: string(b), ids: map[string]bool{}})
			i = len(groups) - 1
		}
		for _, e := range c.Allocated {
			groups[i].ids[strings.ToLower(e.ID)] = true
		}
		groups[i].cases = append(groups[i].cases, c)
	}
	for n, g := range groups {
		t.Run(fmt.Sprintf("node-%d", n), func(t *testing.T) {
			serveFixtures(t, g.cases)
		})
	}
}

func serveFixtures(t *testing.T, cases []allocfixture.Case) {
	dir, err := os.MkdirTemp("", "prc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	extra := []string{"--sysfs-root", "", "--device-cr=false"}
	if inv := cases[0].Inventory; len(inv) > 0 {
		file := filepath.Join(dir, "inventory.json")
		if err := os.WriteFile(file, inventoryFile(t, inv), 0o600); err != nil {
			t.Fatal(err)
		}
		extra = append(extra, "--inventory-file", file)
	}
	k := fakekubelet.Start(t, dir)
	var pods []fakekubelet.Pod
	for _, c := range cases {
		pods = append(pods, fixturePod(c))
	}
	k.SetPods(pods...)
	srv := startServe(t, k, dir, extra...)

	conn, err := grpc.NewClient("unix://"+srv.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := v1.NewPodResourcesListerClient(conn).List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	byName := map[string]*v1.PodResources{}
	for _, p := range resp.GetPodResources() {
		byName[p.GetNamespace()+"/"+p.GetName()] = p
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			p := byName[c.Scheduler+"/"+c.Name]
			if p == nil {
				t.Fatalf("%s: the pod is not in List", c.File)
			}
			got := map[string][]string{}
			for _, ctr := range p.GetContainers() {
				for _, d := range ctr.GetDevices() {
					for _, id := range d.GetDeviceIds() {
						got[ctr.GetName()] = append(got[ctr.GetName()], d.GetResourceName()+" "+allocfixture.BaseID(id))
					}
				}
			}
			// The daemon spells ids as consumers match them (GPU-<uuid>,
			// lower-case PCI addresses; devids.NormalizeID), which
			// h21 and k23, written before it did, do not: the device is
			// the fixture's, the spelling the consumers'.
			want := map[string][]string{}
			for _, e := range c.Expect {
				want[e.Container] = append(want[e.Container], e.Resource+" "+devids.NormalizeID(e.ID))
			}
			for _, ctr := range c.Containers {
				g, w := got[ctr.Name], want[ctr.Name]
				if !c.Exact() {
					g, w = sortedUnique(g), sortedUnique(w)
				}
				if !slices.Equal(g, w) {
					t.Errorf("%s: container %q (%s) in List\n got %q\nwant %q", c.File, ctr.Name, ctr.Kind, g, w)
				}
			}
		})
	}
}

// fixturePod is the fixture's pod as the kubelet knows it: in the
// scheduler's namespace, its containers in spec order, and, for resources
// whose kubelet ids an allocator replaces (the device plugins serving HAMi's
// keys, whichever scheduler wrote them), ids of
// the device plugin's own that name no device, as many as each container
// requests.
func fixturePod(c allocfixture.Case) fakekubelet.Pod {
	opts := []fakekubelet.PodOption{fakekubelet.WithSchedulerName(c.SchedulerName())}
	for key, value := range c.Annotations {
		opts = append(opts, fakekubelet.WithAnnotation(key, value))
	}
	replaced := map[string]bool{}
	h := hami.New(hami.Options{})
	if slices.ContainsFunc(slices.Collect(maps.Keys(c.Annotations)), h.Relevant) {
		for _, name := range h.ReplacedResources() {
			replaced[name] = true
		}
	}
	for _, ctr := range c.Containers {
		switch ctr.Kind {
		case "init":
			opts = append(opts, fakekubelet.WithInit(ctr.Name, ctr.Requests))
			continue // the kubelet never reports plain init containers
		case "sidecar":
			opts = append(opts, fakekubelet.WithSidecar(ctr.Name, ctr.Requests))
		default:
			opts = append(opts, fakekubelet.WithContainer(ctr.Name, ctr.Requests))
		}
		for name, value := range ctr.Requests {
			var n int
			if !replaced[name] || func() bool { _, err := fmt.Sscanf(value, "%d", &n); return err != nil }() {
				continue
			}
			for i := range n {
				opts = append(opts, fakekubelet.WithKubeletDevices(ctr.Name, name, -1, fmt.Sprintf("plugin-%s-%d", ctr.Name, i)))
			}
		}
	}
	return fakekubelet.NewPod(c.Scheduler, c.Name, "uid-"+c.Name, opts...)
}

// inventoryFile writes the fixture's node devices as an inventory file
// (docs/inventory.md).
func inventoryFile(t *testing.T, devs []allocfixture.InventoryDevice) []byte {
	type device struct {
		Type  string `json:"type"`
		ID    string `json:"id"`
		Minor *int64 `json:"minor,omitempty"`
		Index *int64 `json:"index,omitempty"`
	}
	file := struct {
		Version int      `json:"version"`
		Devices []device `json:"devices"`
	}{Version: 1}
	for _, d := range devs {
		file.Devices = append(file.Devices, device(d))
	}
	b, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sortedUnique(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}
