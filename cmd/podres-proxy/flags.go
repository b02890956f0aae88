package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/parse"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/devinfo"
	"github.com/podres-proxy/podres-proxy/dra/resourceapi"
	"github.com/podres-proxy/podres-proxy/internal/apiclient"
	"github.com/podres-proxy/podres-proxy/internal/cmdline"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/proxy/limits"
	"github.com/podres-proxy/podres-proxy/proxy/merge"
	"github.com/podres-proxy/podres-proxy/state"
)

// serve's flags: their names are part of the interface (see the design
// card's command line).

// serveConfig is the command line of serve.
type serveConfig struct {
	socket, kubeletSocket                   string
	podsURL, tokenFile, caFile              string
	podsAPISocket                           string
	podLogsDir                              string
	insecureTLS                             bool
	podsTimeout                             time.Duration
	stateDir                                string
	pruneAfter                              time.Duration
	nriSocket, nriName, nriIndex            string
	criSocket                               string
	criInterval                             time.Duration
	metricsAddr, probeSocket                string
	qps                                     float64
	maxConns, maxConnsPerClient             int
	requestTimeout                          time.Duration
	burst                                   int
	logLevel                                string
	gpuResource, rdmaResource, fpgaResource string
	allocators, hamiResources               string
	maxDevicesPerPod                        int
	schedulerNames                          map[string]*string  // flag value per registry.Family
	schedulers                              map[string][]string // scheduler names per allocator, from schedulerNames
	nodeName                                string
	deviceCR                                bool
	apiServer, apiTokenFile, apiCAFile      string
	events                                  bool
	inventoryFile, sysfsRoot, procfsRoot    string
	viewFlags                               []string // --view NAME=PATH
	views                                   []proxy.ViewSocket
	migResource                             string
	deviceInfoDir                           string
	draResources                            string
	draDrivers                              map[string]string // draResources read, when the legacy view is served
	draIDAttributes, draNUMAAttributes      string

	tokenFileSet bool

	secureMetricsConfig // secure_metrics.go
}

