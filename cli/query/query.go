// Package query is `podres-proxy query`: a PodResources client that asks
// the proxy's socket, or the kubelet's, and prints the answer as a table or
// as JSON; with --sources each device is labelled with where it and its
// NUMA node came from (package provenance).
package query

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/cli/provenance"
	"github.com/podres-proxy/podres-proxy/internal/cmdline"
	"github.com/podres-proxy/podres-proxy/internal/unixsock"
)

const usage = `usage: podres-proxy query list|get NAMESPACE/NAME|allocatable [--socket PATH] [-o table|json]
           [--sources [--kubelet-socket PATH] [--state-dir DIR]]

Asks a PodResources socket, the proxy's or the kubelet's, and prints the answer.

--sources labels each device with where it came from: "kubelet" when the
kubelet's own socket reports it for that container, else the allocator whose
annotation serve's state store decoded it from (for allocatable: the
inventory source), and the source of its NUMA node, from the inventory serve
keeps in DIR/inventory.json. The table then has one row per device; the json
output is the answer with a "deviceSources" list added.`

// Run is the query command: args are the arguments after "query". It is a
// PodResources client, so operators can compare the proxy's
// answer with the kubelet's (--socket /var/lib/kubelet/pod-resources/kubelet.sock).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("query", stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, usage); fs.PrintDefaults() }
	socket := fs.String("socket", cmdline.DefaultSocket, "PodResources socket to ask (path or unix:// URL)")
	output := cmdline.Output(fs)
	timeout := fs.Duration("timeout", 10*time.Second, "time limit for the call (with --sources, for it and the kubelet's together)")
	sources := fs.Bool("sources", false, "label each device with where it came from (kubelet or the allocator) and where its NUMA node came from")
	kubeletSocket := fs.String("kubelet-socket", cmdline.DefaultKubeletSocket, "with --sources: the kubelet's own PodResources socket, whose answer tells the kubelet's devices apart")
	stateDir := fs.String("state-dir", cmdline.DefaultStateDir, "with --sources: serve's state directory (pod records and inventory.json)")
	if err := cmdline.Parse(fs, args); err != nil {
		return err
	}
	ops := fs.Args()
	stdout, stderr, err := cmdline.Writers(*output, stdout, stderr)
	if err != nil {
		return err
	}
	if len(ops) == 0 {
		return cmdline.Usage(fmt.Errorf("missing operation: list, get NAMESPACE/NAME or allocatable"))
	}
	var call func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error)
	switch op := ops[0]; {
	case op == "list" && len(ops) == 1:
		call = func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error) {
			return c.List(ctx, &v1.ListPodResourcesRequest{})
		}
	case op == "get" && len(ops) == 2:
		ns, name, ok := cmdline.SplitPod(ops[1])
		if !ok {
			return cmdline.Usage(fmt.Errorf("get wants NAMESPACE/NAME, got %q", ops[1]))
		}
		call = func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error) {
			return c.Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: ns, PodName: name})
		}
	case op == "allocatable" && len(ops) == 1:
		call = func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error) {
			return c.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
		}
	default:
		return cmdline.Usage(fmt.Errorf("unknown operation %q (want list, get NAMESPACE/NAME or allocatable)", strings.Join(ops, " ")))
	}

	if _, err := unixsock.Target(*socket); err != nil {
		return cmdline.Usage(err)
	}
	if _, err := unixsock.Target(*kubeletSocket); err != nil {
		return cmdline.Usage(fmt.Errorf("--kubelet-socket: %w", err))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := ask(ctx, *socket, call)
	if err != nil {
		return err
	}
	var origins []provenance.DeviceOrigin
	if *sources {
		origins = gatherEvidence(ctx, *kubeletSocket, *stateDir, call, stderr).Label(resp)
	}
	if *output == "json" {
		b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(resp)
		if err != nil {
			return fmt.Errorf("encode answer: %w", err)
		}
		if *sources {
			if b, err = withOrigins(b, origins); err != nil {
				return err
			}
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	if *sources {
		return printOrigins(stdout, resp, origins)
	}
	return printTable(stdout, resp)
}

// maxMessageSize is the largest answer accepted: the proxy's own bound on
// the kubelet's answers (64 MiB), so that an answer the proxy passes on is
// never too large here.
const maxMessageSize = 64 << 20

// ask makes one call to a PodResources socket.
func ask(ctx context.Context, socket string, call func(context.Context, v1.PodResourcesListerClient) (proto.Message, error)) (proto.Message, error) {
	target, err := unixsock.Target(socket)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageSize)))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", socket, err)
	}
	defer conn.Close()
	resp, err := call(ctx, v1.NewPodResourcesListerClient(conn))
	if err != nil {
		return nil, fmt.Errorf("ask %s: %w", socket, err)
	}
	return resp, nil
}

