package allocator

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/model"
)

func container(name string, kind model.ContainerKind, requests ...string) model.ContainerSpec {
	c := model.ContainerSpec{Name: name, Kind: kind}
	for i := 0; i+1 < len(requests); i += 2 {
		if c.Requests == nil {
			c.Requests = map[string]string{}
		}
		c.Requests[requests[i]] = requests[i+1]
	}
	return c
}

func spec(cs ...model.ContainerSpec) *model.PodSpec { return &model.PodSpec{Containers: cs} }

func gpus(ids ...string) []model.Device {
	var out []model.Device
	for i, id := range ids {
		out = append(out, gpu(id, int64(i)))
	}
	return out
}

// at makes d a per-container device: the index-th container of scope.
func at(index int, scope model.ContainerScope, d model.Device) model.Device {
	d.ContainerIndex, d.ContainerScope = &index, scope
	return d
}

// ids shows an assignment as container -> device ids, joined per device.
func ids(a Assignment) map[string][]string {
	out := map[string][]string{}
	for name, devs := range a {
		for _, d := range devs {
			out[name] = append(out[name], strings.Join(d.IDs, "+"))
		}
	}
	return out
}

func TestAssign(t *testing.T) {
	const (
		nvidia = "nvidia.com/gpu"
		core   = "koordinator.sh/gpu-core"
		rdmaR  = "koordinator.sh/rdma"
	)
	tests := []struct {
		name    string
		spec    *model.PodSpec
		devices []model.Device
		want    map[string][]string
	}{
		{
			name:    "sidecar and two app containers, only the second requests: the second gets them all",
			spec:    spec(container("istio-proxy", model.KindSidecar), container("loader", model.KindApp), container("trainer", model.KindApp, nvidia, "2")),
			devices: gpus("GPU-0", "GPU-1"),
			want:    map[string][]string{"trainer": {"GPU-0", "GPU-1"}},
		},
		{
			name:    "nothing requested: the first app container gets them, not the init container nor the sidecar",
			spec:    spec(container("setup", model.KindInit), container("istio-proxy", model.KindSidecar), container("main", model.KindApp), container("logger", model.KindApp)),
			devices: append(gpus("GPU-0"), rdma(0, "0000:01:00.2")),
			want:    map[string][]string{"main": {"GPU-0", "0000:01:00.2"}},
		},
		{
			name:    "two containers asking nvidia.com/gpu 1 with two GPUs: one each, in container order",
			spec:    spec(container("a", model.KindApp, nvidia, "1"), container("b", model.KindApp, nvidia, "1")),
			devices: gpus("GPU-0", "GPU-1"),
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-1"}},
		},
		{
			name:    "gpu-core 100 and gpu-core 100 with three GPUs: one, then the rest to the last",
			spec:    spec(container("a", model.KindApp, core, "100"), container("b", model.KindApp, core, "100")),
			devices: gpus("GPU-0", "GPU-1", "GPU-2"),
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-1", "GPU-2"}},
		},
		{
			name:    "a container asking more than is left gets what is left, later ones nothing",
			spec:    spec(container("a", model.KindApp, nvidia, "2"), container("b", model.KindApp, nvidia, "1")),
			devices: gpus("GPU-0", "GPU-1"),
			want:    map[string][]string{"a": {"GPU-0", "GPU-1"}},
		},
		{
			name:    "two containers asking gpu-core 50 share the one GPU: both get it",
			spec:    spec(container("a", model.KindApp, core, "50"), container("b", model.KindApp, core, "50")),
			devices: gpus("GPU-0"),
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-0"}},
		},
		{
			name:    "a Shared GPU goes to every container asking a share",
			spec:    spec(container("a", model.KindApp, core, "25"), container("b", model.KindApp, core, "25"), container("c", model.KindApp)),
			devices: []model.Device{shared(gpu("GPU-0", 0))},
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-0"}},
		},
		{
			name:    "whole and shared requests: the whole GPU to the whole asker, the Shared one to the sharer",
			spec:    spec(container("a", model.KindApp, core, "50"), container("b", model.KindApp, core, "100")),
			devices: []model.Device{gpu("GPU-0", 0), shared(gpu("GPU-1", 1))},
			want:    map[string][]string{"a": {"GPU-1"}, "b": {"GPU-0"}},
		},
		{
			name:    "what whole askers leave goes to the sharers, not the last requester",
			spec:    spec(container("a", model.KindApp, nvidia, "1"), container("b", model.KindApp, "koordinator.sh/gpu-memory", "4Gi"), container("c", model.KindApp, nvidia, "1")),
			devices: gpus("GPU-0", "GPU-1", "GPU-2"),
			want:    map[string][]string{"a": {"GPU-0"}, "c": {"GPU-1"}, "b": {"GPU-2"}},
		},
		{
			name:    "a Shared device nobody asks a share of is handed out like a whole one",
			spec:    spec(container("a", model.KindApp, nvidia, "1"), container("b", model.KindApp, nvidia, "1")),
			devices: []model.Device{shared(gpu("GPU-0", 0)), gpu("GPU-1", 1)},
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-1"}},
		},
		{
			name:    "init containers never get devices, even when they request them",
			spec:    spec(container("fetch-model", model.KindInit, nvidia, "1"), container("serve", model.KindApp)),
			devices: gpus("GPU-0"),
			want:    map[string][]string{"serve": {"GPU-0"}},
		},
		{
			name:    "an init container and an app container requesting: the app container gets them all",
			spec:    spec(container("warmup", model.KindInit, nvidia, "1"), container("sidecar", model.KindSidecar), container("serve", model.KindApp, nvidia, "1")),
			devices: gpus("GPU-0"),
			want:    map[string][]string{"serve": {"GPU-0"}},
		},
		{
			name: "each kind is attributed on its own: GPUs to the trainer, the VF to the requesting sidecar",
			spec: spec(container("net", model.KindSidecar, rdmaR, "100"), container("trainer", model.KindApp, core, "100")),
			devices: []model.Device{
				gpu("GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", 0),
				rdma(0, "0000:01:00.2"),
			},
			want: map[string][]string{"trainer": {"GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"}, "net": {"0000:01:00.2"}},
		},
		{
			name:    "a container's devices keep the input order across kinds",
			spec:    spec(container("main", model.KindApp, nvidia, "2", rdmaR, "100")),
			devices: []model.Device{gpu("GPU-0", 0), rdma(0, "0000:01:00.2"), gpu("GPU-1", 1)},
			want:    map[string][]string{"main": {"GPU-0", "0000:01:00.2", "GPU-1"}},
		},
		{
			name: "ContainerIndex counts the requesting containers, init and sidecar included",
			spec: spec(container("init", model.KindInit), container("sidecar", model.KindSidecar, nvidia, "1"), container("a", model.KindApp), container("b", model.KindApp, nvidia, "1")),
			devices: []model.Device{
				at(0, model.ScopeRequestingAll, gpu("GPU-0", 0)),
				at(1, model.ScopeRequestingAll, gpu("GPU-1", 1)),
			},
			want: map[string][]string{"sidecar": {"GPU-0"}, "b": {"GPU-1"}},
		},
		{
			name: "ContainerIndex counts the requesting app containers only",
			spec: spec(container("sidecar", model.KindSidecar, nvidia, "1"), container("a", model.KindApp, nvidia, "1"), container("b", model.KindApp, nvidia, "1")),
			devices: []model.Device{
				at(0, model.ScopeRequesting, gpu("GPU-0", 0)),
				at(1, model.ScopeRequesting, gpu("GPU-1", 1)),
			},
			want: map[string][]string{"a": {"GPU-0"}, "b": {"GPU-1"}},
		},
		{
			name:    "ContainerIndex of a plain init container is dropped",
			spec:    spec(container("init", model.KindInit, nvidia, "1"), container("a", model.KindApp, nvidia, "1")),
			devices: []model.Device{at(0, model.ScopeRequestingAll, gpu("GPU-0", 0)), at(1, model.ScopeRequestingAll, gpu("GPU-1", 1))},
			want:    map[string][]string{"a": {"GPU-1"}},
		},
		{
			name:    "ContainerIndex out of range falls back to the pod-level policy",
			spec:    spec(container("a", model.KindApp), container("b", model.KindApp, nvidia, "1")),
			devices: []model.Device{at(2, model.ScopeRequestingAll, gpu("GPU-0", 0)), at(-1, model.ScopeRequestingAll, gpu("GPU-1", 1))},
			want:    map[string][]string{"b": {"GPU-0", "GPU-1"}},
		},
		{
			name:    "ContainerIndex without a scope falls back to the pod-level policy",
			spec:    spec(container("a", model.KindApp), container("b", model.KindApp, nvidia, "1")),
			devices: []model.Device{at(0, "", gpu("GPU-0", 0))},
			want:    map[string][]string{"b": {"GPU-0"}},
		},
		{
			name:    "devices of an allocator the set does not know go to the first app container",
			spec:    spec(container("sidecar", model.KindSidecar, nvidia, "1"), container("a", model.KindApp, nvidia, "1")),
			devices: []model.Device{{Allocator: "volcano", Type: "gpu", Resource: nvidia, IDs: []string{"GPU-v"}}},
			want:    map[string][]string{"a": {"GPU-v"}},
		},
		{
			name:    "no devices: an empty assignment",
			spec:    spec(container("a", model.KindApp, nvidia, "1")),
			devices: nil,
			want:    map[string][]string{},
		},
	}
	s := NewSet(nil, nil, koordinator.New(koordinator.Options{}))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, ok := s.Assign(tt.spec, tt.devices)
			if !ok {
				t.Fatal("Assign: ok = false")
			}
			if got := ids(a); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Assign:\n got %v\nwant %v", got, tt.want)
			}
		})
	}
}

