package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podres-proxy/podres-proxy/devinfo"
	"github.com/podres-proxy/podres-proxy/plugin"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/proxy/allocator"
	"github.com/podres-proxy/podres-proxy/proxy/inventory"
	"github.com/podres-proxy/podres-proxy/proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/state"
)

const (
	defaultSocket        = "/var/run/podres-proxy/pod-resources/kubelet.sock"
	defaultKubeletSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	defaultTokenFile     = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	defaultStateDir      = "/var/lib/podres-proxy"
	defaultNRISocket     = "/var/run/nri/nri.sock"
	defaultCRISocket     = "unix:///run/containerd/containerd.sock"
	defaultMetricsAddr   = "127.0.0.1:9477"
)

// serveConfig is the command line of serve.
type serveConfig struct {
	socket, kubeletSocket                   string
	podsURL, tokenFile, caFile              string
	insecureTLS                             bool
	podsTimeout                             time.Duration
	stateDir                                string
	pruneAfter                              time.Duration
	nriSocket, nriName, nriIndex            string
	criSocket                               string
	criInterval                             time.Duration
	metricsAddr                             string
	qps                                     float64
	maxConns                                int
	requestTimeout                          time.Duration
	burst                                   int
	logLevel                                string
	gpuResource, rdmaResource, fpgaResource string
	allocators, hamiResources               string
	hamiLegacyIndexing                      bool
	maxDevicesPerPod                        int
	schedulerNames                          map[string]*string // flag value per scheduler family
	nodeName                                string
	deviceCR                                bool
	apiServer, apiTokenFile, apiCAFile      string
	inventoryFile, sysfsRoot, procfsRoot    string
	sharedGPUIDs, migResource               string
	deviceInfoDir                           string

	tokenFileSet bool
}

