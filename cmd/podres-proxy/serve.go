package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/sirupsen/logrus"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/registry"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
	"github.com/podres-proxy/podres-proxy/devinfo"
	"github.com/podres-proxy/podres-proxy/internal/cmdline"
	"github.com/podres-proxy/podres-proxy/inventory"
	"github.com/podres-proxy/podres-proxy/inventory/localfile"
	"github.com/podres-proxy/podres-proxy/inventory/publish"
	"github.com/podres-proxy/podres-proxy/inventory/sysfs"
	"github.com/podres-proxy/podres-proxy/kubeletpods"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podlogs"
	"github.com/podres-proxy/podres-proxy/kubeletpods/podsapi"
	"github.com/podres-proxy/podres-proxy/metrics"
	"github.com/podres-proxy/podres-proxy/plugin"
	"github.com/podres-proxy/podres-proxy/proxy"
	"github.com/podres-proxy/podres-proxy/state"
	"github.com/podres-proxy/podres-proxy/trust"
)

const (
	defaultTokenFile   = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	defaultNRISocket   = "/var/run/nri/nri.sock"
	defaultCRISocket   = "unix:///run/containerd/containerd.sock"
	defaultMetricsAddr = "127.0.0.1:9477"
)

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
		return cmdline.Usage(fmt.Errorf("--log-level: %w", err))
	}
	log.SetLevel(level)
	return serve(ctx, c, log)
}

