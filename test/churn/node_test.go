package churn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	corev1 "k8s.io/api/core/v1"

	fk "github.com/podres-proxy/podres-proxy/test/fakekubelet"
	"github.com/podres-proxy/podres-proxy/test/nriruntime"
	"github.com/podres-proxy/podres-proxy/test/podsapitest"
)

// The node: the fake kubelet (PodResources, /pods, its pod logs directory
// and, when asked for, its Pods API), the NRI runtime, and the history of
// which pod (UID, devices) the kubelet listed under each name when, which
// every answer is checked against.

const (
	namespace = "churn"
	koordKey  = "scheduling.koordinator.sh/device-allocated"
	// quiet is how long a running pod's name must have been left alone
	// for its devices to be owed in every answer.
	quiet = time.Second
)

// incarnation is one pod, one UID, under a name.
type incarnation struct {
	name    string
	uid     string
	devices []string // the ids answers give it: a GPU's UUID, a VF's PCI address
	pod     fk.Pod
	// from and to are the node states in which the kubelet listed it:
	// from up to, not including, to (0 while it is listed).
	from, to uint64
	sandbox  *api.PodSandbox // nil until its sandbox begins
	ctr      *api.Container
	running  bool // the kubelet reports it Running
}

// listedIn reports whether the kubelet listed it in some state s..e.
func (in *incarnation) listedIn(s, e uint64) bool { return in.from <= e && (in.to == 0 || in.to > s) }

// end is the first state the kubelet no longer listed it in.
func (in *incarnation) end() uint64 {
	if in.to == 0 {
		return math.MaxUint64
	}
	return in.to
}

// describe says what in was, with the times its states began at.
func (in *incarnation) describe(at []time.Time) string {
	to := "now"
	if in.to != 0 {
		to = fmt.Sprintf("%d (%s), gone at %s", in.to-1, clock(at[in.to-1]), clock(at[in.to]))
	}
	return fmt.Sprintf("uid %s devices %v listed in states %d (%s)..%s; running %v, sandbox begun %v",
		in.uid, in.devices, in.from, clock(at[in.from]), to, in.running, in.sandbox != nil)
}

func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// history is a name's incarnations, oldest first.
type history struct {
	incs []*incarnation
	// version counts the beginnings and ends of changes to the name;
	// quietSince is when the last one ended, zero while one runs.
	version    uint64
	quietSince time.Time
}

type node struct {
	k   *fk.Kubelet
	api *podsapitest.Server // nil: a kubelet without the Pods API
	rt  *nriruntime.Runtime

	mu        sync.Mutex
	state     uint64      // bumped at every change of what the kubelet lists
	at        []time.Time // when each state began, for the failure report
	names     map[string]*history
	listed    []*incarnation // what the kubelet lists, in admission order
	recent    []string       // names changed lately, newest last
	recreated []string       // names recreated lately, newest last
}

func newNode(k *fk.Kubelet, api *podsapitest.Server, rt *nriruntime.Runtime) *node {
	return &node{k: k, api: api, rt: rt, names: map[string]*history{}, at: []time.Time{time.Now()}}
}

// begin and end bracket every change to a name.
func (n *node) begin(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.names[name]
	if h == nil {
		h = &history{}
		n.names[name] = h
	}
	h.version++
	h.quietSince = time.Time{}
	n.recent = lastN(append(n.recent, name), 16)
}

func (n *node) end(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.names[name]
	h.version++
	h.quietSince = time.Now()
}

func lastN(s []string, max int) []string {
	if len(s) > max {
		return slices.Clone(s[len(s)-max:])
	}
	return s
}

// list makes the kubelet list in, pending, from the next state on.
func (n *node) list(in *incarnation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next()
	in.from = n.state
	n.names[in.name].incs = append(n.names[in.name].incs, in)
	n.listed = append(n.listed, in)
	n.publish()
	if n.api != nil {
		n.api.Add(&in.pod.Pod)
	}
}

