// Command podres-proxy serves the kubelet's PodResources API with the devices
// that centralized schedulers allocated, and lets operators look at what it
// knows: serve, inspect, query and version.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"flag"

	"github.com/spf13/pflag"
)

// command is one subcommand. run gets the arguments after the subcommand's
// name and returns an error to print; a usageError also prints the usage.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the proxy, the NRI plugin and the CRI reconciler", runServe},
		{"inspect", "print the state store (works while serve runs)", runInspect},
		{"query", "ask a PodResources socket: list | get NAMESPACE/NAME | allocatable", runQuery},
		{"version", "print the version", runVersion},
	}
}

// usageError marks a mistake in the command line: exit status 2.
type usageError struct{ error }

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
		err := c.run(ctx, args[1:], stdout, stderr)
		var ue usageError
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp), errors.Is(err, pflag.ErrHelp):
			return 0
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "podres-proxy %s: %v\n", c.name, err)
			return 2
		default:
			fmt.Fprintf(stderr, "podres-proxy %s: %v\n", c.name, err)
			return 1
		}
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

// newFlagSet returns a flag set that reports errors instead of exiting.
// serve's flags use it: their names and -h are an interface the deployment
// files and their tests read.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("podres-proxy "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// newCommandFlagSet returns a flag set for the commands that take
// positional arguments (inspect, query): pflag's, so that flags may come
// before, between or after them, as with kubectl.
func newCommandFlagSet(name string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("podres-proxy "+name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseFlags parses args, turning flag errors into usage errors.
func parseFlags(fs interface{ Parse([]string) error }, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) || errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	return nil
}

// checkOutput validates an -o flag.
func checkOutput(output string) error {
	if output != "table" && output != "json" {
		return usageError{fmt.Errorf("unknown output format %q (want table or json)", output)}
	}
	return nil
}
