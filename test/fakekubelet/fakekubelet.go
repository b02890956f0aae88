// Package fakekubelet is a stand-in kubelet for tests: it serves the real
// k8s.io/kubelet PodResources gRPC services (v1 and v1alpha1) on a unix
// socket and /pods over HTTPS with a bearer-token check, both computed from
// one list of corev1.Pods the way the kubelet computes them (sidecars before
// app containers, plain init containers never listed, terminal pods left out
// of v1 List and Get, the kubelet's exact not-found error). Like the
// kubelet, List names pods in a new order on every call, and a container's
// devices too: the kubelet builds List from its pod manager's map of pods
// (pkg/kubelet/pod/pod_manager.go, podsMapToPods) and each container's
// devices from the device manager's maps, so no client (and no test) may
// depend on an order. SetFixedOrder turns that off where a test needs one.
// Tests inject the faults a real kubelet cannot produce on demand: a restart
// of its socket, /pods going down, slow answers, a List held in flight.
package fakekubelet

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubelet/pkg/apis/podresources/v1alpha1"

	"github.com/podres-proxy/podres-proxy/test/tlstest"
)

// Pod is a pod as the fake kubelet knows it: the API object /pods returns,
// plus the devices the kubelet's own device manager assigned, by container.
type Pod struct {
	corev1.Pod
	Devices map[string][]*v1.ContainerDevices
	CPUs    map[string][]int64
	// DynamicResources are the DRA claims' devices the kubelet lists
	// under each container.
	DynamicResources map[string][]*v1.DynamicResource
	// PodCPUs and PodMemory are what the kubelet reports for the pod
	// itself (PodResources cpu_ids and memory, from Kubernetes 1.37): the
	// exclusive CPUs and memory of a pod with pod-level resources.
	PodCPUs   []int64
	PodMemory []*v1.ContainerMemory

	realistic bool
}

// Kubelet is the fake. Create it with Start.
type Kubelet struct {
	// Socket is the PodResources socket; PodsURL the HTTPS /pods URL;
	// TokenFile holds the accepted bearer token; CAFile the serving cert.
	Socket    string
	PodsURL   string
	TokenFile string
	CAFile    string
	Token     string
	// PodLogsDir is the kubelet's podLogsDir: as the real kubelet makes a
	// pod's log directory just before it asks the runtime for the pod's
	// sandbox, SetPods and AddPod make the directory of every running pod
	// (package podlogs reads it).
	PodLogsDir string

	t           testing.TB
	mu          sync.Mutex
	pods        []Pod
	allocatable *v1.AllocatableResourcesResponse
	podsDown    bool
	unknown     bool
	podsGate    chan struct{} // when set, /pods waits for it to close
	grpcGate    chan struct{}
	onGRPC      func(method string)
	grpcErr     error
	fixedOrder  bool
	// prebuilt: List answers from built, pods[i]'s answer built[i], built
	// once (nil, or past built's end, until the next List after pods[i]
	// changes); SetPrebuiltList.
	prebuilt bool
	built    []*v1.PodResources
	grpcSrv  *grpc.Server
	grpcDone chan struct{}

	podsReads atomic.Int64
	grpcCalls atomic.Int64
	https     *httptest.Server
}

