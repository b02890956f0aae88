package fakekubelet

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// A prebuilt List (the benchmark report's listbench setup) must still show
// every change of the pods at the next call, or the report's "1 pod
// changed" series would measure a steady List; and it must name the pods
// in a new order, as the kubelet does.
func TestPrebuiltListShowsEveryChangeAndANewOrder(t *testing.T) {
	k := Start(t, t.TempDir())
	k.SetPrebuiltList(true)
	var pods []Pod
	for i := range 8 {
		pods = append(pods, NewPod("ns", fmt.Sprintf("p%d", i), fmt.Sprintf("uid-%d", i), WithContainer("app", nil)))
	}
	k.SetPods(pods...)

	conn, err := grpc.NewClient("unix://"+k.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := v1.NewPodResourcesListerClient(conn)
	list := func() []*v1.PodResources {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := c.List(ctx, &v1.ListPodResourcesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.PodResources
	}
	names := func(ps []*v1.PodResources) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return out
	}

	first := names(list())
	orders := 1
	for range 20 {
		if got := names(list()); !slices.Equal(got, first) {
			orders++
			break
		}
	}
	if orders == 1 {
		t.Errorf("21 Lists named 8 pods in the same order %v; the kubelet names them in map order", first)
	}

	changed := pods[3]
	changed.CPUs = map[string][]int64{"app": {7}}
	k.AddPod(changed)
	found := false
	for _, p := range list() {
		if p.Name == "p3" {
			found = true
			if got := p.Containers[0].CpuIds; !slices.Equal(got, []int64{7}) {
				t.Errorf("after AddPod, p3's app has cpu_ids %v, want [7]", got)
			}
		}
	}
	if !found {
		t.Error("p3 is not listed after AddPod replaced it")
	}

	k.AddPod(NewPod("ns", "p8", "uid-8", WithContainer("app", nil)))
	if got := names(list()); len(got) != 9 || !slices.Contains(got, "p8") {
		t.Errorf("after AddPod(p8), List names %v", got)
	}

	k.RemovePod("ns", "p5")
	if got := names(list()); len(got) != 8 || slices.Contains(got, "p5") {
		t.Errorf("after RemovePod(p5), List names %v", got)
	}
}
