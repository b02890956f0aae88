// Command test-deviceplugin runs the e2e suite's fake device plugin by hand:
//
//	test-deviceplugin --registration-dir /tmp/node/kubelet/plugins_registry
//	test-deviceplugin --kubelet-socket /var/lib/kubelet/device-plugins/kubelet.sock
//
// As HAMi's NVIDIA device plugin, advertising GPU-<uuid>-0..3 per GPU:
//
//	test-deviceplugin --resource nvidia.com/gpu --devices GPU-903ecef4-bb8d-d7fe-65e2-e327e6258e76 --hami-split 4 ...
//
// It serves until SIGINT or SIGTERM.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/podres-proxy/podres-proxy/test/deviceplugin"
)

func main() {
	resource := pflag.String("resource", "example.com/dev", "extended resource name")
	devices := pflag.String("devices", "dev-0,dev-1", "comma-separated device ids")
	regDir := pflag.String("registration-dir", "", "kubelet plugin watcher directory (<root-dir>/plugins_registry)")
	kubeletSocket := pflag.String("kubelet-socket", "", "kubelet device manager registration socket")
	hamiSplit := pflag.Int("hami-split", 0, "if > 0, --devices are GPU UUIDs advertised as HAMi does: <uuid>-0 .. <uuid>-<N-1>")
	pflag.Parse()

	ids := strings.Split(*devices, ",")
	if *hamiSplit > 0 {
		ids = deviceplugin.HAMiDeviceIDs(ids, *hamiSplit)
	}
	p, err := deviceplugin.New(deviceplugin.Options{
		ResourceName:    *resource,
		DeviceIDs:       ids,
		RegistrationDir: *regDir,
		KubeletSocket:   *kubeletSocket,
		Logf:            log.Printf,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "test-deviceplugin:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := p.Run(ctx); err != nil {
		log.Fatal(err)
	}
	log.Printf("allocations: %v", p.Allocations())
}