func serveFlags(stderr io.Writer) (*serveConfig, func([]string) error) {
	c := &serveConfig{}
	fs := cmdline.NewFlagSet("serve", stderr)
	fs.StringVar(&c.socket, "socket", cmdline.DefaultSocket, "where to serve the PodResources API; consumers mount its directory in place of /var/lib/kubelet/pod-resources")
	fs.StringVar(&c.kubeletSocket, "kubelet-socket", cmdline.DefaultKubeletSocket, "the kubelet's PodResources socket (path or unix:// URL)")
	fs.StringVar(&c.podsURL, "kubelet-pods-url", "", "the kubelet's /pods endpoint (default https://$NODE_IP:10250/pods; http://127.0.0.1:10255/pods for the read-only port)")
	fs.StringVar(&c.tokenFile, "kubelet-token-file", defaultTokenFile, "bearer token for /pods, re-read when it changes; the default service-account token is sent only when the file exists")
	fs.StringVar(&c.caFile, "kubelet-ca-file", "", "CA bundle to verify the kubelet's serving certificate (default the system roots)")
	fs.BoolVar(&c.insecureTLS, "kubelet-insecure-tls", false, "do not verify the kubelet's serving certificate (self-signed kubelet certificates)")
	fs.DurationVar(&c.podsTimeout, "kubelet-pods-timeout", 5*time.Second, "time limit for one /pods read")
	fs.StringVar(&c.podsAPISocket, "kubelet-pods-api-socket", podsapi.DefaultSocket, "the kubelet's Pods API socket (KEP-4188, kubelet feature gate PodsAPI), watched and preferred to /pods whenever it answers; empty disables")
	fs.StringVar(&c.podLogsDir, "kubelet-pod-logs-dir", podlogs.DefaultDir, "the kubelet's podLogsDir, mounted read-only: while it shows that no pod sandbox began since the last /pods read, pods not running are answered from that read instead of a read per query; empty disables")
	fs.StringVar(&c.stateDir, "state-dir", cmdline.DefaultStateDir, "the persisted state store (one JSON file per pod) and inventory.json, the device inventory for inspect and query --sources")
	fs.DurationVar(&c.pruneAfter, "prune-after", state.DefaultPruneAfter, "how long removed pods stay in the state store")
	fs.StringVar(&c.nriSocket, "nri-socket", defaultNRISocket, "the runtime's NRI socket; empty disables the NRI plugin")
	fs.StringVar(&c.nriName, "nri-plugin-name", "podres-proxy", "NRI plugin name (ignored when the runtime launches the plugin)")
	fs.StringVar(&c.nriIndex, "nri-plugin-index", "90", "NRI plugin index; observers run last (ignored when the runtime launches the plugin)")
	fs.StringVar(&c.criSocket, "cri-socket", defaultCRISocket, "the runtime's CRI socket, to reconcile what NRI missed; empty disables reconciling")
	fs.DurationVar(&c.criInterval, "cri-reconcile-interval", 30*time.Second, "how often to reconcile the state store against CRI")
	fs.StringVar(&c.metricsAddr, "metrics-addr", defaultMetricsAddr, "address for /metrics, /healthz and /readyz; empty disables")
	c.secureMetricsConfig.addFlags(fs)
	fs.StringVar(&c.probeSocket, "probe-socket", "", "a unix socket of this instance's own (a directory private to the pod) serving /healthz and /readyz for the probe command (the kubelet's exec probes); empty disables")
	fs.Float64Var(&c.qps, "rate-limit-qps", limits.DefaultRateLimitQPS, "calls per second the endpoint accepts, as the kubelet's; 0 disables the limit")
	fs.IntVar(&c.burst, "rate-limit-burst", limits.DefaultRateLimitBurst, "burst of the rate limit")
	fs.IntVar(&c.maxConns, "max-connections", limits.DefaultMaxConnections, "client connections served at once; more are closed at once")
	fs.IntVar(&c.maxConnsPerClient, "max-connections-per-client", limits.DefaultMaxConnectionsPerClient, "client connections one client process may hold at once, within --max-connections; more are closed at once")
	fs.DurationVar(&c.requestTimeout, "request-timeout", limits.DefaultRequestTimeout, "deadline of a call whose client set none sooner, /pods read and kubelet call included")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.gpuResource, "gpu-resource-name", parse.DefaultGPUResource, "resource name allocated GPUs (and the inventory's GPUs) are reported as; DCGM exporter expects nvidia.com/gpu")
	fs.StringVar(&c.rdmaResource, "rdma-resource-name", koordinator.DefaultRDMAResource, "resource name allocated RDMA devices (and the inventory's NICs and VFs) are reported as; Multus matches it with the NetworkAttachmentDefinition's resourceName")
	fs.StringVar(&c.fpgaResource, "fpga-resource-name", koordinator.DefaultFPGAResource, "resource name allocated FPGAs are reported as")
	fs.StringVar(&c.allocators, "allocators", strings.Join(registry.Names(), ","), "the schedulers whose annotations are decoded: "+strings.Join(registry.Names(), ", ")+" (each reads only its own annotations)")
	fs.StringVar(&c.hamiResources, "hami-resources", "", "HAMi vendor to resource name overrides, e.g. vgpu=nvidia.com/gpu,dcu=hygon.com/dcunum (for hami.io/<vendor>-devices-allocated)")
	fs.IntVar(&c.maxDevicesPerPod, "max-devices-per-pod", allocator.DefaultMaxDevicesPerPod, "device ids one pod's allocator annotations may name; an annotation taking a pod past it is refused as malformed")
	c.schedulerNames = map[string]*string{}
	for _, family := range registry.Families {
		def := registry.SchedulerNames(family.Allocators[0])
		c.schedulerNames[family.Flag] = fs.String(family.Flag+"-scheduler-names", strings.Join(def, ","),
			"comma-separated spec.schedulerName values of the pods whose "+family.Annotations+" annotations are believed; add default-scheduler where "+family.Name+" runs as the default scheduler")
	}
	fs.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name, which Koordinator's Device object is named after (default $NODE_NAME)")
	fs.BoolVar(&c.deviceCR, "device-cr", true, "read the node's Koordinator Device object for the device inventory (needs --node-name and an API server)")
	fs.StringVar(&c.apiServer, "api-server", "", "API server URL for the Device object, Events, the HTTPS /metrics reviews and the legacy view's DRA objects (default in-cluster: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.StringVar(&c.apiTokenFile, "api-token-file", apiclient.DefaultTokenFile, "bearer token for the API server")
	fs.StringVar(&c.apiCAFile, "api-ca-file", apiclient.DefaultCAFile, "CA bundle to verify the API server")
	fs.BoolVar(&c.events, "events", true, "report decisions (refused allocations, undecodable annotations) as Warning Events on the pod, and the daemon's own trouble on the Node (needs --node-name and an API server)")
	fs.StringVar(&c.inventoryFile, "inventory-file", "", "a local device inventory file (docs/inventory.md), reloaded when it changes; empty: none")
	fs.StringVar(&c.sysfsRoot, "sysfs-root", "/sys", "where to discover GPUs and RDMA NICs with their NUMA nodes; empty disables discovery")
	fs.StringVar(&c.procfsRoot, "procfs-root", "/proc", "where NVIDIA's driver publishes GPU UUIDs (driver/nvidia/gpus)")
	fs.StringArrayVar(&c.viewFlags, "view", nil, "NAME=PATH: also serve the view NAME ("+viewNames()+") on the socket PATH, for the consumers it suits (docs/views.md); repeatable. --socket serves the topology view")
	fs.StringVar(&c.migResource, "mig-resource-name", "", "resource name MIG instances (MIG-<uuid>) are reported as, e.g. nvidia.com/mig-1g.10gb (DCGM exporter matches nvidia.com/gpu and nvidia.com/mig-*); empty: their GPU's (--gpu-resource-name)")
	fs.StringVar(&c.deviceInfoDir, "device-info-dir", devinfo.DefaultDir, "where to write the NPWG device-info files of the VFs and RDMA devices pods are answered with, which Multus copies into the pod's network-status; empty disables")
	fs.StringVar(&c.draResources, "dra-resources", "", "legacy view: DRA drivers whose devices are also folded from pods' own claims and listed as allocatable, as driver=resource pairs, e.g. gpu.example.com=nvidia.com/gpu")
	fs.StringVar(&c.draIDAttributes, "dra-id-attributes", strings.Join(resourceapi.DefaultAttributes.ID, ","), "legacy view: ResourceSlice device attributes that give a device's id, in order of preference (a name without a domain is the driver's)")
	fs.StringVar(&c.draNUMAAttributes, "dra-numa-attributes", strings.Join(resourceapi.DefaultAttributes.NUMA, ","), "legacy view: ResourceSlice device attributes that give a device's NUMA node, in order of preference")
	return c, func(args []string) error {
		if err := cmdline.Parse(fs, args); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return cmdline.Usage(fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " ")))
		}
		c.tokenFileSet = fs.Changed("kubelet-token-file")
		return c.complete()
	}
}

