package handover

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// caller is one client of the PodResources socket, calling List and Get in
// turn every few milliseconds: perCall dials for each call and closes the
// connection after it (Multus, Kata, nri-plugins); the others keep one
// connection for the whole test (DCGM exporter, RTE).
type caller struct {
	id      int
	perCall bool
	calls   atomic.Int64
	// lastStart is when its last finished call began (UnixNano).
	lastStart atomic.Int64

	mu       sync.Mutex
	failures []string // every failed call, described
}

func (c *caller) kind() string {
	if c.perCall {
		return "dialing per call"
	}
	return "on a long-lived connection"
}

// since reports whether a call that began at or after t has finished.
func (c *caller) since(t time.Time) bool { return c.lastStart.Load() >= t.UnixNano() }

// checker runs the callers and checks every answer against the node: a
// steady pod is in every List with exactly its devices and every Get of it
// answers them; any other pod in an answer is one the node listed under
// that name, with exactly its devices or none (pending, or being deleted);
// a Get of such a pod may also answer the kubelet's "not found".
type checker struct {
	n       *node
	socket  string
	callers []*caller

	lists, gets atomic.Int64

	mu     sync.Mutex
	wrong  []string // the first wrong answers, described
	nWrong int
}

const maxWrong = 10

// newChecker makes callers clients, every other one dialing per call.
func newChecker(n *node, socket string, callers int) *checker {
	c := &checker{n: n, socket: socket}
	for i := range callers {
		c.callers = append(c.callers, &caller{id: i, perCall: i%2 == 1})
	}
	return c
}

func (c *checker) dial() (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
}

// run calls until ctx ends.
func (c *checker) run(ctx context.Context, cl *caller) {
	var kept *grpc.ClientConn
	defer func() {
		if kept != nil {
			kept.Close()
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		conn := kept
		if conn == nil {
			var err error
			if conn, err = c.dial(); err != nil {
				cl.fail(time.Now(), "dial", err)
				return
			}
			if !cl.perCall {
				kept = conn
			}
		}
		start := time.Now()
		api := v1.NewPodResourcesListerClient(conn)
		if i%2 == 0 {
			c.list(ctx, cl, api)
		} else {
			c.get(ctx, cl, api, c.target(i/2))
		}
		if cl.perCall {
			conn.Close()
		}
		cl.lastStart.Store(start.UnixNano())
		cl.calls.Add(1)
		if !pause(ctx) {
			return
		}
	}
}

// target is the pod the i-th Get asks for: each steady pod in turn, then
// the pod admitted last.
func (c *checker) target(i int) string {
	if i%(steady+1) == steady {
		return c.n.newest()
	}
	return fmt.Sprintf("steady-%d", i%(steady+1))
}

func (c *checker) list(ctx context.Context, cl *caller, api v1.PodResourcesListerClient) {
	start := time.Now()
	owed := c.n.steadyPods()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := api.List(cctx, &v1.ListPodResourcesRequest{})
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			cl.fail(start, "List", err)
		}
		return
	}
	c.lists.Add(1)
	var problems []string
	shown := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() != namespace {
			continue
		}
		if _, twice := shown[p.GetName()]; twice {
			problems = append(problems, fmt.Sprintf("%s is in the answer twice", p.GetName()))
		}
		shown[p.GetName()] = devices(p)
	}
	for name, got := range shown {
		problems = append(problems, c.check(name, got)...)
	}
	for _, p := range owed {
		got, ok := shown[p.name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s, running the whole test, is missing", p.name))
		case !slices.Equal(got, p.devices):
			problems = append(problems, fmt.Sprintf("%s shows %v, not its %v", p.name, got, p.devices))
		}
	}
	c.verdict(cl, start, "List", problems)
}

func (c *checker) get(ctx context.Context, cl *caller, api v1.PodResourcesListerClient, name string) {
	start := time.Now()
	p := c.n.pod(name)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := api.Get(cctx, &v1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	cancel()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return
	case !p.steady && status.Code(err) == codes.Unknown && strings.HasSuffix(status.Convert(err).Message(), "not found"):
		// The kubelet's own answer for a pod it no longer (or not yet)
		// lists: the pod admitted last may be deleted by now.
		c.gets.Add(1)
		return
	default:
		cl.fail(start, "Get "+name, err)
		return
	}
	c.gets.Add(1)
	got := devices(resp.GetPodResources())
	problems := c.check(name, got)
	if p.steady && !slices.Equal(got, p.devices) {
		problems = append(problems, fmt.Sprintf("%s shows %v, not its %v", name, got, p.devices))
	}
	c.verdict(cl, start, "Get "+name, problems)
}

// check checks the devices an answer gives name: the node's pod of that
// name's devices, or none.
func (c *checker) check(name string, got []string) []string {
	p := c.n.pod(name)
	switch {
	case p == nil:
		return []string{fmt.Sprintf("%s is answered, a pod never on the node, with %v", name, got)}
	case len(got) > 0 && !slices.Equal(got, p.devices):
		return []string{fmt.Sprintf("%s shows %v, not its %v", name, got, p.devices)}
	}
	return nil
}

// verdict keeps what was wrong with an answer.
func (c *checker) verdict(cl *caller, start time.Time, call string, problems []string) {
	if len(problems) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nWrong++
	if len(c.wrong) < maxWrong {
		c.wrong = append(c.wrong, fmt.Sprintf("%s by client %d (%s) at %s:\n  %s", call, cl.id, cl.kind(), clock(start), strings.Join(problems, "\n  ")))
	}
}

// fail keeps a failed call.
func (cl *caller) fail(start time.Time, call string, err error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.failures = append(cl.failures, fmt.Sprintf("%s by client %d (%s) at %s: %v", call, cl.id, cl.kind(), clock(start), err))
}

// failed is every failed call of a client.
func (cl *caller) failed() []string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return slices.Clone(cl.failures)
}

// allSince reports whether every caller (of a kind: perCall; or all, when
// onlyPerCall is false) finished a call that began at or after t.
func (c *checker) allSince(t time.Time, onlyPerCall bool) bool {
	for _, cl := range c.callers {
		if (cl.perCall || !onlyPerCall) && !cl.since(t) {
			return false
		}
	}
	return true
}

// devices is every device of an answer's pod as "resource=id", sorted.
func devices(p *v1.PodResources) []string {
	out := []string{}
	for _, ctr := range p.GetContainers() {
		for _, d := range ctr.GetDevices() {
			for _, id := range d.GetDeviceIds() {
				out = append(out, d.GetResourceName()+"="+id)
			}
		}
	}
	sort.Strings(out)
	return out
}

func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }
