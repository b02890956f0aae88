package trust_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/trust"
)

// overNode has four GPUs, two RDMA NICs with two VFs each and two FPGAs.
func overNode() *inventory.Snapshot {
	var devs []inventory.Device
	for i := range 4 {
		devs = append(devs, inventory.Device{Type: inventory.TypeGPU, ID: overGPU(i), Healthy: true})
	}
	for _, bus := range []string{"1f", "90"} {
		pf := "0000:" + bus + ":00.0"
		devs = append(devs, inventory.Device{Type: inventory.TypeRDMA, ID: pf, BusID: pf, Healthy: true,
			VFs: []inventory.VF{{BusID: "0000:" + bus + ":00.2"}, {BusID: "0000:" + bus + ":00.3"}}})
	}
	devs = append(devs,
		inventory.Device{Type: inventory.TypeFPGA, ID: "0000:3b:00.0", BusID: "0000:3b:00.0", Healthy: true},
		inventory.Device{Type: inventory.TypeFPGA, ID: "0000:af:00.0", BusID: "0000:af:00.0", Healthy: true})
	return inventory.NewSnapshot(devs)
}

func overGPU(i int) string { return fmt.Sprintf("GPU-8c25ea37-2909-6e62-b7bf-e2fcadebea%02d", i) }

// gpuEntries is koord-scheduler's allocation of the first n GPUs, each
// with the given resources.
func gpuEntries(n int, resources string) string {
	var e []string
	for i := range n {
		e = append(e, fmt.Sprintf(`{"minor":%d,"resources":%s,"id":"%s"}`, i, resources, overGPU(i)))
	}
	return `"gpu":[` + strings.Join(e, ",") + `]`
}

// rdmaEntries allocates one VF of each of the node's NICs.
const rdmaEntries = `"rdma":[` +
	`{"minor":0,"resources":{"koordinator.sh/rdma":"100"},"id":"0000:1f:00.0","extension":{"vfs":[{"minor":-1,"busID":"0000:1f:00.2"}]}},` +
	`{"minor":1,"resources":{"koordinator.sh/rdma":"100"},"id":"0000:90:00.0","extension":{"vfs":[{"minor":-1,"busID":"0000:90:00.2"}]}}]`

