// Package cmdline holds what podres-proxy's commands share about their
// command lines: the paths they use by default, usage errors and the exit
// status each error gives, their flag sets (pflag's), the -o formats, and
// the escaping of what inspect and query print.
package cmdline

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// The paths serve uses, and inspect and query read, by default.
const (
	DefaultSocket        = "/var/run/podres-proxy/pod-resources/kubelet.sock"
	DefaultKubeletSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
	DefaultStateDir      = "/var/lib/podres-proxy"
)

// UsageError marks a mistake in the command line: exit status 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usage marks err as a mistake in the command line.
func Usage(err error) error { return UsageError{err} }

// ExitCode is the exit status of a command that returned err, which it
// prints, after "podres-proxy NAME: ", to stderr: 0 for nil and for a help
// request, 2 for a usage error, 1 for any other error.
func ExitCode(name string, err error, stderr io.Writer) int {
	var ue UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pflag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "podres-proxy %s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "podres-proxy %s: %v\n", name, err)
		return 1
	}
}

// NewFlagSet returns the flag set of a command: pflag's, so that flags are
// --long as in kubectl and may come before, between or after positional
// arguments (inspect, query). It reports errors instead of exiting.
func NewFlagSet(name string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("podres-proxy "+name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// Parse parses args, turning flag errors into usage errors.
func Parse(fs *pflag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return UsageError{err}
	}
	return nil
}

// Output adds the -o flag of a command that prints a table or JSON.
func Output(fs *pflag.FlagSet) *string {
	return fs.StringP("output", "o", "table", "output format: table or json")
}

// Writers checks an -o value and returns stdout and stderr as such a
// command writes to them: through terminal, which escapes what tenants
// wrote, except a JSON stdout, whose encoder escapes it already.
func Writers(output string, stdout, stderr io.Writer) (io.Writer, io.Writer, error) {
	switch output {
	case "table":
		return terminal{stdout}, terminal{stderr}, nil
	case "json":
		return stdout, terminal{stderr}, nil
	}
	return nil, nil, UsageError{fmt.Errorf("unknown output format %q (want table or json)", output)}
}

// SplitPod splits a NAMESPACE/NAME argument; ok is false unless both parts
// are there and the name holds no further slash (no Kubernetes name does).
func SplitPod(arg string) (namespace, name string, ok bool) {
	namespace, name, ok = strings.Cut(arg, "/")
	return namespace, name, ok && namespace != "" && name != "" && !strings.Contains(name, "/")
}
