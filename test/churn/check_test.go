package churn

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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

// checker plays the node's polling clients (DCGM exporter and RTE keep a
// connection and List; Multus, Kata and nri-plugins dial for each call
// and Get the pod being created) and checks every answer against what
// the node held while the call was made:
//   - a pod's devices are all of one pod the kubelet listed under that
//     name at some moment of the call (never a predecessor's once the
//     call began after it was gone, never two pods' mixed);
//   - a device is on one pod of an answer, unless pods listed under both
//     names held it at one same moment;
//   - a running pod left alone for quiet before the call, and during it,
//     is in the answer with all its devices.
//
// Unavailable is an allowed answer (counted): the design's answer while
// it cannot tell, and what a killed serve's clients get.
type checker struct {
	n      *node
	seed   uint64
	socket string

	lists, gets, checked, notFound, deadline, wrong atomic.Int64
	// unavailable counts the Unavailable answers of calls made while
	// serve ran, unreachable those of calls that overlapped its kill.
	unavailable, unreachable atomic.Int64
	// outages counts serve's kills and restarts: odd while it is down.
	outages atomic.Int64

	mu    sync.Mutex
	cases []string // the first wrong answers, described
}

const maxCases = 10

// client calls List and Get until ctx ends; odd clients dial per call.
func (c *checker) client(ctx context.Context, i int) {
	rng := rand.New(rand.NewPCG(c.seed, uint64(i)+1))
	var kept *grpc.ClientConn
	defer func() {
		if kept != nil {
			kept.Close()
		}
	}()
	for ctx.Err() == nil {
		conn := kept
		if conn == nil {
			var err error
			conn, err = grpc.NewClient("unix://"+c.socket, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
			if err != nil {
				c.report("dial: %v", err)
				return
			}
			if i%2 == 0 {
				kept = conn
			}
		}
		cl := v1.NewPodResourcesListerClient(conn)
		if name := c.n.target(rng); name != "" && rng.IntN(3) == 0 {
			c.get(ctx, cl, name)
		} else {
			c.list(ctx, cl)
		}
		if conn != kept {
			conn.Close()
		}
	}
}

func (c *checker) list(ctx context.Context, cl v1.PodResourcesListerClient) {
	start, outage := time.Now(), c.outages.Load()
	s := c.n.now()
	owedNow := c.n.quietPods(start, "")
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := cl.List(cctx, &v1.ListPodResourcesRequest{})
	cancel()
	e := c.n.now()
	if !c.answered(ctx, "List", "", err, false, outage) {
		return
	}
	c.lists.Add(1)
	shown := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() == namespace {
			shown[p.GetName()] = deviceIDs(p)
		}
	}
	var problems []string
	byDevice := map[string][]string{}
	for name, ids := range shown {
		problems = append(problems, c.checkPod(name, ids, s, e)...)
		for _, id := range ids {
			byDevice[id] = append(byDevice[id], name)
		}
	}
	for id, names := range byDevice {
		slices.Sort(names)
		for i := 1; i < len(names); i++ {
			if !c.n.shared(id, names[0], names[i], s, e) {
				problems = append(problems, fmt.Sprintf("%s is on %s and %s, whose pods never held it at one moment\n  %s\n  %s",
					id, names[0], names[i], c.n.timeline(names[0]), c.n.timeline(names[i])))
			}
		}
	}
	for name, o := range owedNow {
		problems = append(problems, c.checkOwed(name, o, shown, s, e)...)
	}
	c.verdict("List in "+c.n.span(s, e), problems)
}