// setRunning makes the kubelet report in Running.
func (n *node) setRunning(in *incarnation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next()
	in.running = true
	in.pod.Status.Phase = corev1.PodRunning
	n.publish()
	if n.api != nil {
		n.api.Update(&in.pod.Pod)
	}
}

// unlist makes the kubelet forget in, as it does once the pod is deleted.
func (n *node) unlist(in *incarnation) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next()
	in.to = n.state
	n.listed = slices.DeleteFunc(n.listed, func(l *incarnation) bool { return l == in })
	n.publish()
	if n.api != nil {
		n.api.Delete(&in.pod.Pod)
	}
}

// next begins the next state.
func (n *node) next() {
	n.state++
	n.at = append(n.at, time.Now())
}

// publish gives the kubelet what it lists now.
func (n *node) publish() {
	pods := make([]fk.Pod, 0, len(n.listed))
	for _, in := range n.listed {
		pods = append(pods, in.pod)
	}
	n.k.SetPods(pods...)
}

// logDir is a pod's log directory, which the kubelet makes just before it
// asks for the pod's sandbox and removes once the pod is gone.
func (n *node) logDir(in *incarnation) string {
	return filepath.Join(n.k.PodLogsDir, namespace+"_"+in.name+"_"+in.uid)
}

func (n *node) removeLogDir(in *incarnation) error {
	if err := os.RemoveAll(n.logDir(in)); err != nil {
		return fmt.Errorf("removing the log directory of %s (%s): %w", in.name, in.uid, err)
	}
	return nil
}

// span names states s..e with the times they began at.
func (n *node) span(s, e uint64) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fmt.Sprintf("states %d..%d (%s..%s)", s, e, clock(n.at[s]), clock(n.at[e]))
}

// now is the node's state.
func (n *node) now() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state
}

// owed is what a quiet running pod's name must be answered with.
type owed struct {
	version uint64
	devices []string
}

// quietPods returns the names of the running pods left alone for quiet at
// at, with the devices they are owed; name limits it to one.
func (n *node) quietPods(at time.Time, name string) map[string]owed {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]owed{}
	for _, in := range n.listed {
		h := n.names[in.name]
		if (name != "" && in.name != name) || !in.running || h.quietSince.IsZero() || at.Sub(h.quietSince) < quiet {
			continue
		}
		out[in.name] = owed{version: h.version, devices: in.devices}
	}
	return out
}

// stillQuiet reports whether name was not changed since it had version.
func (n *node) stillQuiet(name string, version uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.names[name].version == version
}

// heldBy returns, of the pods the kubelet listed under name in some state
// s..e, the one whose devices include all of ids, if any.
func (n *node) heldBy(name string, ids []string, s, e uint64) (*incarnation, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.names[name]
	if h == nil {
		return nil, false
	}
	for _, in := range h.incs {
		if in.listedIn(s, e) && containsAll(in.devices, ids) {
			return in, true
		}
	}
	return nil, false
}

// shared reports whether pods of names a and b, listed in some state s..e,
// held device id in one same state.
func (n *node) shared(id, a, b string, s, e uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range n.names[a].incs {
		for _, y := range n.names[b].incs {
			if x.listedIn(s, e) && y.listedIn(s, e) && slices.Contains(x.devices, id) && slices.Contains(y.devices, id) &&
				x.from < y.end() && y.from < x.end() {
				return true
			}
		}
	}
	return false
}

// timeline describes a name's incarnations, for a failure report.
func (n *node) timeline(name string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.names[name]
	if h == nil {
		return name + ": never on the node"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s (node state now %d):", name, n.state)
	for _, in := range h.incs {
		fmt.Fprintf(&b, "\n    %s", in.describe(n.at))
	}
	return b.String()
}

// target picks a name for a Get: one recreated lately, else one changed.
func (n *node) target(rng *rand.Rand) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.recreated) > 0 && rng.IntN(2) == 0 {
		return n.recreated[rng.IntN(len(n.recreated))]
	}
	if len(n.recent) > 0 {
		return n.recent[rng.IntN(len(n.recent))]
	}
	return ""
}

func (n *node) noteRecreated(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.recreated = lastN(append(n.recreated, name), 8)
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