func TestAssignWithoutSpecIsNotOK(t *testing.T) {
	s := NewSet(nil, nil, koordinator.New(koordinator.Options{}))
	if a, ok := s.Assign(nil, gpus("GPU-0")); ok || a != nil {
		t.Errorf("Assign(nil spec) = %v, %v; want nil, false", a, ok)
	}
}

func TestAssignWithoutAppContainerIsNotOK(t *testing.T) {
	s := NewSet(nil, nil, koordinator.New(koordinator.Options{}))
	sp := spec(container("init", model.KindInit), container("sidecar", model.KindSidecar, "nvidia.com/gpu", "1"))
	if a, ok := s.Assign(sp, gpus("GPU-0")); ok || a != nil {
		t.Errorf("Assign(no app container) = %v, %v; want nil, false", a, ok)
	}
}

func TestAssignIsDeterministic(t *testing.T) {
	s := NewSet(nil, nil, koordinator.New(koordinator.Options{}))
	sp := spec(
		container("net", model.KindSidecar, "koordinator.sh/rdma", "100"),
		container("a", model.KindApp, "koordinator.sh/gpu-core", "100", "nvidia.com/gpu", "1"),
		container("b", model.KindApp, "koordinator.sh/gpu-memory", "2Gi"),
		container("c", model.KindApp, "koordinator.sh/gpu-core", "200", "koordinator.sh/rdma", "100"),
	)
	devices := []model.Device{
		gpu("GPU-0", 0), rdma(0, "0000:01:00.2", "0000:01:00.3"), shared(gpu("GPU-1", 1)),
		gpu("GPU-2", 2), rdma(1, "0000:02:00.2"), gpu("GPU-3", 3), at(2, model.ScopeRequestingAll, gpu("GPU-4", 4)),
	}
	first, _ := s.Assign(sp, devices)
	for range 50 {
		if again, _ := s.Assign(sp, devices); !reflect.DeepEqual(again, first) {
			t.Fatalf("Assign changed its answer:\n%v\n%v", ids(first), ids(again))
		}
	}
	want := map[string][]string{
		"net": {"0000:01:00.2+0000:01:00.3"},
		"a":   {"GPU-0"},
		"b":   {"GPU-1"},
		"c":   {"GPU-2", "0000:02:00.2", "GPU-3", "GPU-4"},
	}
	if got := ids(first); !reflect.DeepEqual(got, want) {
		t.Errorf("Assign:\n got %v\nwant %v", got, want)
	}
}

