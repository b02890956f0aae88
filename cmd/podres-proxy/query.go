package main

import (
	"context"
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

	"github.com/podres-proxy/podres-proxy/proxy"
)

const queryUsage = `usage: podres-proxy query list|get NAMESPACE/NAME|allocatable [--socket PATH] [-o table|json]

Asks a PodResources socket, the proxy's or the kubelet's, and prints the answer.`

// runQuery is a PodResources client, so operators can compare the proxy's
// answer with the kubelet's (--socket /var/lib/kubelet/pod-resources/kubelet.sock).
func runQuery(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("query", stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, queryUsage); fs.PrintDefaults() }
	socket := fs.String("socket", defaultSocket, "PodResources socket to ask (path or unix:// URL)")
	output := fs.String("o", "table", "output format: table or json")
	timeout := fs.Duration("timeout", 10*time.Second, "time limit for the call")
	ops, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*output); err != nil {
		return err
	}
	if len(ops) == 0 {
		return usageError{fmt.Errorf("missing operation: list, get NAMESPACE/NAME or allocatable")}
	}
	var call func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error)
	switch op := ops[0]; {
	case op == "list" && len(ops) == 1:
		call = func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error) {
			return c.List(ctx, &v1.ListPodResourcesRequest{})
		}
	case op == "get" && len(ops) == 2:
		ns, name, ok := strings.Cut(ops[1], "/")
		if !ok || ns == "" || name == "" {
			return usageError{fmt.Errorf("get wants NAMESPACE/NAME, got %q", ops[1])}
		}
		call = func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error) {
			return c.Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: ns, PodName: name})
		}
	case op == "allocatable" && len(ops) == 1:
		call = func(ctx context.Context, c v1.PodResourcesListerClient) (proto.Message, error) {
			return c.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
		}
	default:
		return usageError{fmt.Errorf("unknown operation %q (want list, get NAMESPACE/NAME or allocatable)", strings.Join(ops, " "))}
	}

	target, err := proxy.SocketTarget(*socket)
	if err != nil {
		return usageError{err}
	}
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(proxy.DefaultMaxMessageSize)))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := call(ctx, v1.NewPodResourcesListerClient(conn))
	if err != nil {
		return fmt.Errorf("ask %s: %w", *socket, err)
	}
	if *output == "json" {
		b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(resp)
		if err != nil {
			return fmt.Errorf("encode answer: %w", err)
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	return printTable(stdout, resp)
}

// printTable prints one row per container and resource, like kubectl.
func printTable(out io.Writer, resp proto.Message) error {
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	switch r := resp.(type) {
	case *v1.ListPodResourcesResponse:
		pods := slices.Clone(r.GetPodResources())
		slices.SortFunc(pods, func(a, b *v1.PodResources) int {
			return strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
		})
		fmt.Fprintln(w, "NAMESPACE\tPOD\tCONTAINER\tRESOURCE\tDEVICES\tNUMA\tCPUS")
		for _, p := range pods {
			podRows(w, p)
		}
	case *v1.GetPodResourcesResponse:
		fmt.Fprintln(w, "NAMESPACE\tPOD\tCONTAINER\tRESOURCE\tDEVICES\tNUMA\tCPUS")
		podRows(w, r.GetPodResources())
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

func podRows(w io.Writer, p *v1.PodResources) {
	if len(p.GetContainers()) == 0 {
		fmt.Fprintf(w, "%s\t%s\t<none>\t\t\t\t\n", p.GetNamespace(), p.GetName())
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

func ints(xs []int64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatInt(x, 10)
	}
	return strings.Join(s, ",")
}