// complete fills defaults that depend on the environment and checks the
// combination of flags.
func (c *serveConfig) complete() error {
	schedulers, err := registry.TrustedSchedulers(func(flag string) string { return *c.schedulerNames[flag] })
	if err != nil {
		return cmdline.Usage(err)
	}
	c.schedulers = schedulers
	if c.maxDevicesPerPod <= 0 {
		return cmdline.Usage(fmt.Errorf("--max-devices-per-pod %d: want a positive number", c.maxDevicesPerPod))
	}
	if c.podsURL == "" {
		ip := os.Getenv("NODE_IP")
		if ip == "" {
			return cmdline.Usage(errors.New("set --kubelet-pods-url, or NODE_IP (the downward API's status.hostIP) for the default https://$NODE_IP:10250/pods"))
		}
		c.podsURL = "https://" + net.JoinHostPort(ip, "10250") + "/pods"
	}
	if !c.tokenFileSet {
		if _, err := os.Stat(c.tokenFile); err != nil {
			c.tokenFile = "" // not in a pod: no service-account token to send
		}
	}
	if c.qps < 0 || c.burst < 0 {
		return cmdline.Usage(errors.New("--rate-limit-qps and --rate-limit-burst cannot be negative"))
	}
	views, err := proxy.ParseViews(c.viewFlags, c.socket, c.kubeletSocket)
	if err != nil {
		return cmdline.Usage(err)
	}
	c.views = views
	if err := c.checkLegacyView(); err != nil {
		return cmdline.Usage(err)
	}
	if err := c.secureMetricsConfig.check(); err != nil {
		return cmdline.Usage(err)
	}
	if c.maxConns < 1 || c.maxConnsPerClient < 1 || c.requestTimeout <= 0 {
		return cmdline.Usage(errors.New("--max-connections, --max-connections-per-client and --request-timeout must be positive"))
	}
	return nil
}

// viewNames lists the views, the default first.
func viewNames() string {
	names := make([]string, len(merge.Views))
	for i, v := range merge.Views {
		names[i] = string(v)
	}
	return strings.Join(names, ", ")
}
