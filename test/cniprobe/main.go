// Command cniprobe is a test CNI plugin that behaves as Multus does during CNI
// ADD: it asks a PodResources socket (v1 List, 10 s timeout, 16 MiB message
// limit) which devices the pod being created holds, takes the device ids of
// one resource name for the pod named in CNI_ARGS, and hands them to its
// delegate (the bridge plugin) as "deviceID", as Multus hands a VF's PCI
// address to sriov-cni. It fails the ADD when the socket errors, as Multus
// does.
//
// Each ADD (and DEL) appends one JSON line to the record file: what the probe
// saw and when, and whether the runtime already listed the pod's sandbox,
// so the e2e suite can check that the devices were known before the sandbox
// existed. Like Multus (nadutils.CopyDeviceInfoForCNIFromDP), it then reads
// the NPWG device-info file of the device it hands on, which Multus copies
// into the pod's network-status, and records what it found.
// Configuration (one plugin of a conflist):
//
//	{
//	  "type": "podres-cniprobe",
//	  "socket": "/var/run/podres-proxy/pod-resources/kubelet.sock",
//	  "resourceName": "koordinator.sh/rdma",
//	  "recordFile": "/tmp/cniprobe.jsonl",
//	  "criSocket": "/run/containerd/containerd.sock",
//	  "deviceInfoDir": "/var/run/k8s.cni.cncf.io/devinfo/dp",
//	  "delegate": {"type": "bridge", ...}
//	}
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Multus's numbers (pkg/kubeletclient).
const (
	listTimeout    = 10 * time.Second
	maxRecvMsgSize = 16 * 1024 * 1024
)

// defaultDeviceInfoDir is where Multus reads device plugins' device-info
// files (nadutils: /var/run/k8s.cni.cncf.io/devinfo + dp).
const defaultDeviceInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"

// maxDeviceInfoSize bounds the device-info file read: it is a few hundred
// bytes, and the record file keeps it.
const maxDeviceInfoSize = 64 << 10

// conf is the probe's configuration.
type conf struct {
	types.PluginConf
	// Socket is the PodResources socket to ask.
	Socket string `json:"socket"`
	// ResourceName is the resource whose device ids the probe takes.
	ResourceName string `json:"resourceName"`
	// RecordFile receives one JSON line per ADD and DEL.
	RecordFile string `json:"recordFile"`
	// CRISocket, when set, is asked whether the sandbox is listed yet.
	CRISocket string `json:"criSocket,omitempty"`
	// DeviceInfoDir is where device-info files are read (default
	// defaultDeviceInfoDir).
	DeviceInfoDir string `json:"deviceInfoDir,omitempty"`
	// Delegate is the configuration of the plugin that sets up the network.
	Delegate map[string]any `json:"delegate"`
}

// k8sArgs are the pod's identity in CNI_ARGS, as the kubelet's runtime sets
// it; the field names are the CNI_ARGS keys.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
}

// Record is one line of the record file.
type Record struct {
	Time        time.Time `json:"time"`
	Command     string    `json:"command"`
	ContainerID string    `json:"containerID"`
	Namespace   string    `json:"namespace"`
	Name        string    `json:"name"`
	UID         string    `json:"uid,omitempty"`
	// Resource is the resource name the probe looked for.
	Resource string `json:"resource,omitempty"`
	// PodFound tells whether List had the pod at all.
	PodFound bool `json:"podFound"`
	// DeviceIDs are the pod's device ids of Resource, in container order.
	DeviceIDs []string `json:"deviceIDs"`
	// SandboxListed tells whether the runtime's ListPodSandbox already had
	// the sandbox when the probe asked; SandboxState is its state then.
	SandboxListed bool   `json:"sandboxListed"`
	SandboxState  string `json:"sandboxState,omitempty"`
	// DeviceInfo is the device-info file of the device handed to the
	// delegate, as Multus would copy it into network-status; absent when
	// there is none. DeviceInfoError says why it could not be read.
	DeviceInfo      json.RawMessage `json:"deviceInfo,omitempty"`
	DeviceInfoError string          `json:"deviceInfoError,omitempty"`
	// Error is the error that failed the command, if any.
	Error string `json:"error,omitempty"`
	// ListMillis is how long List took.
	ListMillis int64 `json:"listMillis"`
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck},
		version.All, "podres-proxy test CNI probe (Multus-like PodResources client)")
}

