package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresourcesv1alpha1 "k8s.io/kubelet/pkg/apis/podresources/v1alpha1"
)

// Clients of the PodResources API, as the real consumers configure theirs.
var (
	// multus: 10 s, 16 MiB (pkg/kubeletclient).
	multus = clientOptions{timeout: 10 * time.Second, maxRecv: 16 << 20}
	// dcgm: 10 s, gRPC's default 4 MiB limit.
	dcgm = clientOptions{timeout: 10 * time.Second}
	// watcher: the restart test's client, which calls often.
	watcher = clientOptions{timeout: 2 * time.Second, maxRecv: 16 << 20}
)

type clientOptions struct {
	timeout time.Duration
	maxRecv int // 0: gRPC's default
}

// dial connects to a PodResources socket; each call gets a fresh
// connection, as Multus and DCGM exporter make one per List.
func dial(socket string, o clientOptions) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if o.maxRecv > 0 {
		opts = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.maxRecv)))
	}
	conn, err := grpc.NewClient("unix://"+socket, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", socket, err)
	}
	return conn, nil
}

// call runs one RPC on a fresh connection to socket. The kubelet (and the
// proxy, with the kubelet's numbers) limits the whole socket to 100 calls
// a second with a burst of 10, and each proxied call also spends one of the
// kubelet's: a call rejected by the rate limit is retried, up to 2 s.
func call[T any](socket string, o clientOptions, rpc func(context.Context, podresourcesv1.PodResourcesListerClient) (T, error)) (T, error) {
	var zero T
	conn, err := dial(socket, o)
	if err != nil {
		return zero, err
	}
	defer conn.Close()
	client := podresourcesv1.NewPodResourcesListerClient(conn)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		resp, err := rpc(ctx, client)
		cancel()
		if status.Code(err) != codes.ResourceExhausted || attempt == 20 {
			return resp, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// list calls v1 List on socket.
func list(socket string, o clientOptions) (*podresourcesv1.ListPodResourcesResponse, error) {
	return call(socket, o, func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) (*podresourcesv1.ListPodResourcesResponse, error) {
		return c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	})
}

// get calls v1 Get on socket.
func get(socket, namespace, name string) (*podresourcesv1.GetPodResourcesResponse, error) {
	return call(socket, multus, func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) (*podresourcesv1.GetPodResourcesResponse, error) {
		return c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
	})
}

// allocatable calls v1 GetAllocatableResources on socket.
func allocatable(socket string) (*podresourcesv1.AllocatableResourcesResponse, error) {
	return call(socket, multus, func(ctx context.Context, c podresourcesv1.PodResourcesListerClient) (*podresourcesv1.AllocatableResourcesResponse, error) {
		return c.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	})
}

// listV1alpha1 calls v1alpha1 List on socket, as DCGM exporter up to 4.1.x
// and Antrea do.
func listV1alpha1(socket string, o clientOptions) (*podresourcesv1alpha1.ListPodResourcesResponse, error) {
	conn, err := dial(socket, o)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := podresourcesv1alpha1.NewPodResourcesListerClient(conn)
	var resp *podresourcesv1alpha1.ListPodResourcesResponse
	// Retried while the rate limit refuses it, as call does: the suite is
	// one client asking many times in a row.
	err = limited(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
		defer cancel()
		var err error
		resp, err = client.List(ctx, &podresourcesv1alpha1.ListPodResourcesRequest{})
		return err
	})
	return resp, err
}

// gpuOwner is the pod and container DCGM exporter labels a GPU's metrics
// with.
type gpuOwner struct{ namespace, pod, container string }

// dcgmDeviceToPod is DCGM exporter's mapping from device id to owner, when
// it is started with --nvidia-resource-names (extra): it calls v1 List with
// gRPC's default limits and keeps the devices of nvidia.com/gpu,
// nvidia.com/mig-* and the extra resource names, last one wins.
// test/clients.DCGMDeviceToPod is the same without the flag.
func dcgmDeviceToPod(socket string, extra ...string) (map[string]gpuOwner, error) {
	resp, err := list(socket, dcgm)
	if err != nil {
		return nil, err
	}
	out := map[string]gpuOwner{}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				r := d.GetResourceName()
				if r != gpuResource && !slices.Contains(extra, r) && !strings.HasPrefix(r, "nvidia.com/mig-") {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					out[id] = gpuOwner{p.GetNamespace(), p.GetName(), c.GetName()}
				}
			}
		}
	}
	return out, nil
}

