package allocator

import (
	"reflect"
	"strings"
	"testing"

	"github.com/podres-proxy/podres-proxy/state"
)

func container(name string, kind state.ContainerKind, requests ...string) state.ContainerSpec {
	c := state.ContainerSpec{Name: name, Kind: kind}
	for i := 0; i+1 < len(requests); i += 2 {
		if c.Requests == nil {
			c.Requests = map[string]string{}
		}
		c.Requests[requests[i]] = requests[i+1]
	}
	return c
}

func spec(cs ...state.ContainerSpec) *state.PodSpec { return &state.PodSpec{Containers: cs} }

func gpus(ids ...string) []state.Device {
	var out []state.Device
	for i, id := range ids {
		out = append(out, gpu(id, int64(i)))
	}
	return out
}

func at(index int, d state.Device) state.Device { d.ContainerIndex = &index; return d }

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
		spec    *state.PodSpec
		devices []state.Device
		want    map[string][]string
	}{
		{
			name:    "sidecar and two app containers, only the second requests: the second gets them all",
			spec:    spec(container("istio-proxy", state.KindSidecar), container("loader", state.KindApp), container("trainer", state.KindApp, nvidia, "2")),
			devices: gpus("GPU-0", "GPU-1"),
			want:    map[string][]string{"trainer": {"GPU-0", "GPU-1"}},
		},
		{
			name:    "nothing requested: the first app container gets them, not the init container nor the sidecar",
			spec:    spec(container("setup", state.KindInit), container("istio-proxy", state.KindSidecar), container("main", state.KindApp), container("logger", state.KindApp)),
			devices: append(gpus("GPU-0"), rdma(0, "0000:01:00.2")),
			want:    map[string][]string{"main": {"GPU-0", "0000:01:00.2"}},
		},
		{
			name:    "two containers asking nvidia.com/gpu 1 with two GPUs: one each, in container order",
			spec:    spec(container("a", state.KindApp, nvidia, "1"), container("b", state.KindApp, nvidia, "1")),
			devices: gpus("GPU-0", "GPU-1"),
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-1"}},
		},
		{
			name:    "gpu-core 100 and gpu-core 100 with three GPUs: one, then the rest to the last",
			spec:    spec(container("a", state.KindApp, core, "100"), container("b", state.KindApp, core, "100")),
			devices: gpus("GPU-0", "GPU-1", "GPU-2"),
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-1", "GPU-2"}},
		},
		{
			name:    "a container asking more than is left gets what is left, later ones nothing",
			spec:    spec(container("a", state.KindApp, nvidia, "2"), container("b", state.KindApp, nvidia, "1")),
			devices: gpus("GPU-0", "GPU-1"),
			want:    map[string][]string{"a": {"GPU-0", "GPU-1"}},
		},
		{
			name:    "two containers asking gpu-core 50 share the one GPU: both get it",
			spec:    spec(container("a", state.KindApp, core, "50"), container("b", state.KindApp, core, "50")),
			devices: gpus("GPU-0"),
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-0"}},
		},
		{
			name:    "a Shared GPU goes to every container asking a share",
			spec:    spec(container("a", state.KindApp, core, "25"), container("b", state.KindApp, core, "25"), container("c", state.KindApp)),
			devices: []state.Device{shared(gpu("GPU-0", 0))},
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-0"}},
		},
		{
			name:    "whole and shared requests: the whole GPU to the whole asker, the Shared one to the sharer",
			spec:    spec(container("a", state.KindApp, core, "50"), container("b", state.KindApp, core, "100")),
			devices: []state.Device{gpu("GPU-0", 0), shared(gpu("GPU-1", 1))},
			want:    map[string][]string{"a": {"GPU-1"}, "b": {"GPU-0"}},
		},
		{
			name:    "what whole askers leave goes to the sharers, not the last requester",
			spec:    spec(container("a", state.KindApp, nvidia, "1"), container("b", state.KindApp, "koordinator.sh/gpu-memory", "4Gi"), container("c", state.KindApp, nvidia, "1")),
			devices: gpus("GPU-0", "GPU-1", "GPU-2"),
			want:    map[string][]string{"a": {"GPU-0"}, "c": {"GPU-1"}, "b": {"GPU-2"}},
		},
		{
			name:    "a Shared device nobody asks a share of is handed out like a whole one",
			spec:    spec(container("a", state.KindApp, nvidia, "1"), container("b", state.KindApp, nvidia, "1")),
			devices: []state.Device{shared(gpu("GPU-0", 0)), gpu("GPU-1", 1)},
			want:    map[string][]string{"a": {"GPU-0"}, "b": {"GPU-1"}},
		},
		{
			name:    "init containers never get devices, even when they request them",
			spec:    spec(container("fetch-model", state.KindInit, nvidia, "1"), container("serve", state.KindApp)),
			devices: gpus("GPU-0"),
			want:    map[string][]string{"serve": {"GPU-0"}},
		},
		{
			name:    "an init container and an app container requesting: the app container gets them all",
			spec:    spec(container("warmup", state.KindInit, nvidia, "1"), container("sidecar", state.KindSidecar), container("serve", state.KindApp, nvidia, "1")),
			devices: gpus("GPU-0"),
			want:    map[string][]string{"serve": {"GPU-0"}},
		},
		{
			name: "each kind is attributed on its own: GPUs to the trainer, the VF to the requesting sidecar",
			spec: spec(container("net", state.KindSidecar, rdmaR, "100"), container("trainer", state.KindApp, core, "100")),
			devices: []state.Device{
				gpu("GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a", 0),
				rdma(0, "0000:01:00.2"),
			},
			want: map[string][]string{"trainer": {"GPU-989aa251-1dfe-5bbc-7c12-46e817b1de9a"}, "net": {"0000:01:00.2"}},
		},
		{
			name:    "a container's devices keep the input order across kinds",
			spec:    spec(container("main", state.KindApp, nvidia, "2", rdmaR, "100")),
			devices: []state.Device{gpu("GPU-0", 0), rdma(0, "0000:01:00.2"), gpu("GPU-1", 1)},
			want:    map[string][]string{"main": {"GPU-0", "0000:01:00.2", "GPU-1"}},
		},
		{
			name: "ContainerIndex names the container, whatever it requests",
			spec: spec(container("init", state.KindInit), container("sidecar", state.KindSidecar), container("a", state.KindApp), container("b", state.KindApp, nvidia, "1")),
			devices: []state.Device{
				at(1, gpu("GPU-0", 0)),
				at(2, gpu("GPU-1", 1)),
			},
			want: map[string][]string{"sidecar": {"GPU-0"}, "a": {"GPU-1"}},
		},
		{
			name:    "ContainerIndex of a plain init container is dropped",
			spec:    spec(container("init", state.KindInit), container("a", state.KindApp)),
			devices: []state.Device{at(0, gpu("GPU-0", 0)), at(1, gpu("GPU-1", 1))},
			want:    map[string][]string{"a": {"GPU-1"}},
		},
		{
			name:    "ContainerIndex out of range falls back to the pod-level policy",
			spec:    spec(container("a", state.KindApp), container("b", state.KindApp, nvidia, "1")),
			devices: []state.Device{at(2, gpu("GPU-0", 0)), at(-1, gpu("GPU-1", 1))},
			want:    map[string][]string{"b": {"GPU-0", "GPU-1"}},
		},
		{
			name:    "devices of an allocator the set does not know go to the first app container",
			spec:    spec(container("sidecar", state.KindSidecar, nvidia, "1"), container("a", state.KindApp, nvidia, "1")),
			devices: []state.Device{{Allocator: "volcano", Type: "gpu", Resource: nvidia, IDs: []string{"GPU-v"}}},
			want:    map[string][]string{"a": {"GPU-v"}},
		},
		{
			name:    "no devices: an empty assignment",
			spec:    spec(container("a", state.KindApp, nvidia, "1")),
			devices: nil,
			want:    map[string][]string{},
		},
	}
	s := NewSet(nil, nil, NewKoordinator(KoordinatorOptions{}))
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
	s := NewSet(nil, nil, NewKoordinator(KoordinatorOptions{}))
	if a, ok := s.Assign(nil, gpus("GPU-0")); ok || a != nil {
		t.Errorf("Assign(nil spec) = %v, %v; want nil, false", a, ok)
	}
}