func (c *checker) get(ctx context.Context, cl v1.PodResourcesListerClient, name string) {
	start, outage := time.Now(), c.outages.Load()
	s := c.n.now()
	owedNow := c.n.quietPods(start, name)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := cl.Get(cctx, &v1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	cancel()
	e := c.n.now()
	o, quietPod := owedNow[name]
	if !c.answered(ctx, "Get", name, err, quietPod && c.n.stillQuiet(name, o.version), outage) {
		return
	}
	c.gets.Add(1)
	shown := map[string][]string{}
	if err == nil {
		shown[name] = deviceIDs(resp.GetPodResources())
	}
	problems := c.checkPod(name, shown[name], s, e)
	if quietPod {
		problems = append(problems, c.checkOwed(name, o, shown, s, e)...)
	}
	c.verdict("Get "+name+" in "+c.n.span(s, e), problems)
}

// answered sorts out a call's error: whether there is an answer to check.
// A Get's "not found" (the kubelet's own error) is an answer, wrong only
// for a pod it owed.
func (c *checker) answered(ctx context.Context, method, name string, err error, owed bool, outage int64) bool {
	switch {
	case err == nil:
		return true
	case ctx.Err() != nil: // the run ended
		return false
	case status.Code(err) == codes.Unavailable:
		if outage%2 == 1 || c.outages.Load() != outage {
			c.unreachable.Add(1)
		} else {
			c.unavailable.Add(1)
		}
		// A client retries, after a pause: not at once, which would
		// spin while serve is down.
		pause := time.NewTimer(20 * time.Millisecond)
		defer pause.Stop()
		select {
		case <-ctx.Done():
		case <-pause.C:
		}
		return false
	case status.Code(err) == codes.DeadlineExceeded:
		c.deadline.Add(1)
		return false
	case method == "Get" && status.Code(err) == codes.Unknown && strings.HasSuffix(status.Convert(err).Message(), "not found"):
		c.notFound.Add(1)
		if owed {
			c.verdict("Get "+name, []string{fmt.Sprintf("%s: %v, for a running pod left alone\n  %s", name, err, c.n.timeline(name))})
		}
		return false
	}
	c.verdict(method+" "+name, []string{fmt.Sprintf("unexpected error: %v", err)})
	return false
}

// checkPod checks the devices an answer gives name.
func (c *checker) checkPod(name string, ids []string, s, e uint64) []string {
	if len(ids) == 0 {
		return nil
	}
	if _, ok := c.n.heldBy(name, ids, s, e); ok {
		return nil
	}
	return []string{fmt.Sprintf("%s shows %v, not the devices of one pod the kubelet listed under it in states %d..%d\n  %s",
		name, ids, s, e, c.n.timeline(name))}
}

// checkOwed checks that a pod left alone is answered with its devices.
func (c *checker) checkOwed(name string, o owed, shown map[string][]string, s, e uint64) []string {
	if !c.n.stillQuiet(name, o.version) {
		return nil
	}
	ids, ok := shown[name]
	switch {
	case !ok:
		return []string{fmt.Sprintf("%s is missing, running and left alone for %v\n  %s", name, quiet, c.n.timeline(name))}
	case !containsAll(ids, o.devices):
		return []string{fmt.Sprintf("%s shows %v, not its %v, running and left alone for %v\n  %s", name, ids, o.devices, quiet, c.n.timeline(name))}
	}
	return nil
}

// verdict counts a checked answer and keeps what was wrong with it.
func (c *checker) verdict(call string, problems []string) {
	c.checked.Add(1)
	if len(problems) == 0 {
		return
	}
	c.wrong.Add(1)
	c.report("%s (seed %d):\n%s", call, c.seed, strings.Join(problems, "\n"))
}

func (c *checker) report(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cases) < maxCases {
		c.cases = append(c.cases, fmt.Sprintf(format, args...))
	}
}

// summary is the counts the run ends with.
func (c *checker) summary() string {
	return fmt.Sprintf("%d answers checked (%d Lists, %d Gets), %d wrong; %d Unavailable while serve ran, %d while it was killed and restarting; %d Gets not found, %d past their deadline",
		c.checked.Load(), c.lists.Load(), c.gets.Load(), c.wrong.Load(), c.unavailable.Load(), c.unreachable.Load(), c.notFound.Load(), c.deadline.Load())
}

func (c *checker) failures() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cases) == 0 {
		return nil
	}
	return errors.New(strings.Join(c.cases, "\n\n"))
}

// deviceIDs is every device id an answer gives a pod, all containers.
func deviceIDs(p *v1.PodResources) []string {
	var ids []string
	for _, ctr := range p.GetContainers() {
		for _, d := range ctr.GetDevices() {
			ids = append(ids, d.GetDeviceIds()...)
		}
	}
	return ids
}