// listOnce calls v1 List once, without retrying: the restart watcher's
// call, which records every outcome.
func listOnce(socket string, o clientOptions) (*podresourcesv1.ListPodResourcesResponse, error) {
	conn, err := dial(socket, o)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	return podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
}

// findPod returns the pod's entry in a List answer, or nil.
func findPod(resp *podresourcesv1.ListPodResourcesResponse, namespace, name string) *podresourcesv1.PodResources {
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() == namespace && p.GetName() == name {
			return p
		}
	}
	return nil
}

// devicesOf returns a pod's devices per container and resource, ids sorted;
// containers without devices are left out.
func devicesOf(p *podresourcesv1.PodResources) devices {
	d := devices{}
	for _, c := range p.GetContainers() {
		for _, dev := range c.GetDevices() {
			if d[c.GetName()] == nil {
				d[c.GetName()] = map[string][]string{}
			}
			d[c.GetName()][dev.GetResourceName()] = append(d[c.GetName()][dev.GetResourceName()], dev.GetDeviceIds()...)
		}
	}
	for _, byRes := range d {
		for _, ids := range byRes {
			sort.Strings(ids)
		}
	}
	return d
}

// containerNames lists a PodResources entry's containers in answer order.
func containerNames(p *podresourcesv1.PodResources) []string {
	var names []string
	for _, c := range p.GetContainers() {
		names = append(names, c.GetName())
	}
	return names
}

// with returns the union of d and extra (extra's ids appended, sorted).
func (d devices) with(extra devices) devices {
	out := devices{}
	for _, src := range []devices{d, extra} {
		for c, byRes := range src {
			if out[c] == nil {
				out[c] = map[string][]string{}
			}
			for r, ids := range byRes {
				out[c][r] = append(out[c][r], ids...)
				sort.Strings(out[c][r])
			}
		}
	}
	return out
}

// equal compares two device maps.
func (d devices) equal(o devices) bool {
	if len(d) != len(o) {
		return false
	}
	for c, byRes := range d {
		if len(byRes) != len(o[c]) {
			return false
		}
		for r, ids := range byRes {
			if !slices.Equal(ids, o[c][r]) {
				return false
			}
		}
	}
	return true
}

func (d devices) String() string {
	b, _ := json.Marshal(map[string]map[string][]string(d))
	return string(b)
}

// kubeletPods reads the kubelet's /pods on its read-only port.
func kubeletPods() (*corev1.PodList, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://127.0.0.1:" + h.env["KUBELET_READONLY_PORT"] + "/pods")
	if err != nil {
		return nil, fmt.Errorf("read the kubelet's /pods: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read the kubelet's /pods: %s", resp.Status)
	}
	var list corev1.PodList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("decode the kubelet's /pods: %w", err)
	}
	return &list, nil
}

func findKubeletPod(list *corev1.PodList, namespace, name string) *corev1.Pod {
	for i := range list.Items {
		if list.Items[i].Namespace == namespace && list.Items[i].Name == name {
			return &list.Items[i]
		}
	}
	return nil
}

// storeRecord is the part of `podres-proxy inspect -o json` the suite
// checks: the documented fields of the store's records.
type storeRecord struct {
	UID        string `json:"uid"`
	Namespace  string `json:"namespace"`
	Name       string `json:"name"`
	SandboxID  string `json:"sandboxID"`
	State      string `json:"state"`
	Containers []struct {
		Name  string `json:"name"`
		ID    string `json:"id"`
		State string `json:"state"`
	} `json:"containers"`
	Devices []struct {
		Resource string   `json:"resource"`
		IDs      []string `json:"ids"`
	} `json:"devices"`
	Refused []struct {
		Resource string   `json:"resource"`
		IDs      []string `json:"ids"`
		Reason   string   `json:"reason"`
		Class    string   `json:"class"`
	} `json:"refused"`
	Sources struct {
		Sandbox *struct {
			Source string    `json:"source"`
			At     time.Time `json:"at"`
		} `json:"sandbox"`
	} `json:"sources"`
}

