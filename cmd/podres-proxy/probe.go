package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/podres-proxy/podres-proxy/internal/cmdline"
)

// defaultProbeSocket is where the DaemonSet's serve listens for its own
// probes: a directory of the pod's own (an emptyDir).
const defaultProbeSocket = "/var/run/podres-proxy-probe/probe.sock"

// runProbe asks serve's --probe-socket for /healthz or /readyz: it returns
// nil on 200, an error saying what serve answered otherwise (exit 1), and a
// usage error for a wrong command line (exit 2). It is what the kubelet's
// exec probes run, so that a pod's readiness is its own process's even
// while another instance serves the node beside it.
func runProbe(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("probe", stderr)
	socket := fs.String("socket", defaultProbeSocket, "serve's --probe-socket")
	timeout := fs.Duration("timeout", 3*time.Second, "time limit for the answer")
	if err := cmdline.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 || (fs.Arg(0) != "healthz" && fs.Arg(0) != "readyz") {
		return cmdline.Usage(errors.New("want one of: healthz, readyz"))
	}
	if *timeout <= 0 {
		return cmdline.Usage(errors.New("--timeout must be positive"))
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", *socket)
		},
	}}
	// The host is a placeholder: the connection goes to the socket.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://podres-proxy/"+fs.Arg(0), nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", fs.Arg(0), resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