func loadConf(args *skel.CmdArgs) (*conf, *k8sArgs, error) {
	var c conf
	if err := json.Unmarshal(args.StdinData, &c); err != nil {
		return nil, nil, fmt.Errorf("parse probe config: %w", err)
	}
	if c.Socket == "" || c.ResourceName == "" || c.RecordFile == "" || c.Delegate == nil {
		return nil, nil, errors.New("probe config needs socket, resourceName, recordFile and delegate")
	}
	var ka k8sArgs
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nil, nil, fmt.Errorf("parse CNI_ARGS %q: %w", args.Args, err)
	}
	return &c, &ka, nil
}

// delegateConf returns the delegate's configuration as bytes, with the
// network's version and name, and the device id Multus would inject.
func (c *conf) delegateConf(deviceID string) ([]byte, string, error) {
	d := make(map[string]any, len(c.Delegate)+3)
	for k, v := range c.Delegate {
		d[k] = v
	}
	d["cniVersion"] = c.CNIVersion
	if _, ok := d["name"]; !ok {
		d["name"] = c.Name
	}
	if deviceID != "" {
		d["deviceID"] = deviceID
		d["pciBusID"] = deviceID
	}
	typ, _ := d["type"].(string)
	if typ == "" {
		return nil, "", errors.New("delegate config has no type")
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil, "", fmt.Errorf("encode delegate config: %w", err)
	}
	return b, typ, nil
}

func cmdAdd(args *skel.CmdArgs) error {
	c, ka, err := loadConf(args)
	if err != nil {
		return err
	}
	ctx := context.Background()
	rec := Record{
		Time:        time.Now().UTC(),
		Command:     "ADD",
		ContainerID: args.ContainerID,
		Namespace:   string(ka.K8S_POD_NAMESPACE),
		Name:        string(ka.K8S_POD_NAME),
		UID:         string(ka.K8S_POD_UID),
		Resource:    c.ResourceName,
		DeviceIDs:   []string{},
	}
	if c.CRISocket != "" {
		rec.SandboxListed, rec.SandboxState = sandboxListed(ctx, c.CRISocket, args.ContainerID)
	}
	start := time.Now()
	found, ids, err := podDevices(ctx, c.Socket, rec.Namespace, rec.Name, c.ResourceName)
	rec.ListMillis = time.Since(start).Milliseconds()
	if err != nil {
		// Multus fails the ADD; the kubelet retries the sandbox.
		rec.Error = err.Error()
		return errors.Join(err, appendRecord(c.RecordFile, rec))
	}
	rec.PodFound, rec.DeviceIDs = found, ids
	// Multus hands the delegate the first unused id of the resource; with
	// one network per pod that is the first one.
	var deviceID string
	if len(ids) > 0 {
		deviceID = ids[0]
		rec.DeviceInfo, err = deviceInfo(c.deviceInfoDir(), c.ResourceName, deviceID)
		if err != nil {
			rec.DeviceInfoError = err.Error() // Multus only logs it
		}
	}
	if err := appendRecord(c.RecordFile, rec); err != nil {
		return err
	}
	dconf, typ, err := c.delegateConf(deviceID)
	if err != nil {
		return err
	}
	res, err := invoke.DelegateAdd(ctx, typ, dconf, nil)
	if err != nil {
		return fmt.Errorf("delegate %s ADD for pod %s/%s: %w", typ, rec.Namespace, rec.Name, err)
	}
	result, err := current.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("convert %s result: %w", typ, err)
	}
	return types.PrintResult(result, c.CNIVersion)
}