// deviceIDs returns the record's device ids of one resource, sorted.
func (r storeRecord) deviceIDs(resource string) []string {
	var ids []string
	for _, d := range r.Devices {
		if d.Resource == resource {
			ids = append(ids, d.IDs...)
		}
	}
	sort.Strings(ids)
	return ids
}

// inspect runs `podres-proxy inspect -o json` on the store.
func inspect() ([]storeRecord, error) {
	cmd := exec.Command(h.proxyBin, "inspect", "--state-dir", h.stateDir, "-o", "json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("podres-proxy inspect: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var recs []storeRecord
	if err := json.Unmarshal(out, &recs); err != nil {
		return nil, fmt.Errorf("decode podres-proxy inspect -o json: %w", err)
	}
	return recs, nil
}

// findRecord returns the store's records of a pod (by namespace and name).
func findRecords(recs []storeRecord, namespace, name string) []storeRecord {
	var out []storeRecord
	for _, r := range recs {
		if r.Namespace == namespace && r.Name == name {
			out = append(out, r)
		}
	}
	return out
}

// probeRecord is one line of the CNI probe's record file.
type probeRecord struct {
	Time          time.Time `json:"time"`
	Command       string    `json:"command"`
	ContainerID   string    `json:"containerID"`
	Namespace     string    `json:"namespace"`
	Name          string    `json:"name"`
	PodFound      bool      `json:"podFound"`
	DeviceIDs     []string  `json:"deviceIDs"`
	SandboxListed bool      `json:"sandboxListed"`
	SandboxState  string    `json:"sandboxState"`
	Error         string    `json:"error"`
	ListMillis    int64     `json:"listMillis"`
	// DeviceInfo is the device-info file the probe read, as Multus copies
	// it into network-status; DeviceInfoError why it could not.
	DeviceInfo      json.RawMessage `json:"deviceInfo"`
	DeviceInfoError string          `json:"deviceInfoError"`
}

// probeRecords reads the CNI probe's records.
func probeRecords() ([]probeRecord, error) {
	f, err := os.Open(h.probeRecords)
	if err != nil {
		return nil, fmt.Errorf("read the CNI probe's records: %w", err)
	}
	defer f.Close()
	var recs []probeRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r probeRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("decode CNI probe record %q: %w", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs, sc.Err()
}

// listWatch calls List in a loop, as a monitoring agent would, and keeps
// every outcome.
type listWatch struct {
	socket string
	check  func(*podresourcesv1.ListPodResourcesResponse) string
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	results []listResult
}

type listResult struct {
	at    time.Time
	err   error
	wrong string // why a successful answer was wrong, "" when right
}

// startListWatch calls List on socket every 100 ms until stopped; check
// says what is wrong with an answer ("" when nothing is).
func startListWatch(socket string, check func(*podresourcesv1.ListPodResourcesResponse) string) *listWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &listWatch{socket: socket, check: check, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			resp, err := listOnce(socket, watcher)
			r := listResult{at: time.Now(), err: err}
			if err == nil {
				r.wrong = check(resp)
			}
			w.mu.Lock()
			w.results = append(w.results, r)
			w.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// stop ends the loop and waits for it.
func (w *listWatch) stop() {
	w.cancel()
	<-w.done
}

// firstRightAfter returns when the first right answer came after t.
func (w *listWatch) firstRightAfter(t time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.results {
		if r.at.After(t) && r.err == nil && r.wrong == "" {
			return r.at, true
		}
	}
	return time.Time{}, false
}

// summary counts the outcomes and lists wrong answers and distinct errors.
func (w *listWatch) summary() (calls, errs int, wrong []string, errKinds []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]bool{}
	for _, r := range w.results {
		calls++
		switch {
		case r.err != nil:
			errs++
			msg := r.err.Error()
			if len(msg) > 160 {
				msg = msg[:160]
			}
			if !seen[msg] {
				seen[msg] = true
				errKinds = append(errKinds, msg)
			}
		case r.wrong != "":
			wrong = append(wrong, r.at.Format("15:04:05.000")+" "+r.wrong)
		}
	}
	return calls, errs, wrong, errKinds
}