func TestAssignWithoutAppContainerIsNotOK(t *testing.T) {
	s := NewSet(nil, nil, NewKoordinator(KoordinatorOptions{}))
	sp := spec(container("init", state.KindInit), container("sidecar", state.KindSidecar, "nvidia.com/gpu", "1"))
	if a, ok := s.Assign(sp, gpus("GPU-0")); ok || a != nil {
		t.Errorf("Assign(no app container) = %v, %v; want nil, false", a, ok)
	}
}

func TestAssignIsDeterministic(t *testing.T) {
	s := NewSet(nil, nil, NewKoordinator(KoordinatorOptions{}))
	sp := spec(
		container("net", state.KindSidecar, "koordinator.sh/rdma", "100"),
		container("a", state.KindApp, "koordinator.sh/gpu-core", "100", "nvidia.com/gpu", "1"),
		container("b", state.KindApp, "koordinator.sh/gpu-memory", "2Gi"),
		container("c", state.KindApp, "koordinator.sh/gpu-core", "200", "koordinator.sh/rdma", "100"),
	)
	devices := []state.Device{
		gpu("GPU-0", 0), rdma(0, "0000:01:00.2", "0000:01:00.3"), shared(gpu("GPU-1", 1)),
		gpu("GPU-2", 2), rdma(1, "0000:02:00.2"), gpu("GPU-3", 3), at(3, gpu("GPU-4", 4)),
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