func serveFlags(stderr io.Writer) (*serveConfig, func([]string) error) {
	c := &serveConfig{}
	fs := newFlagSet("serve", stderr)
	fs.StringVar(&c.socket, "socket", defaultSocket, "where to serve the PodResources API; consumers mount its directory in place of /var/lib/kubelet/pod-resources")
	fs.StringVar(&c.kubeletSocket, "kubelet-socket", defaultKubeletSocket, "the kubelet's PodResources socket (path or unix:// URL)")
	fs.StringVar(&c.podsURL, "kubelet-pods-url", "", "the kubelet's /pods endpoint (default https://$NODE_IP:10250/pods; http://127.0.0.1:10255/pods for the read-only port)")
	fs.StringVar(&c.tokenFile, "kubelet-token-file", defaultTokenFile, "bearer token for /pods, re-read when it changes; the default service-account token is sent only when the file exists")
	fs.StringVar(&c.caFile, "kubelet-ca-file", "", "CA bundle to verify the kubelet's serving certificate (default the system roots)")
	fs.BoolVar(&c.insecureTLS, "kubelet-insecure-tls", false, "do not verify the kubelet's serving certificate (self-signed kubelet certificates)")
	fs.DurationVar(&c.podsTimeout, "kubelet-pods-timeout", 5*time.Second, "time limit for one /pods read")
	fs.StringVar(&c.stateDir, "state-dir", defaultStateDir, "the persisted state store (one JSON file per pod) and inventory.json, the device inventory for inspect and query --sources")
	fs.DurationVar(&c.pruneAfter, "prune-after", state.DefaultPruneAfter, "how long removed pods stay in the state store")
	fs.StringVar(&c.nriSocket, "nri-socket", defaultNRISocket, "the runtime's NRI socket; empty disables the NRI plugin")
	fs.StringVar(&c.nriName, "nri-plugin-name", "podres-proxy", "NRI plugin name (ignored when the runtime launches the plugin)")
	fs.StringVar(&c.nriIndex, "nri-plugin-index", "90", "NRI plugin index; observers run last (ignored when the runtime launches the plugin)")
	fs.StringVar(&c.criSocket, "cri-socket", defaultCRISocket, "the runtime's CRI socket, to reconcile what NRI missed; empty disables reconciling")
	fs.DurationVar(&c.criInterval, "cri-reconcile-interval", 30*time.Second, "how often to reconcile the state store against CRI")
	fs.StringVar(&c.metricsAddr, "metrics-addr", defaultMetricsAddr, "address for /metrics, /healthz and /readyz; empty disables")
	fs.Float64Var(&c.qps, "rate-limit-qps", proxy.DefaultRateLimitQPS, "calls per second the endpoint accepts, as the kubelet's; 0 disables the limit")
	fs.IntVar(&c.burst, "rate-limit-burst", proxy.DefaultRateLimitBurst, "burst of the rate limit")
	fs.IntVar(&c.maxConns, "max-connections", proxy.DefaultMaxConnections, "client connections served at once; more are closed at once")
	fs.DurationVar(&c.requestTimeout, "request-timeout", proxy.DefaultRequestTimeout, "deadline of a call whose client set none sooner, /pods read and kubelet call included")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.gpuResource, "gpu-resource-name", allocator.DefaultGPUResource, "resource name allocated GPUs (and the inventory's GPUs) are reported as; DCGM exporter expects nvidia.com/gpu")
	fs.StringVar(&c.rdmaResource, "rdma-resource-name", allocator.DefaultRDMAResource, "resource name allocated RDMA devices (and the inventory's NICs and VFs) are reported as; Multus matches it with the NetworkAttachmentDefinition's resourceName")
	fs.StringVar(&c.fpgaResource, "fpga-resource-name", allocator.DefaultFPGAResource, "resource name allocated FPGAs are reported as")
	fs.StringVar(&c.allocators, "allocators", strings.Join(allocator.Names(), ","), "the schedulers whose annotations are decoded: "+strings.Join(allocator.Names(), ", ")+" (each reads only its own annotations)")
	fs.StringVar(&c.hamiResources, "hami-resources", "", "HAMi vendor to resource name overrides, e.g. vgpu=nvidia.com/gpu,dcu=hygon.com/dcunum (for hami.io/<vendor>-devices-allocated)")
	fs.BoolVar(&c.hamiLegacyIndexing, "hami-legacy-indexing", false, "deprecated, no effect: HAMi's lists are read as its device plugin reads them (the k-th non-empty entry for the k-th container requesting the vendor's resource), right for every HAMi version")
	fs.IntVar(&c.maxDevicesPerPod, "max-devices-per-pod", allocator.DefaultMaxDevicesPerPod, "device ids one pod's allocator annotations may name; an annotation taking a pod past it is refused as malformed")
	c.schedulerNames = map[string]*string{}
	for _, family := range schedulerFamilies {
		def := allocator.DefaultSchedulerNames()[family.allocators[0]]
		c.schedulerNames[family.flag] = fs.String(family.flag+"-scheduler-names", strings.Join(def, ","),
			"comma-separated spec.schedulerName values of the pods whose "+family.annotations+" annotations are believed; add default-scheduler where "+family.name+" runs as the default scheduler")
	}
	fs.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name, which Koordinator's Device object is named after (default $NODE_NAME)")
	fs.BoolVar(&c.deviceCR, "device-cr", true, "read the node's Koordinator Device object for the device inventory (needs --node-name and an API server)")
	fs.StringVar(&c.apiServer, "api-server", "", "API server URL for the Device object (default in-cluster: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	fs.StringVar(&c.apiTokenFile, "api-token-file", inventory.DefaultTokenFile, "bearer token for the API server")
	fs.StringVar(&c.apiCAFile, "api-ca-file", inventory.DefaultCAFile, "CA bundle to verify the API server")
	fs.StringVar(&c.inventoryFile, "inventory-file", "", "a local device inventory file (docs/inventory.md), reloaded when it changes; empty: none")
	fs.StringVar(&c.sysfsRoot, "sysfs-root", "/sys", "where to discover GPUs and RDMA NICs with their NUMA nodes; empty disables discovery")
	fs.StringVar(&c.procfsRoot, "procfs-root", "/proc", "where NVIDIA's driver publishes GPU UUIDs (driver/nvidia/gpus)")
	fs.StringVar(&c.sharedGPUIDs, "shared-gpu-ids", sharedGPUIDsSlot, "ids of the pods sharing a GPU: slot (the first live sharer the GPU's UUID, each other <uuid>::<slot>, which DCGM exporter's --kubernetes-virtual-gpus labels vgpu=<slot>) or uuid (every sharer the GPU's UUID, as before)")
	fs.StringVar(&c.migResource, "mig-resource-name", "", "resource name MIG instances (MIG-<uuid>) are reported as, e.g. nvidia.com/mig-1g.10gb (DCGM exporter matches nvidia.com/gpu and nvidia.com/mig-*); empty: their GPU's (--gpu-resource-name)")
	fs.StringVar(&c.deviceInfoDir, "device-info-dir", devinfo.DefaultDir, "where to write the NPWG device-info files of the VFs and RDMA devices pods are answered with, which Multus copies into the pod's network-status; empty disables")
	return c, func(args []string) error {
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return usageError{fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
		}
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "kubelet-token-file" {
				c.tokenFileSet = true
			}
		})
		return c.complete()
	}
}