// Start serves a fake kubelet in dir (a short path: unix sockets are limited
// to 108 bytes) until the test ends.
func Start(t testing.TB, dir string) *Kubelet {
	t.Helper()
	k := &Kubelet{
		t:          t,
		Socket:     filepath.Join(dir, "pod-resources", "kubelet.sock"),
		TokenFile:  filepath.Join(dir, "token"),
		CAFile:     filepath.Join(dir, "kubelet-ca.crt"),
		Token:      "test-token",
		PodLogsDir: filepath.Join(dir, "pod-logs"),
	}
	if err := os.MkdirAll(k.PodLogsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(k.TokenFile, []byte(k.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k.https = httptest.NewTLSServer(http.HandlerFunc(k.servePods))
	tlstest.ServerCA(t, k.CAFile, k.https)
	k.PodsURL = k.https.URL + "/pods"
	if err := k.StartGRPC(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		k.StopGRPC()
		k.https.Close()
	})
	return k
}

// TLSConfig trusts the fake's serving certificate.
func (k *Kubelet) TLSConfig() *tls.Config {
	return k.https.Client().Transport.(*http.Transport).TLSClientConfig
}

// SetPods replaces the pods.
func (k *Kubelet) SetPods(pods ...Pod) {
	for i := range pods {
		k.sandboxBegun(&pods[i])
	}
	k.mu.Lock()
	k.pods = append([]Pod(nil), pods...)
	k.built = nil
	k.mu.Unlock()
}

// BeginSandbox makes a pod's log directory, as the kubelet does just before
// it asks the runtime for the pod's sandbox (and before CNI ADD).
func (k *Kubelet) BeginSandbox(namespace, name, uid string) {
	if err := os.MkdirAll(filepath.Join(k.PodLogsDir, namespace+"_"+name+"_"+uid), 0o755); err != nil {
		k.t.Errorf("fakekubelet: %v", err)
	}
}

// sandboxBegun makes the log directory of a running pod, whose sandbox the
// kubelet began before it ran.
func (k *Kubelet) sandboxBegun(p *Pod) {
	if p.Status.Phase == corev1.PodRunning {
		k.BeginSandbox(p.Namespace, p.Name, string(p.UID))
	}
}

// AddPod adds or replaces (by UID) a pod.
func (k *Kubelet) AddPod(p Pod) {
	k.sandboxBegun(&p)
	k.mu.Lock()
	defer k.mu.Unlock()
	for i := range k.pods {
		if k.pods[i].UID == p.UID {
			k.pods[i] = p
			if i < len(k.built) {
				k.built[i] = nil
			}
			return
		}
	}
	k.pods = append(k.pods, p)
}

// RemovePod removes the pods of a name.
func (k *Kubelet) RemovePod(namespace, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.built = nil
	out := k.pods[:0]
	for _, p := range k.pods {
		if p.Namespace != namespace || p.Name != name {
			out = append(out, p)
		}
	}
	k.pods = out
}

// SetAllocatable sets the GetAllocatableResources answer.
func (k *Kubelet) SetAllocatable(r *v1.AllocatableResourcesResponse) {
	k.mu.Lock()
	k.allocatable = r
	k.mu.Unlock()
}

// SetPodsDown makes /pods answer 503 (true) or work again (false).
func (k *Kubelet) SetPodsDown(down bool) {
	k.mu.Lock()
	k.podsDown = down
	k.mu.Unlock()
}

// SetUnknownFields makes v1 answers carry a field (number 99) this build of
// the API does not know, as a newer kubelet's would.
func (k *Kubelet) SetUnknownFields(on bool) {
	k.mu.Lock()
	k.unknown = on
	k.built = nil
	k.mu.Unlock()
}

// UnknownField is the raw field SetUnknownFields adds.
var UnknownField = protowire.AppendBytes(protowire.AppendTag(nil, 99, protowire.BytesType), []byte("from-the-future"))

// HoldPods makes /pods reads wait until the returned func is called.
func (k *Kubelet) HoldPods() (release func()) {
	gate := make(chan struct{})
	k.mu.Lock()
	k.podsGate = gate
	k.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			if k.podsGate == gate {
				k.podsGate = nil
			}
			k.mu.Unlock()
			close(gate)
		})
	}
}

// SetFixedOrder makes List name pods in the order they were set and
// devices in the order they were given (true), or in a new random order on
// every call as the kubelet does (false, the default).
func (k *Kubelet) SetFixedOrder(fixed bool) {
	k.mu.Lock()
	k.fixedOrder = fixed
	k.mu.Unlock()
}

// SetPrebuiltList makes v1 List answer as listbench's fake
// kubelet does (true): from each pod's answer built once, until the pod
// changes, only the pods' order new on every call. The real kubelet builds
// every answer anew, and so does this fake by default; a kubelet that
// answers cheaper makes the same proxy's cost a larger part of every List
// through it, so that the benchmark report compares with listbench only
// with listbench's kubelet (docs/performance.md).
func (k *Kubelet) SetPrebuiltList(on bool) {
	k.mu.Lock()
	k.prebuilt = on
	k.built = nil
	k.mu.Unlock()
}

