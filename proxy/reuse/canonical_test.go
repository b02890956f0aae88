package reuse

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// canonicalKey is appendCanonical's form of seg on its own, or nil when
// seg already is canonical or does not parse.
func canonicalKey(seg []byte) []byte {
	k, ok := appendCanonical(nil, seg)
	if !ok {
		return nil
	}
	return k
}

// A pod holding several devices of the kubelet's own comes in a new device
// order on almost every List (the kubelet builds them from maps): every
// order must find the same cache entry, or that pod is rebuilt on every
// call on a real node.

// kubeletPod is a pod as the kubelet lists it: one ContainerDevices per
// device id, in the order given.
func kubeletPod(order []int) []byte {
	c := &v1.ContainerResources{Name: "app", CpuIds: []int64{2, 3}}
	for _, i := range order {
		res := "nvidia.com/gpu"
		if i%2 == 1 {
			res = "rdma/hca_shared_devices_a"
		}
		c.Devices = append(c.Devices, &v1.ContainerDevices{ResourceName: res, DeviceIds: []string{fmt.Sprintf("dev-%d", i)},
			Topology: &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: int64(i % 2)}}}})
	}
	pod := &v1.PodResources{Name: "trainer", Namespace: "team-a", Containers: []*v1.ContainerResources{
		{Name: "sidecar"}, c,
	}}
	pod.ProtoReflect().SetUnknown(unknownField(99, "from a newer kubelet"))
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(pod)
	if err != nil {
		panic(err)
	}
	return b
}

// unknownField is a bytes field the PodResources message does not know.
func unknownField(num protowire.Number, v string) []byte {
	return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

// key is what an entry of seg is kept under.
func key(seg []byte) []byte {
	if k := canonicalKey(seg); k != nil {
		return k
	}
	return seg
}

func TestEveryDeviceOrderOfAPodHasOneKey(t *testing.T) {
	want := key(kubeletPod([]int{0, 1, 2, 3, 4}))
	seen := map[string]bool{}
	for range 50 {
		order := rand.Perm(5)
		seg := kubeletPod(order)
		seen[string(seg)] = true
		got := key(seg)
		if !bytes.Equal(got, want) {
			t.Fatalf("device order %v has another key than the sorted order", order)
		}
		if len(got) != len(seg) {
			t.Fatalf("key of %d bytes for a segment of %d", len(got), len(seg))
		}
		var a, b v1.PodResources
		if err := proto.Unmarshal(seg, &a); err != nil {
			t.Fatal(err)
		}
		if err := proto.Unmarshal(got, &b); err != nil {
			t.Fatalf("the key does not decode: %v", err)
		}
		if len(b.ProtoReflect().GetUnknown()) == 0 || len(b.Containers[1].Devices) != 5 || b.Containers[1].Name != "app" {
			t.Fatalf("the key lost fields: %v", &b)
		}
	}
	if len(seen) < 2 {
		t.Fatalf("50 shuffles gave %d device orders", len(seen))
	}
	if k := canonicalKey(want); k != nil {
		t.Errorf("a canonical segment is keyed by a copy of itself, want its own bytes")
	}
}

func TestPodsThatDifferAreKeptApart(t *testing.T) {
	a := kubeletPod([]int{1, 0, 2})
	b := kubeletPod([]int{1, 0, 3})
	if bytes.Equal(key(a), key(b)) {
		t.Fatal("pods with different devices share a key")
	}
}

func TestASegmentThatDoesNotParseIsKeyedByItsBytes(t *testing.T) {
	seg := kubeletPod([]int{3, 2, 1, 0})
	for cut := range len(seg) {
		if k := canonicalKey(seg[:cut]); k != nil && len(k) != cut {
			t.Fatalf("cut at %d: key of %d bytes", cut, len(k))
		}
	}
	// A container whose devices are out of order and whose tail is garbage.
	c := kubeletPod([]int{1, 0})
	c = append(c, 0x1a, 0x03, 0x12, 0x01, 0xff) // containers: a device field cut short
	if k := canonicalKey(c); k != nil && len(k) != len(c) {
		t.Fatalf("key of %d bytes for %d", len(k), len(c))
	}
}

func FuzzCanonicalKey(f *testing.F) {
	f.Add(kubeletPod([]int{2, 0, 1}))
	f.Add(kubeletPod([]int{0, 1}))
	f.Add([]byte{0x1a, 0x04, 0x12, 0x00, 0x12, 0x00})
	f.Fuzz(func(t *testing.T, seg []byte) {
		k := canonicalKey(seg)
		if k == nil {
			return
		}
		if len(k) != len(seg) {
			t.Fatalf("key of %d bytes for a segment of %d", len(k), len(seg))
		}
		if again := canonicalKey(k); again != nil {
			t.Fatalf("a key is not canonical itself")
		}
	})
}