// The values of --shared-gpu-ids.
const (
	sharedGPUIDsSlot = "slot"
	sharedGPUIDsUUID = "uuid"
)

// deviceInfoWriter is w as the proxy's dependency: nil when disabled (a nil
// *devinfo.Writer in the interface would not be nil).
func deviceInfoWriter(w *devinfo.Writer) proxy.DeviceInfoWriter {
	if w == nil {
		return nil
	}
	return w
}

// schedulerFamilies are the --<flag>-scheduler-names flags: which
// allocators' annotations each scheduler writes (Volcano's two device plugins
// run in one scheduler).
var schedulerFamilies = []struct {
	flag, name, annotations string
	allocators              []string
}{
	{"koordinator", "Koordinator", "Koordinator", []string{allocator.KoordinatorName}},
	{"hami", "HAMi", "HAMi", []string{allocator.HAMiName}},
	{"volcano", "Volcano", "Volcano vGPU and gpushare", []string{allocator.VolcanoVGPUName, allocator.VolcanoGPUShareName}},
	{"tensorfusion", "TensorFusion", "TensorFusion", []string{allocator.TensorFusionName}},
}

// trustedSchedulers returns the scheduler names per allocator the flags
// give, for allocator.GateOptions.
func (c *serveConfig) trustedSchedulers() (map[string][]string, error) {
	out := map[string][]string{}
	for _, family := range schedulerFamilies {
		var names []string
		for _, n := range strings.Split(*c.schedulerNames[family.flag], ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("--%s-scheduler-names is empty: name the scheduler(s) whose pods' %s annotations are believed", family.flag, family.annotations)
		}
		for _, a := range family.allocators {
			out[a] = names
		}
	}
	return out, nil
}

// complete fills defaults that depend on the environment and checks the
// combination of flags.
func (c *serveConfig) complete() error {
	if _, err := c.trustedSchedulers(); err != nil {
		return usageError{err}
	}
	if c.maxDevicesPerPod <= 0 {
		return usageError{fmt.Errorf("--max-devices-per-pod %d: want a positive number", c.maxDevicesPerPod)}
	}
	if c.podsURL == "" {
		ip := os.Getenv("NODE_IP")
		if ip == "" {
			return usageError{errors.New("set --kubelet-pods-url, or NODE_IP (the downward API's status.hostIP) for the default https://$NODE_IP:10250/pods")}
		}
		c.podsURL = "https://" + net.JoinHostPort(ip, "10250") + "/pods"
	}
	if !c.tokenFileSet {
		if _, err := os.Stat(c.tokenFile); err != nil {
			c.tokenFile = "" // not in a pod: no service-account token to send
		}
	}
	if c.qps < 0 || c.burst < 0 {
		return usageError{errors.New("--rate-limit-qps and --rate-limit-burst cannot be negative")}
	}
	if c.sharedGPUIDs != sharedGPUIDsSlot && c.sharedGPUIDs != sharedGPUIDsUUID {
		return usageError{fmt.Errorf("--shared-gpu-ids %q: want %s or %s", c.sharedGPUIDs, sharedGPUIDsSlot, sharedGPUIDsUUID)}
	}
	if c.maxConns < 1 || c.requestTimeout <= 0 {
		return usageError{errors.New("--max-connections and --request-timeout must be positive")}
	}
	return nil
}

func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	c, parse := serveFlags(stderr)
	if err := parse(args); err != nil {
		return err
	}
	log := logrus.New()
	log.SetOutput(stderr)
	log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	level, err := logrus.ParseLevel(c.logLevel)
	if err != nil {
		return usageError{fmt.Errorf("--log-level: %w", err)}
	}
	log.SetLevel(level)
	return serve(ctx, c, log)
}

