package allocator

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
	"github.com/podres-proxy/podres-proxy/model"
)

// Attribution of each format's devices to containers (Set.Assign).

// HAMi devices reach the container HAMi's device plugin gives them to: the
// k-th non-empty entry, the k-th container (init, sidecar, app, in spec
// order) asking for the vendor's resource, whatever padding the HAMi that
// wrote the list used.
func TestAssignHAMiDevicesByPosition(t *testing.T) {
	const gpu = "nvidia.com/gpu"
	type tc struct {
		name  string
		opts  hami.Options
		spec  *model.PodSpec
		value string
		want  map[string][]string
	}
	tests := []tc{
		{
			name: "recent HAMi pads nothing: the k-th entry is the k-th requesting container's",
			spec: spec(container("warmup", model.KindInit, gpu, "1"), container("istio-proxy", model.KindSidecar),
				container("main", model.KindApp, gpu, "1")),
			value: uuidA + ",NVIDIA,500,5:;" + uuidB + ",NVIDIA,500,5:;",
			want:  map[string][]string{"main": {uuidB}},
		},
		{
			name:  "one entry per container, init containers first: the app container's entry",
			spec:  spec(container("fetch", model.KindInit), container("main", model.KindApp, gpu, "1")),
			value: ";" + uuidA + ",NVIDIA,500,5:;",
			want:  map[string][]string{"main": {uuidA}},
		},
		{
			name: "sidecars are init containers in HAMi's list and get their own entry",
			spec: spec(container("fetch", model.KindInit), container("proxy", model.KindSidecar, gpu, "1"),
				container("a", model.KindApp), container("b", model.KindApp, gpu, "1")),
			value: ";" + uuidA + ",NVIDIA,500,5:;;" + uuidB + ",NVIDIA,500,5:;",
			want:  map[string][]string{"proxy": {uuidA}, "b": {uuidB}},
		},
		{
			name:  "an init container's vGPU is dropped: the kubelet never lists init containers",
			spec:  spec(container("warmup", model.KindInit, gpu, "1"), container("main", model.KindApp, gpu, "1")),
			value: uuidA + ",NVIDIA,500,5:;" + uuidB + ",NVIDIA,500,5:;",
			want:  map[string][]string{"main": {uuidB}},
		},
		{
			name:  "a legacy list (app containers only) is recognised by its length",
			spec:  spec(container("fetch", model.KindInit), container("proxy", model.KindSidecar), container("main", model.KindApp, gpu, "1")),
			value: uuidA + ",NVIDIA,500,5:;",
			want:  map[string][]string{"main": {uuidA}},
		},
		{
			name:  "a list as long as the pod: the requesting sidecar's entry",
			spec:  spec(container("proxy", model.KindSidecar, gpu, "1"), container("main", model.KindApp)),
			value: uuidA + ",NVIDIA,500,5:;;",
			want:  map[string][]string{"proxy": {uuidA}},
		},
		{
			name:  "the requesting container gets it whatever the padding",
			spec:  spec(container("proxy", model.KindSidecar), container("a", model.KindApp), container("b", model.KindApp, gpu, "1")),
			value: ";" + uuidA + ",NVIDIA,500,5:;;;;",
			want:  map[string][]string{"b": {uuidA}},
		},
		{
			name:  "no container asks for the resource: the pod-level policy's first app container",
			spec:  spec(container("proxy", model.KindSidecar), container("a", model.KindApp), container("b", model.KindApp)),
			value: ";" + uuidA + ",NVIDIA,500,5:;;;;",
			want:  map[string][]string{"a": {uuidA}},
		},
		{
			name:  "several containers, several GPUs each, one GPU shared by two",
			spec:  spec(container("a", model.KindApp, gpu, "2"), container("b", model.KindApp, gpu, "1")),
			value: uuidA + ",NVIDIA,1000,30:" + uuidB + ",NVIDIA,1000,30:;" + uuidA + ",NVIDIA,1000,30:;",
			want:  map[string][]string{"a": {uuidA, uuidB}, "b": {uuidA}},
		},
		{
			name:  "empty entries before it do not move it",
			spec:  spec(container("a", model.KindApp), container("b", model.KindApp, gpu, "1")),
			value: ";;;;" + uuidA + ",NVIDIA,1000,30:;",
			want:  map[string][]string{"b": {uuidA}},
		},
		{
			name:  "an entry beyond the requesting containers falls back to the pod-level policy",
			spec:  spec(container("a", model.KindApp), container("b", model.KindApp, gpu, "1")),
			value: uuidA + ",NVIDIA,1000,30:;" + uuidB + ",NVIDIA,1000,30:;",
			want:  map[string][]string{"b": {uuidA, uuidB}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSet(quietLog(), nil, hami.New(tt.opts))
			devices, errs := s.Decode(testPod, map[string]string{hami.NVIDIAAnnotation: tt.value})
			if errs != nil {
				t.Fatalf("Decode: %v", errs)
			}
			a, ok := s.Assign(tt.spec, devices)
			if !ok {
				t.Fatal("Assign: ok = false")
			}
			if got := ids(a); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Assign:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestAssignUnknownContainerScopeFollowsThePodLevelPolicy(t *testing.T) {
	s := NewSet(quietLog(), nil, hami.New(hami.Options{}))
	dev := scoped(hv(uuidA, 0, 0, false), "some-future-scope")
	a, _ := s.Assign(spec(container("a", model.KindApp), container("b", model.KindApp, "nvidia.com/gpu", "1")), []model.Device{dev})
	if got, want := ids(a), map[string][]string{"b": {uuidA}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Assign = %v; want %v", got, want)
	}
}

// Volcano lists only the app containers that request vGPUs, so the n-th
// entry is the n-th requesting app container.
func TestAssignVolcanoVGPUToTheRequestingAppContainers(t *testing.T) {
	s := NewSet(quietLog(), nil, volcano.NewVGPU(volcano.VGPUOptions{}))
	sp := spec(
		container("setup", model.KindInit, "volcano.sh/vgpu-number", "1"),
		container("mesh", model.KindSidecar),
		container("loader", model.KindApp),
		container("trainer", model.KindApp, "volcano.sh/vgpu-number", "2", "volcano.sh/vgpu-memory", "2048"),
		container("eval", model.KindApp, "volcano.sh/vgpu-memory", "1024"),
	)
	devices, errs := s.Decode(testPod, map[string]string{
		volcano.VGPUAnnotation: uuidA + ",NVIDIA,2048,0:" + uuidB + ",NVIDIA,2048,0:;" + uuidA + ",NVIDIA,1024,0:",
	})
	if errs != nil {
		t.Fatalf("Decode: %v", errs)
	}
	a, ok := s.Assign(sp, devices)
	if !ok {
		t.Fatal("Assign: ok = false")
	}
	want := map[string][]string{"trainer": {uuidA, uuidB}, "eval": {uuidA}}
	if got := ids(a); !reflect.DeepEqual(got, want) {
		t.Errorf("Assign:\n got %v\nwant %v", got, want)
	}
}

// gpushare devices are pod-level: whole-GPU askers take theirs first, what
// is left goes to the containers asking GPU memory.
func TestAssignVolcanoGPUShareByRequests(t *testing.T) {
	s := NewSet(quietLog(), nil, volcano.NewGPUShare(volcano.GPUShareOptions{}))
	sp := spec(
		container("mesh", model.KindSidecar),
		container("a", model.KindApp, "volcano.sh/gpu-number", "1"),
		container("b", model.KindApp, "volcano.sh/gpu-memory", "1024"),
		container("c", model.KindApp, "nvidia.com/gpu", "1"),
	)
	devices := []model.Device{gs(0), gs(1)}
	devices[0].IDs, devices[1].IDs = []string{uuidA}, []string{uuidB} // as Translate leaves them
	a, _ := s.Assign(sp, devices)
	if got, want := ids(a), map[string][]string{"a": {uuidA}, "b": {uuidB}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Assign = %v; want %v", got, want)
	}
}

// With the pod's hint allocateStrategy RequestsAsCount, koordinator.sh/rdma
// and koordinator.sh/fpga count devices: each container asking one VF gets
// one, and an allocation of several VFs is that many devices.
func TestKoordinatorRequestsAsCount(t *testing.T) {
	const twoVFsTwoPFs = `{"rdma":[{"minor":1,"resources":{"koordinator.sh/rdma":"1"},"id":"0000:1f:00.0","extension":{"vfs":[{"busID":"0000:1f:00.2"}]}},` +
		`{"minor":2,"resources":{"koordinator.sh/rdma":"2"},"id":"0000:90:00.0","extension":{"vfs":[{"busID":"0000:90:00.2"},{"minor":1,"busID":"0000:90:00.3"}]}}]}`
	const fpgas = `{"fpga":[{"minor":0,"resources":{"koordinator.sh/fpga":"1"},"id":"0000:3b:00.0"},{"minor":1,"resources":{"koordinator.sh/fpga":"1"},"id":"0000:3c:00.0"}]}`
	rdma := "koordinator.sh/rdma"
	fpga := "koordinator.sh/fpga"
	tests := []struct {
		name  string
		alloc string
		hint  string
		spec  *model.PodSpec
		want  map[string][]string // a device's ids joined by "+"
	}{
		{
			name:  "one VF per container asking one, three VFs from two PFs",
			alloc: twoVFsTwoPFs,
			hint:  `{"rdma":{"vfSelector":{},"allocateStrategy":"RequestsAsCount"}}`,
			spec:  spec(container("a", model.KindApp, rdma, "1"), container("b", model.KindApp, rdma, "2")),
			want:  map[string][]string{"a": {"0000:1f:00.2"}, "b": {"0000:90:00.2", "0000:90:00.3"}},
		},
		{
			name:  "without the strategy the same requests are percent: 1 and 2 are shares, both get everything",
			alloc: twoVFsTwoPFs,
			hint:  `{"rdma":{"vfSelector":{}}}`,
			spec:  spec(container("a", model.KindApp, rdma, "1"), container("b", model.KindApp, rdma, "2")),
			want: map[string][]string{
				"a": {"0000:1f:00.2", "0000:90:00.2+0000:90:00.3"},
				"b": {"0000:1f:00.2", "0000:90:00.2+0000:90:00.3"},
			},
		},
		{
			name:  "FPGAs: a PF without VFs counted as one whole device, not a 1% share",
			alloc: fpgas,
			hint:  `{"fpga":{"allocateStrategy":"RequestsAsCount"}}`,
			spec:  spec(container("a", model.KindApp, fpga, "1"), container("b", model.KindApp, fpga, "1")),
			want:  map[string][]string{"a": {"0000:3b:00.0"}, "b": {"0000:3c:00.0"}},
		},
		{
			name:  "the strategy of another type does not change rdma",
			alloc: twoVFsTwoPFs,
			hint:  `{"fpga":{"allocateStrategy":"RequestsAsCount"}}`,
			spec:  spec(container("a", model.KindApp, rdma, "100"), container("b", model.KindApp, rdma, "100")),
			want:  map[string][]string{"a": {"0000:1f:00.2"}, "b": {"0000:90:00.2+0000:90:00.3"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSet(quietLog(), nil, koordinator.New(koordinator.Options{}))
			devices, errs := s.Decode(testPod, map[string]string{koordinator.Annotation: tt.alloc, koordinator.HintAnnotation: tt.hint})
			if errs != nil {
				t.Fatalf("Decode: %v", errs)
			}
			a, ok := s.Assign(tt.spec, devices)
			if !ok {
				t.Fatal("Assign: ok = false")
			}
			if got := ids(a); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Assign:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

// TensorFusion's webhook gives each container it injects a limit on
// tensor-fusion.ai/index_<hex>: those containers share the pod's GPUs, the
// others (a sidecar it did not inject) get none; a GPU named for a
// container goes to that container.
func TestTensorFusionAttribution(t *testing.T) {
	set := NewSet(quietLog(), nil, tensorfusion.New(tensorfusion.Options{}))
	spec := &model.PodSpec{Containers: []model.ContainerSpec{
		{Name: "mesh", Kind: model.KindSidecar},
		{Name: "main", Kind: model.KindApp, Requests: map[string]string{"tensor-fusion.ai/index_0": "1"}},
		{Name: "worker", Kind: model.KindApp, Requests: map[string]string{"tensor-fusion.ai/index_0": "2"}},
	}}
	a, ok := set.Assign(spec, []model.Device{tfShare(tfGPU0, ""), tfShare(tfGPU1, "worker")})
	if !ok {
		t.Fatal("no attribution")
	}
	got := fmt.Sprint(len(a["mesh"]), idsOf(a["main"]), idsOf(a["worker"]))
	if want := fmt.Sprint(0, []string{tfGPU0}, []string{tfGPU0, tfGPU1}); got != want {
		t.Errorf("mesh, main, worker got %s, want %s", got, want)
	}
}

func idsOf(devs []model.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.IDs...)
	}
	return out
}

// tfShare is a GPU the TensorFusion decoder reports, shared, named for
// container ("": pod level).
func tfShare(id, container string) model.Device {
	return model.Device{Allocator: tensorfusion.Name, Type: "gpu", Resource: parse.DefaultGPUResource, IDs: []string{id}, Shared: true, Container: container}
}

const (
	tfGPU0 = "gpu-7d6ce1b0-52a1-4d0e-9b1e-0a5f3c2d9e11" // TensorFusion's Kubernetes-name spelling
	tfGPU1 = "GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76"
)
