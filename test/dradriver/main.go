// Command dradriver is the cluster suite's DRA driver (test/cluster): a
// kubelet plugin that publishes N devices on its node, each with a PCI
// address (the standard attribute resource.kubernetes.io/pciBusID) and a
// NUMA node (the driver's own attribute numaNode), and prepares claims
// without CDI devices (nothing is injected into containers). It exists
// because the Kubernetes test driver at the kubelet's version publishes
// devices without attributes, so it cannot show an id or a NUMA node.
//
// It is a module of its own (k8s.io/dynamic-resource-allocation is not one
// of podres-proxy's dependencies); hack/build-dradriver.sh builds it. It runs
// on the host, as root, next to the kubelet whose root directory is
// --kubelet-dir: it registers through KUBELET_DIR/plugins_registry and
// serves the DRA gRPC service in KUBELET_DIR/plugins/DRIVER.
//
// Device i is named dev-i, has PCI address 0000:PCI_BUS:i.0 (i < 32) and
// NUMA node i % NUMA_NODES.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

func main() {
	var (
		driverName = flag.String("driver-name", "gpu.podres-proxy.test", "the DRA driver's name")
		nodeName   = flag.String("node-name", "", "the node whose devices are published (required)")
		kubeconfig = flag.String("kubeconfig", "", "kubeconfig of a client that may publish ResourceSlices (required)")
		kubeletDir = flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's root directory")
		devices    = flag.Int("devices", 4, "how many devices to publish (at most 32)")
		numaNodes  = flag.Int("numa-nodes", 2, "devices are spread round-robin over this many NUMA nodes")
		pciBus     = flag.String("pci-bus", "3b", "the PCI bus of the devices (two hex digits)")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*driverName, *nodeName, *kubeconfig, *kubeletDir, *devices, *numaNodes, *pciBus); err != nil {
		fmt.Fprintf(os.Stderr, "dradriver: %v\n", err)
		os.Exit(1)
	}
}

func run(driverName, nodeName, kubeconfig, kubeletDir string, n, numaNodes int, pciBus string) error {
	if nodeName == "" || kubeconfig == "" {
		return errors.New("--node-name and --kubeconfig are required")
	}
	if n < 1 || n > 32 || numaNodes < 1 {
		return fmt.Errorf("--devices %d must be 1 to 32 and --numa-nodes %d at least 1", n, numaNodes)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load %s: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	registry := filepath.Join(kubeletDir, "plugins_registry")
	dataDir := filepath.Join(kubeletDir, "plugins", driverName)
	for _, d := range []string{registry, dataDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithName("dradriver"))

	helper, err := kubeletplugin.Start(ctx, &driver{pool: nodeName, cancel: stop},
		kubeletplugin.DriverName(driverName),
		kubeletplugin.NodeName(nodeName),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(registry),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	defer helper.Stop()

	devs := make([]resourceapi.Device, n)
	for i := range devs {
		devs[i] = resourceapi.Device{
			Name: fmt.Sprintf("dev-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"resource.kubernetes.io/pciBusID": {StringValue: ptr.To(fmt.Sprintf("0000:%s:%02x.0", pciBus, i))},
				"numaNode":                        {IntValue: ptr.To(int64(i % numaNodes))},
			},
		}
	}
	// One pool named after the node, as node-local drivers do.
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: []resourceslice.Slice{{Devices: devs}}}},
	}); err != nil {
		return fmt.Errorf("publish the devices: %w", err)
	}
	klog.FromContext(ctx).Info("serving", "driver", driverName, "node", nodeName, "devices", n, "registry", registry, "dataDir", dataDir)
	<-ctx.Done()
	return nil
}

// driver prepares every claim of its own by naming the allocated devices,
// with no CDI device: the kubelet still reports them to PodResources, which
// is all the cluster suite looks at.
type driver struct {
	pool   string
	cancel context.CancelFunc
}

func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		var res kubeletplugin.PrepareResult
		if c.Status.Allocation == nil {
			res.Err = fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
		} else {
			res.Devices = []kubeletplugin.Device{}
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Pool != d.pool {
					continue
				}
				res.Devices = append(res.Devices, kubeletplugin.Device{
					Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID,
				})
			}
		}
		klog.FromContext(ctx).Info("prepare", "claim", klog.KObj(c), "devices", res.Devices, "err", res.Err)
		out[c.UID] = res
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		klog.FromContext(ctx).Info("unprepare", "claim", c.NamespacedName)
		out[c.UID] = nil
	}
	return out, nil
}

// HandleError logs a background error (publishing the slices); one that is
// not recoverable stops the driver, whose exit the test sees.
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel()
	}
}

// WatchHealthStatus says the driver reports no device health: the suite's
// devices are made up, and the kubelet then keeps their health unknown.
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