// gatherEvidence reads what --sources needs: the kubelet's own answer to
// the same question, serve's records and its inventory. Whatever cannot be
// read is noted on stderr and left out; the devices it would have explained
// are labelled unknown, and the answer is still printed.
func gatherEvidence(ctx context.Context, kubeletSocket, stateDir string,
	call func(context.Context, v1.PodResourcesListerClient) (proto.Message, error), stderr io.Writer) *provenance.Evidence {
	p := &provenance.Evidence{}
	var err error
	if p.Kubelet, err = ask(ctx, kubeletSocket, call); err != nil {
		fmt.Fprintf(stderr, "note: --sources: cannot compare with the kubelet's own answer: %v\n", err)
	}
	if p.Records, err = provenance.ReadRecords(stateDir, func(err error) { fmt.Fprintf(stderr, "note: --sources: %v\n", err) }); err != nil {
		fmt.Fprintf(stderr, "note: --sources: no allocators: %v\n", err)
	}
	if published, _, err := provenance.ReadInventory(stateDir); err != nil {
		fmt.Fprintf(stderr, "note: --sources: NUMA sources of added devices unknown: %v\n", err)
	} else {
		p.Inventory = published.Snapshot()
	}
	return p
}

// printTable prints one row per container and resource, like kubectl.
func printTable(out io.Writer, resp proto.Message) error {
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	switch r := resp.(type) {
	case *v1.ListPodResourcesResponse, *v1.GetPodResourcesResponse:
		fmt.Fprintln(w, "NAMESPACE\tPOD\tCONTAINER\tRESOURCE\tDEVICES\tNUMA\tCPUS")
		for _, p := range provenance.Pods(r) {
			podRows(w, p)
		}
	case *v1.AllocatableResourcesResponse:
		fmt.Fprintln(w, "RESOURCE\tDEVICES\tNUMA")
		for _, g := range groupDevices(r.GetDevices()) {
			fmt.Fprintf(w, "%s\t%s\t%s\n", g.resource, strings.Join(g.ids, ","), g.numa)
		}
		if cpus := r.GetCpuIds(); len(cpus) > 0 {
			fmt.Fprintf(w, "cpu\t%s\t\n", ints(cpus))
		}
	}
	return w.Flush()
}

// podLevel is the CONTAINER column of the rows of what the pod itself was
// given (pod-level resources, reported from Kubernetes 1.37): no container
// can have that name.
const podLevel = "<pod>"

// podRows prints a pod's rows: first what the pod itself was given, its
// exclusive CPUs and a row per memory type (RESOURCE "memory" or
// "hugepages-<size>", its size under DEVICES), then one row per container
// and resource.
func podRows(w io.Writer, p *v1.PodResources) {
	podCPUs, memory := ints(p.GetCpuIds()), p.GetMemory()
	if len(p.GetContainers()) == 0 && podCPUs == "" && len(memory) == 0 {
		fmt.Fprintf(w, "%s\t%s\t<none>\t\t\t\t\n", p.GetNamespace(), p.GetName())
	}
	if len(memory) == 0 && podCPUs != "" {
		fmt.Fprintf(w, "%s\t%s\t%s\t<none>\t\t\t%s\n", p.GetNamespace(), p.GetName(), podLevel, podCPUs)
	}
	for i, m := range memory {
		if i > 0 {
			podCPUs = ""
		}
		var numa []int64
		for _, n := range m.GetTopology().GetNodes() {
			numa = append(numa, n.GetID())
		}
		slices.Sort(numa)
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.GetNamespace(), p.GetName(), podLevel, m.GetMemoryType(), size(m.GetSize()), ints(numa), podCPUs)
	}
	for _, c := range p.GetContainers() {
		groups := groupDevices(c.GetDevices())
		cpus := ints(c.GetCpuIds())
		if len(groups) == 0 {
			fmt.Fprintf(w, "%s\t%s\t%s\t<none>\t\t\t%s\n", p.GetNamespace(), p.GetName(), c.GetName(), cpus)
		}
		for i, g := range groups {
			if i > 0 {
				cpus = ""
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.GetNamespace(), p.GetName(), c.GetName(), g.resource, strings.Join(g.ids, ","), g.numa, cpus)
		}
	}
}

