package reuse

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/proxy/plans"
)

// Steady is the one-pass path of a List on a node where nothing changed.
// Whatever it answers must be what the full path (Split, Reuse, Splice)
// answers, and it must refuse whenever the full path would rebuild a pod.

// node is a kubelet answer's pods and their plans.
type node struct {
	devs  map[string]int     // each pod's devices of the kubelet's own, by name
	cpus  map[string][]int64 // each pod's exclusive CPUs, by name
	plans map[model.PodKey]*plans.Plan
}

func newNode(pods int) *node {
	n := &node{devs: map[string]int{}, cpus: map[string][]int64{}, plans: map[model.PodKey]*plans.Plan{}}
	for i := range pods {
		n.add(fmt.Sprintf("pod-%d", i), i%3)
	}
	return n
}

func (n *node) add(name string, devs int) {
	n.devs[name] = devs
	n.plans[model.PodKey{Namespace: "ns", Name: name}] = &plans.Plan{}
}

// seg is a pod as the kubelet lists it: its devices in a new order.
func (n *node) seg(name string) []byte {
	c := &v1.ContainerResources{Name: "app", CpuIds: n.cpus[name]}
	for _, i := range rand.Perm(n.devs[name]) {
		c.Devices = append(c.Devices, &v1.ContainerDevices{ResourceName: "rdma/hca", DeviceIds: []string{fmt.Sprintf("%s-mlx5_%d", name, i)}})
	}
	b, err := proto.Marshal(&v1.PodResources{Name: name, Namespace: "ns", Containers: []*v1.ContainerResources{c}})
	if err != nil {
		panic(err)
	}
	return b
}

// answer is a kubelet List answer: the pods in a new order, each pod's
// devices in a new order, and a field of a newer kubelet.
func (n *node) answer() []byte {
	names := make([]string, 0, len(n.devs))
	for name := range n.devs {
		names = append(names, name)
	}
	rand.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	var b []byte
	for _, name := range names {
		b = protowire.AppendTag(b, podsField, protowire.BytesType)
		b = protowire.AppendBytes(b, n.seg(name))
	}
	b = protowire.AppendTag(b, 7, protowire.BytesType)
	return protowire.AppendString(b, "from a newer kubelet")
}

func (n *node) resolve(k model.PodKey) (*plans.Plan, bool) {
	p, ok := n.plans[k]
	return p, ok
}

// full is the full path's answer: pods Reuse cannot reuse are given an
// output naming them (and cached, as listAnswer does), the answer spliced.
func (n *node) full(t *testing.T, c *Cache, kubelet []byte, tab *plans.Table) []byte {
	parts, err := Split(nil, kubelet)
	if err != nil {
		t.Fatal(err)
	}
	gen, pods, _ := c.Reuse(parts, tab, n.resolve)
	for i := range parts {
		p := &parts[i]
		if !p.Need {
			continue
		}
		if p.Key, err = PodKey(p.Pod); err != nil {
			t.Fatal(err)
		}
		p.Plan = n.plans[p.Key]
		p.Out = append(slices.Clone(p.Pod), []byte("+devices of "+p.Key.Name)...)
	}
	out := Splice(parts)
	c.Store(parts, gen)
	c.Drop(gen, pods)
	return out
}

func TestSteadyAnswersAsTheFullPathDoes(t *testing.T) {
	n := newNode(30)
	var c Cache
	tab := &plans.Table{}
	if _, _, ok := c.Steady(n.answer(), tab, n.resolve); ok {
		t.Fatal("Steady answered from an empty cache")
	}
	first := n.full(t, &c, n.answer(), tab)
	if !bytes.Contains(first, []byte("+devices of pod-29")) {
		t.Fatal("the full path did not rebuild the pods")
	}
	for i := range 20 {
		kubelet := n.answer()
		got, pods, ok := c.Steady(kubelet, tab, n.resolve)
		if !ok || pods != 30 {
			t.Fatalf("List %d: Steady refused (%v) or listed %d pods on an unchanged node", i, ok, pods)
		}
		if want := n.full(t, &c, kubelet, tab); !bytes.Equal(got, want) {
			t.Fatalf("List %d: Steady's answer differs from the full path's", i)
		}
	}
}

func TestSteadyRefusesWhenAPodMustBeRebuilt(t *testing.T) {
	n := newNode(10)
	var c Cache
	t1, t2, t3 := &plans.Table{}, &plans.Table{}, &plans.Table{}
	n.full(t, &c, n.answer(), t1)
	steady := func(tab *plans.Table) bool {
		_, _, ok := c.Steady(n.answer(), tab, n.resolve)
		return ok
	}
	if !steady(t1) {
		t.Fatal("Steady refused an unchanged node")
	}
	// A new table, every plan as it was: still steady.
	if !steady(t2) {
		t.Fatal("Steady refused after a new table that kept every plan")
	}
	// A pod's plan is replaced.
	n.plans[model.PodKey{Namespace: "ns", Name: "pod-3"}] = &plans.Plan{}
	if steady(t3) {
		t.Fatal("Steady answered although a pod's plan changed")
	}
	n.full(t, &c, n.answer(), t3)
	// A pod the table can no longer answer (its name is another pod now).
	delete(n.plans, model.PodKey{Namespace: "ns", Name: "pod-5"})
	if steady(&plans.Table{}) {
		t.Fatal("Steady answered a pod the plans cannot answer")
	}
	n.plans[model.PodKey{Namespace: "ns", Name: "pod-5"}] = &plans.Plan{}
	n.full(t, &c, n.answer(), t3)
	// The kubelet's part of a pod changes, and a new pod comes.
	n.cpus["pod-4"] = []int64{4, 5}
	if steady(t3) {
		t.Fatal("Steady answered although the kubelet's part of a pod changed")
	}
	n.full(t, &c, n.answer(), t3)
	n.add("pod-new", 2)
	if steady(t3) {
		t.Fatal("Steady answered for a pod it never built")
	}
	n.full(t, &c, n.answer(), t3)
	if !steady(t3) {
		t.Fatal("Steady refused once every pod was built again")
	}
}

func TestSteadyForgetsPodsNoLongerListed(t *testing.T) {
	n := newNode(10)
	var c Cache
	tab := &plans.Table{}
	n.full(t, &c, n.answer(), tab)
	delete(n.devs, "pod-2")
	delete(n.devs, "pod-7")
	if _, pods, ok := c.Steady(n.answer(), tab, n.resolve); !ok || pods != 8 {
		t.Fatalf("Steady = %d pods, %v; want 8, true", pods, ok)
	}
	if len(c.m) != 8 {
		t.Errorf("the cache holds %d pods after an answer of 8", len(c.m))
	}
}