// serve runs every part until ctx is done or one of them fails.
func serve(ctx context.Context, c *serveConfig, log *logrus.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg) // every part counts into it
	events := c.newEvents(m, log)

	hamiResources, err := registry.ParseResourceMap(c.hamiResources)
	if err != nil {
		return cmdline.Usage(fmt.Errorf("--hami-resources: %w", err))
	}
	decoders, err := registry.NewFormats(strings.Split(c.allocators, ","), registry.Options{
		Koordinator:     koordinator.Options{GPUResource: c.gpuResource, RDMAResource: c.rdmaResource, FPGAResource: c.fpgaResource},
		HAMi:            hami.Options{Resources: hamiResources},
		VolcanoVGPU:     volcano.VGPUOptions{Resource: c.gpuResource},
		VolcanoGPUShare: volcano.GPUShareOptions{Resource: c.gpuResource},
		TensorFusion:    tensorfusion.Options{Resource: c.gpuResource},
	})
	if err != nil {
		return cmdline.Usage(fmt.Errorf("--allocators: %w", err))
	}
	allocators := allocator.NewSet(log, m, decoders...)
	allocators.LimitDevicesPerPod(c.maxDevicesPerPod)
	trust := trust.NewGate(allocators, trust.GateOptions{SchedulerNames: c.schedulers, Log: log, Metrics: m})
	inv, watchInventory, err := c.inventory(log)
	if err != nil {
		return fmt.Errorf("device inventory: %w", err)
	}
	names := inventory.ResourceNames{inventory.TypeGPU: c.gpuResource, inventory.TypeRDMA: c.rdmaResource, inventory.TypeFPGA: c.fpgaResource}

	// Wait: the old instance of a rolling update may still write the
	// directory; this one serves meanwhile and takes it over when it lets go.
	store, err := state.Open(c.stateDir, state.Options{Decoder: allocators, PruneAfter: c.pruneAfter, Log: log, Wait: true})
	if err != nil {
		return fmt.Errorf("open state store: %w", err)
	}
	defer func() {
		writing := store.Stats().Writing
		if err := store.Close(); err != nil {
			log.WithError(err).Error("closing the state store")
		} else if writing {
			log.Info("wrote the state store and let go of its directory")
		}
	}()
	m.WatchStore(func() metrics.StoreStats {
		s := store.Stats()
		return metrics.StoreStats{Writing: s.Writing, Records: s.Records, Pending: s.Pending, Writes: s.Writes, WriteErrors: s.WriteErrors,
			CorruptFiles: s.CorruptFiles, LastDurable: s.LastDurable, MaxDurable: s.MaxDurable}
	})

	pods, err := kubeletpods.NewClient(kubeletpods.Config{
		URL:         c.podsURL,
		TokenFile:   c.tokenFile,
		CAFile:      c.caFile,
		InsecureTLS: c.insecureTLS,
		Timeout:     c.podsTimeout,
		// Only the allocators' annotations, each within its bound: a /pods
		// read keeps little, whatever a tenant writes.
		MaxAnnotationBytes: allocators.MaxAnnotationBytes,
	})
	if err != nil {
		return fmt.Errorf("kubelet /pods client: %w", err)
	}
	if c.insecureTLS {
		log.Warn("--kubelet-insecure-tls: the kubelet's serving certificate is not verified")
	}
	// Every read of /pods made for queries is counted by source, whether or
	// not the Pods API is configured: the dashboards that watch
	// pod_source_reads_total{source="pods"} see a node without the gate too.
	fetch := kubeletpods.Counted(pods.Pods, func() { m.PodSourceRead(podsapi.SourcePods) })
	var (
		podsAPI  *podsapi.Source
		watching func() bool
	)
	if c.podsAPISocket != "" {
		podsAPI, err = podsapi.New(podsapi.Options{
			Socket:             c.podsAPISocket,
			MaxAnnotationBytes: allocators.MaxAnnotationBytes,
			Handler:            kubeletpods.Watched(store),
			Metrics:            m,
			Log:                log,
		})
		if err != nil {
			return cmdline.Usage(fmt.Errorf("--kubelet-pods-api-socket: %w", err))
		}
		defer podsAPI.Close()
		fetch = podsAPI.Or(pods.Pods)
		watching = podsAPI.Synced
	} else {
		log.Info("the kubelet's Pods API is disabled (--kubelet-pods-api-socket is empty): pods are learned from /pods")
	}
	fetch = events.watchPods(fetch)
	providers := proxy.Providers{
		Store:            store,
		Pods:             fetch,
		PodLogs:          podlogs.New(c.podLogsDir, nil),
		Watching:         watching,
		Allocators:       allocators,
		Inventory:        inv.Snapshot,
		InventoryChanged: inv.Changed,
		ResourceNames:    names,
		Trust:            trust,
		Metrics:          m,
		Report:           events.report(),

		MIGResource: c.migResource,
	}
	var legacy *legacyView
	if c.servesLegacy() {
		if legacy, err = newLegacyView(c, podsAPI, pods.Pods, m, events.draUnfolded(store), log); err != nil {
			return err
		}
		providers.Fold = legacy.view
	}
	// Set only when on: a nil *devinfo.Writer in the interface would not be nil.
	var deviceInfo *devinfo.Writer
	if c.deviceInfoDir != "" {
		deviceInfo = devinfo.New(devinfo.Options{Dir: c.deviceInfoDir, SysfsRoot: c.sysfsRoot, Log: log, Inventory: inv.Snapshot})
		providers.DeviceInfo = deviceInfo
	}
	srv, err := proxy.New(proxy.Config{
		Socket:                  c.socket,
		Views:                   c.views,
		KubeletSocket:           c.kubeletSocket,
		RateLimitQPS:            c.qps,
		RateLimitBurst:          c.burst,
		MaxConnections:          c.maxConns,
		MaxConnectionsPerClient: c.maxConnsPerClient,
		RequestTimeout:          c.requestTimeout,
		PodsTimeout:             c.podsTimeout,
		Log:                     log,
	}, providers)
	if err != nil {
		return err
	}
	m.WatchReady(srv.Ready)

	secureMetrics, err := c.secureMetrics(reg, log)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The first part to fail stops the others; a part's error after the
	// stop (its context ended) is not a failure.
	g, gctx := errgroup.WithContext(ctx)
	start := func(name string, run func(context.Context) error) {
		g.Go(func() error {
			if err := run(gctx); err != nil && gctx.Err() == nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}

	// NFD asks GetAllocatableResources once at start: have the inventory
	// before serving, then keep it fresh. Publish it for inspect and query
	// before serving too, so that the file is there once serve is ready; a
	// failure to write it is logged and retried, never fatal. Only the
	// writer of the state directory writes in it: an instance waiting for
	// the old one to let go publishes once it has.
	start("Device object watch", watchInventory)
	inv.Refresh(ctx)
	publisher := publish.New(inv, filepath.Join(c.stateDir, publish.FileName), log)
	select {
	case <-store.Writing():
		_ = publisher.Publish()
	default: // published once this instance writes the directory
	}
	start("inventory", inv.Run)
	start("inventory file", whenWriter(store, func(ctx context.Context) error {
		_ = publisher.Publish()
		return publisher.Run(ctx)
	}))
	if podsAPI != nil {
		start("kubelet Pods API watch", podsAPI.Run)
	}
	start("proxy", srv.Serve)
	start("Events", events.run(store))
	if legacy != nil {
		// As the inventory, before serving: NFD asks
		// GetAllocatableResources once, at its start.
		start("DRA legacy view", legacy.run)
		if err := legacy.source.Wait(ctx); err != nil {
			log.WithError(err).Warn("DRA: listing ResourceSlices and DeviceClasses failed; the legacy view folds nothing until a list succeeds")
		}
	}
	if deviceInfo != nil {
		// Files an earlier run left for pods gone meanwhile go at the first
		// release. Both instances of a rolling update write the files of
		// the devices they answer with (neither replaces the other's);
		// the old one releases files until it lets go of the state
		// directory, and this one adopts its files then.
		start("device-info files", whenWriter(store, func(ctx context.Context) error {
			deviceInfo.Adopt(c.rdmaResource)
			return deviceInfo.Run(ctx, store, devinfo.DefaultInterval)
		}))
	}
	var reconciler *plugin.Reconciler
	if c.criSocket != "" {
		reconciler, err = plugin.NewReconciler(store, plugin.CRIOptions{Endpoint: c.criSocket, Interval: c.criInterval, Log: log, Metrics: m})
		if err != nil {
			cancel()
			_ = g.Wait()
			return fmt.Errorf("CRI reconciler: %w", err)
		}
		start("CRI reconciler", reconciler.Run)
	} else {
		log.Info("CRI reconciling disabled (--cri-socket is empty)")
	}
	if c.nriSocket != "" {
		opts := plugin.Options{Socket: c.nriSocket, Name: c.nriName, Index: c.nriIndex, Log: log, Metrics: events.watchNRI(m)}
		if reconciler != nil {
			// Synchronize does not say which sandboxes stopped while the
			// plugin was away; CRI does, so reconcile right after it.
			opts.OnSynchronized = reconciler.Trigger
		}
		nri, err := plugin.New(store, opts)
		if err != nil {
			cancel()
			_ = g.Wait()
			return fmt.Errorf("NRI plugin: %w", err)
		}
		start("NRI plugin", nri.Run)
	} else {
		log.Info("NRI plugin disabled (--nri-socket is empty): pods are learned from /pods and CRI only")
	}
	if c.metricsAddr != "" {
		start("metrics server", func(ctx context.Context) error {
			return metrics.Serve(ctx, c.metricsAddr, reg, srv.Ready, log)
		})
	}
	if secureMetrics != nil {
		start("secure metrics server", secureMetrics)
	}
	if c.probeSocket != "" {
		start("probe socket", func(ctx context.Context) error {
			return metrics.ServeProbes(ctx, c.probeSocket, srv.Ready, log)
		})
	}

	<-gctx.Done()
	var failed error // the part that failed first, when one did
	if ctx.Err() == nil {
		failed = context.Cause(gctx)
	} else {
		log.Info("stopping: leaving NRI, finishing the calls in flight (long-lived clients are told to reconnect, to whichever instance serves the socket now), then writing the state store and letting go of it")
	}
	stopped := make(chan struct{})
	go func() { _ = g.Wait(); close(stopped) }()
	grace := time.NewTimer(shutdownGrace)
	defer grace.Stop()
	select {
	case <-stopped:
	case <-grace.C:
		// Leave the stragglers: the deferred Close still flushes the
		// store, which is what a restart needs.
		log.Errorf("some parts did not stop within %s; exiting without them", shutdownGrace)
	}
	if failed == nil {
		log.Info("stopped")
	}
	return failed
}

// whenWriter runs run once store writes its state directory: at once
// unless another instance still writes it.
func whenWriter(store *state.Store, run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		select {
		case <-store.Writing():
			return run(ctx)
		case <-ctx.Done():
			return nil
		}
	}
}