// serve runs every part until ctx is done or one of them fails.
func serve(ctx context.Context, c *serveConfig, log *logrus.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := proxy.NewMetrics(reg)

	hamiResources, err := allocator.ParseResourceMap(c.hamiResources)
	if err != nil {
		return usageError{fmt.Errorf("--hami-resources: %w", err)}
	}
	decoders, err := allocator.NewDecoders(strings.Split(c.allocators, ","), allocator.Options{
		Koordinator:     allocator.KoordinatorOptions{GPUResource: c.gpuResource, RDMAResource: c.rdmaResource, FPGAResource: c.fpgaResource},
		HAMi:            allocator.HAMiOptions{Resources: hamiResources, LegacyIndexing: c.hamiLegacyIndexing},
		VolcanoVGPU:     allocator.VolcanoVGPUOptions{Resource: c.gpuResource},
		VolcanoGPUShare: allocator.VolcanoGPUShareOptions{Resource: c.gpuResource},
		TensorFusion:    allocator.TensorFusionOptions{Resource: c.gpuResource},
	})
	if err != nil {
		return usageError{fmt.Errorf("--allocators: %w", err)}
	}
	allocators := allocator.NewSet(log, metrics.AnnotationError, decoders...)
	allocators.LimitDevicesPerPod(c.maxDevicesPerPod)
	if c.hamiLegacyIndexing {
		log.Warn("--hami-legacy-indexing is deprecated and has no effect: every HAMi version's list is read the same way")
	}
	schedulers, err := c.trustedSchedulers()
	if err != nil {
		return usageError{err}
	}
	trust := allocator.NewGate(allocators, allocator.GateOptions{SchedulerNames: schedulers, Log: log, OnRefuse: metrics.AllocationRefused})
	inv, err := c.inventory(log)
	if err != nil {
		return fmt.Errorf("device inventory: %w", err)
	}
	names := inventory.ResourceNames{inventory.TypeGPU: c.gpuResource, inventory.TypeRDMA: c.rdmaResource, inventory.TypeFPGA: c.fpgaResource}

	store, err := state.Open(c.stateDir, state.Options{Decoder: allocators, PruneAfter: c.pruneAfter, Log: log})
	if err != nil {
		return fmt.Errorf("open state store: %w", err)
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.WithError(err).Error("closing the state store")
		}
	}()
	registerStoreMetrics(reg, store)

	pods, err := kubeletpods.NewClient(kubeletpods.Config{
		URL:         c.podsURL,
		TokenFile:   c.tokenFile,
		CAFile:      c.caFile,
		InsecureTLS: c.insecureTLS,
		Timeout:     c.podsTimeout,
		// Only the allocators' annotations: a /pods read keeps little.
		KeepAnnotation: allocators.Relevant,
	})
	if err != nil {
		return fmt.Errorf("kubelet /pods client: %w", err)
	}
	if c.insecureTLS {
		log.Warn("--kubelet-insecure-tls: the kubelet's serving certificate is not verified")
	}
	reader := kubeletpods.NewReader(proxy.RecordingFetch(pods.Pods, store),
		kubeletpods.ReaderOptions{Timeout: c.podsTimeout, OnRead: metrics.ObservePodsRead})

	var deviceInfo *devinfo.Writer
	if c.deviceInfoDir != "" {
		deviceInfo = devinfo.New(devinfo.Options{Dir: c.deviceInfoDir, SysfsRoot: c.sysfsRoot, Log: log,
			Inventory: func() allocator.Inventory { return inv.Snapshot() }})
	}
	srv, err := proxy.New(proxy.Config{
		Socket:         c.socket,
		KubeletSocket:  c.kubeletSocket,
		RateLimitQPS:   c.qps,
		RateLimitBurst: c.burst,
		MaxConnections: c.maxConns,
		RequestTimeout: c.requestTimeout,
		Log:            log,
	}, proxy.Deps{
		Store:       store,
		Pods:        reader,
		Allocators:  allocators,
		Metrics:     metrics,
		Topology:    inv.Topology,
		Allocatable: func() []*podresourcesv1.ContainerDevices { return inv.Allocatable(names) },
		Inventory:   func() allocator.Inventory { return inv.Snapshot() },
		Trust:       trust,

		PlainSharedGPUIDs: c.sharedGPUIDs == sharedGPUIDsUUID,
		MIGResource:       c.migResource,
		DeviceInfo:        deviceInfoWriter(deviceInfo),
	})
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var errsMu sync.Mutex
	var errs []error // of the parts that failed; collected, so no part ever blocks reporting
	start := func(name string, run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil && ctx.Err() == nil {
				errsMu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				errsMu.Unlock()
				cancel()
			}
		}()
	}

	// NFD asks GetAllocatableResources once at start: have the inventory
	// before serving, then keep it fresh. Publish it for inspect and query
	// before serving too, so that the file is there once serve is ready; a
	// failure to write it is logged and retried, never fatal.
	inv.Refresh(ctx)
	publisher := inventory.NewPublisher(inv, filepath.Join(c.stateDir, inventory.PublishedFileName))
	_ = publisher.Publish()
	start("inventory", inv.Run)
	start("inventory file", publisher.Run)
	start("proxy", srv.Serve)
	if deviceInfo != nil {
		// Files an earlier run left for pods gone meanwhile go at the first
		// release.
		deviceInfo.Adopt(c.rdmaResource)
		start("device-info files", func(ctx context.Context) error { return deviceInfo.Run(ctx, store, devinfo.DefaultInterval) })
	}
	pm := newPluginMetrics(reg)
	var reconciler *plugin.Reconciler
	if c.criSocket != "" {
		reconciler, err = plugin.NewReconciler(store, plugin.ReconcilerOptions{Endpoint: c.criSocket, Interval: c.criInterval, Log: log, Metrics: pm})
		if err != nil {
			cancel()
			wg.Wait()
			return fmt.Errorf("CRI reconciler: %w", err)
		}
		start("CRI reconciler", reconciler.Run)
	} else {
		log.Info("CRI reconciling disabled (--cri-socket is empty)")
	}
	if c.nriSocket != "" {
		opts := plugin.Options{Socket: c.nriSocket, Name: c.nriName, Index: c.nriIndex, Log: log, Metrics: pm}
		if reconciler != nil {
			// Synchronize does not say which sandboxes stopped while the
			// plugin was away; CRI does, so reconcile right after it.
			opts.OnSynchronized = reconciler.Trigger
		}
		nri, err := plugin.New(store, opts)
		if err != nil {
			cancel()
			wg.Wait()
			return fmt.Errorf("NRI plugin: %w", err)
		}
		start("NRI plugin", nri.Run)
	} else {
		log.Info("NRI plugin disabled (--nri-socket is empty): pods are learned from /pods and CRI only")
	}
	if c.metricsAddr != "" {
		start("metrics server", func(ctx context.Context) error {
			return serveMetrics(ctx, c.metricsAddr, reg, srv.Ready, log)
		})
	}

	<-ctx.Done()
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	grace := time.NewTimer(shutdownGrace)
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		// Leave the stragglers: the deferred Close still flushes the
		// store, which is what a restart needs.
		log.Errorf("some parts did not stop within %s; exiting without them", shutdownGrace)
	}
	errsMu.Lock()
	defer errsMu.Unlock()
	if len(errs) == 0 {
		log.Info("stopped")
	}
	return errors.Join(errs...)
}

