// Command podres-proxy serves the kubelet's PodResources API with the devices
// that centralized schedulers allocated, and lets operators look at what it
// knows: serve, inspect, query, probe and version.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/podres-proxy/podres-proxy/cli/inspect"
	"github.com/podres-proxy/podres-proxy/cli/query"
	"github.com/podres-proxy/podres-proxy/internal/cmdline"
)

// command is one subcommand. run gets the arguments after the subcommand's
// name and returns an error to print; a cmdline.UsageError exits with 2.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the proxy, the NRI plugin and the CRI reconciler", runServe},
		{"inspect", "print the state store (works while serve runs)", inspect.Run},
		{"query", "ask a PodResources socket: list | get NAMESPACE/NAME | allocatable", query.Run},
		{"probe", "ask serve's --probe-socket: healthz | readyz (the kubelet's exec probes)", runProbe},
		{"version", "print the version", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		return cmdline.ExitCode(c.name, c.run(ctx, args[1:], stdout, stderr), stderr)
	}
	fmt.Fprintf(stderr, "podres-proxy: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: podres-proxy COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'podres-proxy COMMAND -h' for a command's flags.")
}