// OnGRPC calls f with the method name ("List", "Get",
// "GetAllocatableResources", "v1alpha1.List") each time a PodResources call
// reaches the fake, after its answer is computed and before HoldGRPC's gate:
// tests await it to know a call is in flight. f must not block; nil removes it.
func (k *Kubelet) OnGRPC(f func(method string)) {
	k.mu.Lock()
	k.onGRPC = f
	k.mu.Unlock()
}

// SetGRPCError makes every PodResources call that arrives from now on
// answer err (a status error keeps its code and message); nil ends it.
func (k *Kubelet) SetGRPCError(err error) {
	k.mu.Lock()
	k.grpcErr = err
	k.mu.Unlock()
}

// HoldGRPC makes PodResources calls wait until the returned func is called.
// A held call answers what the kubelet knew when the call arrived, however
// long it then waits, as a List that was slow to arrive would.
func (k *Kubelet) HoldGRPC() (release func()) {
	gate := make(chan struct{})
	k.mu.Lock()
	k.grpcGate = gate
	k.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			k.mu.Lock()
			if k.grpcGate == gate {
				k.grpcGate = nil
			}
			k.mu.Unlock()
			close(gate)
		})
	}
}

// PodsReads is how many /pods requests were answered or attempted.
func (k *Kubelet) PodsReads() int64 { return k.podsReads.Load() }

// GRPCCalls is how many PodResources calls reached the fake.
func (k *Kubelet) GRPCCalls() int64 { return k.grpcCalls.Load() }

// StopGRPC stops the PodResources server and removes its socket, as a
// kubelet that stopped does.
func (k *Kubelet) StopGRPC() {
	k.mu.Lock()
	srv, done := k.grpcSrv, k.grpcDone
	k.grpcSrv = nil
	k.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Stop()
	<-done
	os.Remove(k.Socket)
}

// StartGRPC (re)starts the PodResources server, replacing the socket file
// with a new one as a restarted kubelet does.
func (k *Kubelet) StartGRPC() error {
	if err := os.MkdirAll(filepath.Dir(k.Socket), 0o750); err != nil {
		return err
	}
	os.Remove(k.Socket)
	l, err := net.Listen("unix", k.Socket)
	if err != nil {
		return fmt.Errorf("fake kubelet listen: %w", err)
	}
	srv := grpc.NewServer()
	v1.RegisterPodResourcesListerServer(srv, &v1Server{k: k})
	v1alpha1.RegisterPodResourcesListerServer(srv, &v1alpha1Server{k: k})
	done := make(chan struct{})
	k.mu.Lock()
	k.grpcSrv, k.grpcDone = srv, done
	k.mu.Unlock()
	go func() { defer close(done); _ = srv.Serve(l) }()
	return nil
}

func (k *Kubelet) servePods(w http.ResponseWriter, r *http.Request) {
	k.podsReads.Add(1)
	if r.Header.Get("Authorization") != "Bearer "+k.Token {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	k.mu.Lock()
	gate, down := k.podsGate, k.podsDown
	k.mu.Unlock()
	// The answer is what the kubelet knew when the read started, however
	// long it then takes to arrive.
	body := k.PodListJSON()
	if gate != nil {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	if down {
		http.Error(w, "kubelet is restarting", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// PodListJSON is what /pods returns now: every pod, terminal ones included,
// encoded as the kubelet encodes a v1 PodList.
func (k *Kubelet) PodListJSON() []byte {
	k.mu.Lock()
	list := corev1.PodList{TypeMeta: metaPodList}
	for _, p := range k.pods {
		pod := p.Pod
		pod.TypeMeta = metaPod
		list.Items = append(list.Items, pod)
	}
	k.mu.Unlock()
	b, err := json.Marshal(list)
	if err != nil {
		panic(err) // a corev1.PodList always marshals
	}
	return b
}

// enterGRPC is called once a call's answer is computed: it counts the
// call, tells OnGRPC's hook, waits at HoldGRPC's gate, and returns the error
// SetGRPCError set when the call arrived.
func (k *Kubelet) enterGRPC(ctx context.Context, method string) error {
	k.grpcCalls.Add(1)
	k.mu.Lock()
	gate, hook, fail := k.grpcGate, k.onGRPC, k.grpcErr
	k.mu.Unlock()
	if hook != nil {
		hook(method)
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fail
}
