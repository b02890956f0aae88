// Package critest is a fake CRI runtime for tests: it serves
// ListPodSandbox and ListContainers on a unix socket from data the test
// sets, and builds the pods and containers such a runtime lists.
package critest

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	criv1 "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime serves ListPodSandbox and ListContainers from test data.
type Runtime struct {
	criv1.UnimplementedRuntimeServiceServer

	mu   sync.Mutex
	pods []*criv1.PodSandbox
	ctrs []*criv1.Container
}

// Set replaces what the runtime lists.
func (f *Runtime) Set(pods []*criv1.PodSandbox, ctrs []*criv1.Container) {
	f.mu.Lock()
	f.pods, f.ctrs = pods, ctrs
	f.mu.Unlock()
}

// ListPodSandbox implements criv1.RuntimeServiceServer.
func (f *Runtime) ListPodSandbox(context.Context, *criv1.ListPodSandboxRequest) (*criv1.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &criv1.ListPodSandboxResponse{Items: f.pods}, nil
}

// ListContainers implements criv1.RuntimeServiceServer.
func (f *Runtime) ListContainers(context.Context, *criv1.ListContainersRequest) (*criv1.ListContainersResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &criv1.ListContainersResponse{Containers: f.ctrs}, nil
}

// Serve serves f on a unix socket at path until the returned stop is
// called or the test ends; stop removes the socket.
func Serve(t testing.TB, path string, f *Runtime) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	criv1.RegisterRuntimeServiceServer(srv, f)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(l)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Stop()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

// Pod is a Kubernetes pod's sandbox called name, in namespace default,
// with an annotation example.com/gpu and an unrelated one.
func Pod(name string, st criv1.PodSandboxState) *criv1.PodSandbox {
	return &criv1.PodSandbox{
		Id:          "sb-" + name,
		Metadata:    &criv1.PodSandboxMetadata{Name: name, Uid: "uid-" + name, Namespace: "default"},
		State:       st,
		Annotations: map[string]string{"example.com/gpu": "GPU-" + name, "unrelated": "x"},
	}
}

// Ctr is a container called name of pod.
func Ctr(pod *criv1.PodSandbox, name string, st criv1.ContainerState) *criv1.Container {
	return &criv1.Container{
		Id:           pod.Id + "-" + name,
		PodSandboxId: pod.Id,
		Metadata:     &criv1.ContainerMetadata{Name: name},
		State:        st,
	}
}
