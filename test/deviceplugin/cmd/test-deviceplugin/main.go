// Command test-deviceplugin runs the e2e suite's fake device plugin by hand:
//
//	test-deviceplugin --registration-dir /tmp/node/kubelet/plugins_registry
//	test-deviceplugin --kubelet-socket /var/lib/kubelet/device-plugins/kubelet.sock
//
// It serves until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/podres-proxy/podres-proxy/test/deviceplugin"
)

func main() {
	resource := flag.String("resource", "example.com/dev", "extended resource name")
	devices := flag.String("devices", "dev-0,dev-1", "comma-separated device ids")
	regDir := flag.String("registration-dir", "", "kubelet plugin watcher directory (<root-dir>/plugins_registry)")
	kubeletSocket := flag.String("kubelet-socket", "", "kubelet device manager registration socket")
	flag.Parse()

	p, err := deviceplugin.New(deviceplugin.Options{
		ResourceName:    *resource,
		DeviceIDs:       strings.Split(*devices, ","),
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
