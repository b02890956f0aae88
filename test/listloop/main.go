// Command listloop is the consumer pod of the cluster suite's rolling
// update: a monitoring agent (DCGM exporter, resource-topology-exporter)
// that calls v1 List on the PodResources socket every interval, on a new
// connection each time with a 10 s deadline, as those agents do. Each call
// prints one JSON line on stdout: when it was made, the gRPC code, the
// error if any, and, for every pod of one namespace in the answer, the
// device ids it holds of one resource. The suite reads the lines back from
// the pod's log and judges them.
//
// Usage: listloop --socket PATH --namespace NS --resource NAME [--interval 100ms]
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Record is one call's line.
type Record struct {
	At    time.Time           `json:"at"`
	Code  string              `json:"code"`
	Error string              `json:"error,omitempty"`
	Pods  map[string][]string `json:"pods,omitempty"`
}

func list(socket, namespace, resource string) Record {
	r := Record{At: time.Now()}
	resp, err := call(socket)
	r.Code = status.Code(err).String()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Pods = Devices(resp, namespace, resource)
	return r
}

// Devices maps each pod of namespace in the answer to its sorted device
// ids of resource (an empty list for a pod without any).
func Devices(resp *podresourcesv1.ListPodResourcesResponse, namespace, resource string) map[string][]string {
	out := map[string][]string{}
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() != namespace {
			continue
		}
		ids := out[p.GetName()]
		if ids == nil {
			ids = []string{}
		}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
		slices.Sort(ids)
		out[p.GetName()] = ids
	}
	return out
}

func call(socket string) (*podresourcesv1.ListPodResourcesResponse, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
}

func main() {
	socket := pflag.String("socket", "/var/run/podres-proxy/pod-resources/kubelet.sock", "the PodResources socket")
	namespace := pflag.String("namespace", "", "the namespace whose pods are printed")
	resource := pflag.String("resource", "", "the resource whose device ids are printed")
	interval := pflag.Duration("interval", 100*time.Millisecond, "time between the starts of two calls")
	pflag.Parse()
	enc := json.NewEncoder(os.Stdout)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for ; ; <-tick.C {
		if err := enc.Encode(list(*socket, *namespace, *resource)); err != nil {
			fmt.Fprintln(os.Stderr, "listloop:", err)
			os.Exit(1)
		}
	}
}