func TestAContainerIsShownNoMoreDevicesThanItsRequestsAskFor(t *testing.T) {
	whole := `{"koordinator.sh/gpu-core":"100","koordinator.sh/gpu-memory-ratio":"100"}`
	half := `{"koordinator.sh/gpu-core":"50","koordinator.sh/gpu-memory-ratio":"50"}`
	app := func(name string, kv ...string) model.ContainerSpec {
		c := model.ContainerSpec{Name: name, Kind: model.KindApp, Requests: map[string]string{}}
		for i := 0; i+1 < len(kv); i += 2 {
			c.Requests[kv[i]] = kv[i+1]
		}
		return c
	}
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		containers  []model.ContainerSpec
		kept        int  // devices believed, the first ones in the annotation's order
		joint       bool // RDMA devices jointly allocated with the GPUs: one per GPU, whatever rdma asks
	}{
		{
			name:        "one whole GPU (gpu-core 100) asked, four named",
			annotations: map[string]string{koordinator.Annotation: `{` + gpuEntries(4, whole) + `}`},
			containers:  []model.ContainerSpec{app("train", "koordinator.sh/gpu-core", "100", "koordinator.sh/gpu-memory-ratio", "100")},
			kept:        1,
		},
		{
			name:        "nvidia.com/gpu: 2 asked, four named",
			annotations: map[string]string{koordinator.Annotation: `{` + gpuEntries(4, whole) + `}`},
			containers:  []model.ContainerSpec{app("train", "nvidia.com/gpu", "2")},
			kept:        2,
		},
		{
			name:        "half a GPU asked, shares of two named",
			annotations: map[string]string{koordinator.Annotation: `{` + gpuEntries(2, half) + `}`},
			containers:  []model.ContainerSpec{app("infer", "koordinator.sh/gpu-core", "50", "koordinator.sh/gpu-memory-ratio", "50")},
			kept:        1,
		},
		{
			name:        "gpu.shared: 2 asks a share of each of two GPUs, three named",
			annotations: map[string]string{koordinator.Annotation: `{` + gpuEntries(3, half) + `}`},
			containers:  []model.ContainerSpec{app("infer", "koordinator.sh/gpu-core", "100", "koordinator.sh/gpu-memory-ratio", "100", "koordinator.sh/gpu.shared", "2")},
			kept:        2,
		},
		{
			name:        "one RDMA device (rdma: 100) asked, VFs of two NICs named",
			annotations: map[string]string{koordinator.Annotation: `{` + rdmaEntries + `}`},
			containers:  []model.ContainerSpec{app("app", "koordinator.sh/rdma", "100")},
			kept:        1,
		},
		{
			name: "one VF asked (RequestsAsCount, rdma: 1), three VFs named",
			annotations: map[string]string{
				koordinator.Annotation:     `{"rdma":[{"minor":0,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:1f:00.0","extension":{"vfs":[{"busID":"0000:1f:00.2"},{"busID":"0000:1f:00.3"}]}},{"minor":1,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:90:00.0","extension":{"vfs":[{"busID":"0000:90:00.2"}]}}]}`,
				koordinator.HintAnnotation: `{"rdma":{"vfSelector":{},"allocateStrategy":"RequestsAsCount"}}`,
			},
			containers: []model.ContainerSpec{app("app", "koordinator.sh/rdma", "1")},
			kept:       1,
		},
		{
			name:        "one FPGA asked, two named",
			annotations: map[string]string{koordinator.Annotation: `{"fpga":[{"minor":0,"resources":{"koordinator.sh/fpga":"100"},"id":"0000:3b:00.0"},{"minor":1,"resources":{"koordinator.sh/fpga":"100"},"id":"0000:af:00.0"}]}`},
			containers:  []model.ContainerSpec{app("app", "koordinator.sh/fpga", "100")},
			kept:        1,
		},
		{
			name:        "a GPU each for an app and a sidecar: two named, two believed",
			annotations: map[string]string{koordinator.Annotation: `{` + gpuEntries(2, whole) + `}`},
			containers: []model.ContainerSpec{
				{Name: "proxy", Kind: model.KindSidecar, Requests: map[string]string{"nvidia.com/gpu": "1"}},
				app("train", "nvidia.com/gpu", "1"),
			},
			kept: 2,
		},
		{
			// koord-scheduler's joint allocation gives a VF on the NIC
			// of each GPU's PCIe switch, whatever rdma asks.
			name: "two GPUs and one RDMA device asked, jointly allocated: a VF per GPU believed",
			annotations: map[string]string{
				koordinator.Annotation:                            `{` + gpuEntries(2, whole) + `,` + rdmaEntries + `}`,
				"scheduling.koordinator.sh/device-joint-allocate": `{"deviceTypes":["gpu","rdma"]}`,
			},
			containers: []model.ContainerSpec{app("train", "koordinator.sh/gpu", "200", "koordinator.sh/rdma", "100")},
			kept:       4,
			joint:      true,
		},
		{
			name:        "a GPU and a VF asked, two of each named: each kind is counted alone",
			annotations: map[string]string{koordinator.Annotation: `{` + gpuEntries(2, whole) + `,` + rdmaEntries + `}`},
			containers:  []model.ContainerSpec{app("train", "nvidia.com/gpu", "1", "koordinator.sh/rdma", "100")},
			kept:        2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := quietSet(t)
			gate := trust.NewGate(set, trust.GateOptions{})
			devices, errs := set.Decode(model.PodRef{Namespace: "tenant", Name: "greedy", UID: "uid-greedy"}, tc.annotations)
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			inv := overNode()
			devices, _ = allocator.Translate(devices, inv)
			spec := &model.PodSpec{SchedulerName: "koord-scheduler", Containers: tc.containers}
			kept, refused := gate.Vet(spec, devices, inv)
			if len(kept) != tc.kept || len(kept)+len(refused) != len(devices) {
				t.Fatalf("kept %d of %d devices (refused %+v), want %d", len(kept), len(devices), refused, tc.kept)
			}
			for _, r := range refused {
				if r.Reason != trust.ReasonOverRequest || r.Class != trust.ClassForged {
					t.Errorf("refused %+v, want over-request (forged)", r)
				}
			}
			// The first devices of each kind stay, in the annotation's order.
			ofResource := func(devs []model.Device, res string) (ids [][]string) {
				for _, d := range devs {
					if d.Resource == res {
						ids = append(ids, d.IDs)
					}
				}
				return ids
			}
			for _, d := range devices {
				all, got := ofResource(devices, d.Resource), ofResource(kept, d.Resource)
				if !slices.EqualFunc(got, all[:len(got)], slices.Equal) {
					t.Errorf("%s: kept %v, want the first %d of %v", d.Resource, got, len(got), all)
				}
			}
			// What Assign then shows each container stays within its
			// requests.
			a, ok := set.Assign(spec, kept)
			if !ok {
				t.Fatal("Assign refused the spec")
			}
			for name, devs := range a {
				c := spec.Containers[slices.IndexFunc(spec.Containers, func(c model.ContainerSpec) bool { return c.Name == name })]
				byResource := map[string]int64{}
				for _, d := range devs {
					byResource[d.Resource]++
				}
				for res, n := range byResource {
					if tc.joint && res == "koordinator.sh/rdma" {
						continue
					}
					one := devs[slices.IndexFunc(devs, func(d model.Device) bool { return d.Resource == res })]
					if asks := set.Asks(&model.PodSpec{Containers: []model.ContainerSpec{c}}, one); n > asks {
						t.Errorf("container %s shown %d %s, its requests ask for %d", name, n, res, asks)
					}
				}
			}
		})
	}
}