// shutdownGrace bounds the wait for the parts to stop after SIGTERM, so
// that the state store is flushed well within the pod's termination grace
// period (30 s by default) even if a part hangs.
const shutdownGrace = 15 * time.Second

// inventory builds the device inventory from the configured sources, in
// their order of precedence (see package inventory): the Device object,
// the operator's file, sysfs.
func (c *serveConfig) inventory(log logrus.FieldLogger) (*inventory.Inventory, func(context.Context) error, error) {
	var sources []inventory.Source
	watch := noWatch
	switch {
	case !c.deviceCR:
	case c.nodeName == "":
		log.Info("Device object inventory off: no --node-name (or NODE_NAME)")
	case c.apiServer == "" && os.Getenv("KUBERNETES_SERVICE_HOST") == "":
		log.Info("Device object inventory off: not in a cluster and no --api-server")
	default:
		src, run, err := c.deviceCRSource(log)
		if err != nil { // a CA file not mounted: the other sources serve
			log.WithError(err).Error("Device object inventory off")
			break
		}
		sources, watch = append(sources, src), run
	}
	if c.inventoryFile != "" {
		sources = append(sources, localfile.New(c.inventoryFile, 0))
	}
	if c.sysfsRoot != "" {
		sources = append(sources, sysfs.New(sysfs.Options{SysfsRoot: c.sysfsRoot, ProcRoot: c.procfsRoot, Logger: log}))
	}
	return inventory.New(inventory.Options{Sources: sources, Logger: log}), watch, nil
}