// shutdownGrace bounds the wait for the parts to stop after SIGTERM, so
// that the state store is flushed well within the pod's termination grace
// period (30 s by default) even if a part hangs.
const shutdownGrace = 15 * time.Second

// inventory builds the device inventory from the configured sources.
func (c *serveConfig) inventory(log logrus.FieldLogger) (*inventory.Inventory, error) {
	cfg := inventory.Config{File: c.inventoryFile, Logger: log}
	switch {
	case !c.deviceCR:
	case c.nodeName == "":
		log.Info("Device object inventory off: no --node-name (or NODE_NAME)")
	case c.apiServer == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "":
		log.Info("Device object inventory off: not in a cluster and no --api-server")
	default:
		cfg.DeviceCR = &inventory.DeviceCROptions{APIServer: c.apiServer, TokenFile: c.apiTokenFile, CAFile: c.apiCAFile, NodeName: c.nodeName}
	}
	if c.sysfsRoot != "" {
		cfg.Sysfs = &inventory.SysfsOptions{SysfsRoot: c.sysfsRoot, ProcRoot: c.procfsRoot, Logger: log}
	}
	return inventory.NewFromConfig(cfg)
}

// serveMetrics serves /metrics, /healthz (the process answers) and /readyz
// (the PodResources socket is being served) until ctx is done.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready func() bool, log logrus.FieldLogger) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "the PodResources socket is not served yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.WithField("addr", l.Addr().String()).Info("serving /metrics, /healthz and /readyz")
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return nil
}