func TestAsksCountsWhatQuotaCounted(t *testing.T) {
	const (
		nvidia = "nvidia.com/gpu"
		core   = "koordinator.sh/gpu-core"
		ratio  = "koordinator.sh/gpu-memory-ratio"
		share  = "koordinator.sh/gpu.shared"
	)
	s := NewSet(nil, nil, koordinator.New(koordinator.Options{}))
	for _, tc := range []struct {
		name string
		spec *model.PodSpec
		dev  model.Device
		want int64
	}{
		{"one whole GPU", spec(container("app", model.KindApp, core, "100", ratio, "100")), gpu(uuidA, 0), 1},
		{"a sidecar's and an app's GPUs add up", spec(container("proxy", model.KindSidecar, nvidia, "1"), container("app", model.KindApp, nvidia, "2")), gpu(uuidA, 0), 3},
		{"a share is one device", spec(container("app", model.KindApp, core, "50")), shared(gpu(uuidA, 0)), 1},
		{"two sharers, one device each at most", spec(container("a", model.KindApp, core, "50"), container("b", model.KindApp, core, "50")), shared(gpu(uuidA, 0)), 2},
		{"gpu.shared: 2 asks a share of two GPUs", spec(container("app", model.KindApp, core, "100", ratio, "100", share, "2")), shared(gpu(uuidA, 0)), 2},
		{"init containers only: the one asking most", spec(container("i1", model.KindInit, nvidia, "1"), container("i2", model.KindInit, nvidia, "2"), container("app", model.KindApp)), gpu(uuidA, 0), 2},
		{"the running containers' ask, when they ask", spec(container("init", model.KindInit, nvidia, "4"), container("app", model.KindApp, nvidia, "1")), gpu(uuidA, 0), 1},
		{"nobody asks", spec(container("app", model.KindApp)), gpu(uuidA, 0), 0},
		{"RDMA asked in percent", spec(container("app", model.KindApp, "koordinator.sh/rdma", "100")), rdma(0, "0000:1f:00.2"), 1},
		{"an allocator the set lacks", spec(container("app", model.KindApp, nvidia, "1")), model.Device{Allocator: "other", Resource: nvidia}, 0},
		{"no spec", nil, gpu(uuidA, 0), 0},
		// Each request fits an int64 and their sum does not: it must not
		// wrap to a negative count (nothing asked) or a small one.
		{"asks beyond an int64 are capped, not wrapped", spec(container("a", model.KindApp, nvidia, "9223372036854775807"), container("b", model.KindApp, nvidia, "9223372036854775807")), gpu(uuidA, 0), math.MaxInt64},
		{"capped with a third container too", spec(container("a", model.KindApp, nvidia, "9223372036854775807"), container("b", model.KindApp, nvidia, "9223372036854775807"), container("c", model.KindSidecar, nvidia, "3")), gpu(uuidA, 0), math.MaxInt64},
	} {
		if got := s.Asks(tc.spec, tc.dev); got != tc.want {
			t.Errorf("%s: Asks = %d, want %d", tc.name, got, tc.want)
		}
	}
}