type deviceGroup struct {
	resource string
	ids      []string
	numa     string
}

// groupDevices folds the kubelet's one-entry-per-device list into one row
// per resource name.
func groupDevices(devs []*v1.ContainerDevices) []deviceGroup {
	var groups []deviceGroup
	index := map[string]int{}
	numas := map[string]map[int64]bool{}
	for _, d := range devs {
		i, ok := index[d.GetResourceName()]
		if !ok {
			i = len(groups)
			index[d.GetResourceName()] = i
			groups = append(groups, deviceGroup{resource: d.GetResourceName()})
			numas[d.GetResourceName()] = map[int64]bool{}
		}
		for _, id := range d.GetDeviceIds() {
			if !slices.Contains(groups[i].ids, id) {
				groups[i].ids = append(groups[i].ids, id)
			}
		}
		for _, n := range d.GetTopology().GetNodes() {
			numas[d.GetResourceName()][n.GetID()] = true
		}
	}
	for i := range groups {
		var ns []int64
		for n := range numas[groups[i].resource] {
			ns = append(ns, n)
		}
		slices.Sort(ns)
		groups[i].numa = ints(ns)
	}
	slices.SortFunc(groups, func(a, b deviceGroup) int { return strings.Compare(a.resource, b.resource) })
	return groups
}

// size spells a memory size in bytes as Kubernetes quantities do when it is
// a whole number of Ki, Mi, Gi or Ti ("2Gi"), else in bytes.
func size(b uint64) string {
	for _, u := range []struct {
		suffix string
		shift  uint
	}{{"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}} {
		if b != 0 && b%(1<<u.shift) == 0 {
			return strconv.FormatUint(b>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatUint(b, 10)
}

func ints(xs []int64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(s, ",")
}

// printOrigins prints one row per device with its origins.
func printOrigins(out io.Writer, resp proto.Message, origins []provenance.DeviceOrigin) error {
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	if _, ok := resp.(*v1.AllocatableResourcesResponse); ok {
		fmt.Fprintln(w, "RESOURCE\tDEVICE\tNUMA\tSOURCE\tNUMA-SOURCE")
		for _, o := range origins {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", o.Resource, o.DeviceID, orDash(ints(o.NUMA)), o.Source, orDash(o.NUMASource))
		}
		return w.Flush()
	}
	fmt.Fprintln(w, "NAMESPACE\tPOD\tCONTAINER\tRESOURCE\tDEVICE\tNUMA\tSOURCE\tNUMA-SOURCE")
	for _, o := range origins {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", o.Namespace, o.Pod, o.Container, o.Resource, o.DeviceID,
			orDash(ints(o.NUMA)), o.Source, orDash(o.NUMASource))
	}
	return w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// withOrigins adds "deviceSources" to the answer's JSON object. The answer's
// own fields stay exactly as without --sources, so that jq filters written
// for the plain answer keep working.
func withOrigins(answer []byte, origins []provenance.DeviceOrigin) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(answer, &obj); err != nil {
		return nil, fmt.Errorf("encode answer: not a JSON object: %w", err)
	}
	if origins == nil {
		origins = []provenance.DeviceOrigin{}
	}
	b, err := json.Marshal(origins)
	if err != nil {
		return nil, fmt.Errorf("encode device sources: %w", err)
	}
	if obj == nil {
		obj = map[string]json.RawMessage{}
	}
	obj["deviceSources"] = b
	return json.MarshalIndent(obj, "", "  ")
}