func cmdDel(args *skel.CmdArgs) error {
	c, ka, err := loadConf(args)
	if err != nil {
		return err
	}
	dconf, typ, err := c.delegateConf("")
	if err != nil {
		return err
	}
	derr := invoke.DelegateDel(context.Background(), typ, dconf, nil)
	rec := Record{
		Time:        time.Now().UTC(),
		Command:     "DEL",
		ContainerID: args.ContainerID,
		Namespace:   string(ka.K8S_POD_NAMESPACE),
		Name:        string(ka.K8S_POD_NAME),
		UID:         string(ka.K8S_POD_UID),
		DeviceIDs:   []string{},
	}
	if derr != nil {
		derr = fmt.Errorf("delegate %s DEL: %w", typ, derr)
		rec.Error = derr.Error()
	}
	return errors.Join(derr, appendRecord(c.RecordFile, rec))
}

func cmdCheck(args *skel.CmdArgs) error {
	c, _, err := loadConf(args)
	if err != nil {
		return err
	}
	dconf, typ, err := c.delegateConf("")
	if err != nil {
		return err
	}
	if err := invoke.DelegateCheck(context.Background(), typ, dconf, nil); err != nil {
		return fmt.Errorf("delegate %s CHECK: %w", typ, err)
	}
	return nil
}

func (c *conf) deviceInfoDir() string {
	if c.DeviceInfoDir != "" {
		return c.DeviceInfoDir
	}
	return defaultDeviceInfoDir
}

// deviceInfoPath is the file Multus reads for a device of a resource
// (nadutils.getDPDeviceInfoPath): "/" in either replaced by "-".
func deviceInfoPath(dir, resource, deviceID string) string {
	return filepath.Join(dir, strings.ReplaceAll(resource, "/", "-")+"-"+strings.ReplaceAll(deviceID, "/", "-")+"-device.json")
}

// deviceInfo reads the device-info file of a device, nil when there is
// none. Its content must be a JSON object, as Multus decodes it.
func deviceInfo(dir, resource, deviceID string) (json.RawMessage, error) {
	path := deviceInfoPath(dir, resource, deviceID)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read device-info: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxDeviceInfoSize+1))
	if err != nil {
		return nil, fmt.Errorf("read device-info %s: %w", path, err)
	}
	if len(b) > maxDeviceInfoSize {
		return nil, fmt.Errorf("device-info %s is over %d bytes", path, maxDeviceInfoSize)
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, fmt.Errorf("device-info %s is not a JSON object: %w", path, err)
	}
	return json.RawMessage(b), nil
}

// podDevices asks socket for the device ids of resource held by the pod
// namespace/name, as Multus's kubelet client does: one v1 List, matching by
// name and namespace, ids appended in container order.
func podDevices(ctx context.Context, socket, namespace, name, resource string) (bool, []string, error) {
	if namespace == "" || name == "" {
		return false, nil, errors.New("CNI_ARGS names no pod (K8S_POD_NAMESPACE, K8S_POD_NAME)")
	}
	if _, err := os.Stat(socket); err != nil {
		return false, nil, fmt.Errorf("PodResources socket: %w", err)
	}
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsgSize)))
	if err != nil {
		return false, nil, fmt.Errorf("connect to %s: %w", socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return false, nil, fmt.Errorf("list pod resources from %s: %w", socket, err)
	}
	found := false
	ids := []string{}
	for _, pod := range resp.GetPodResources() {
		if pod.GetNamespace() != namespace || pod.GetName() != name {
			continue
		}
		found = true
		for _, ctr := range pod.GetContainers() {
			for _, dev := range ctr.GetDevices() {
				if dev.GetResourceName() == resource {
					ids = append(ids, dev.GetDeviceIds()...)
				}
			}
		}
	}
	return found, ids, nil
}

// sandboxListed asks the runtime whether it lists the sandbox id yet, and in
// which state. Errors count as "not listed": the record says what was seen.
func sandboxListed(ctx context.Context, socket, id string) (bool, string) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, "error: " + err.Error()
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{
		Filter: &runtimeapi.PodSandboxFilter{Id: id},
	})
	if err != nil {
		return false, "error: " + err.Error()
	}
	for _, s := range resp.GetItems() {
		if s.GetId() == id {
			return true, s.GetState().String()
		}
	}
	return false, ""
}

// appendRecord appends rec as one JSON line to path, in one write, so lines
// of concurrent ADDs (separate processes) never interleave.
func appendRecord(path string, rec Record) error {
	line, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode probe record: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open probe record file: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("write probe record: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close probe record file: %w", err)
	}
	return nil
}
