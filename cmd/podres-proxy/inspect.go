package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/podres-proxy/podres-proxy/state"
)

const inspectUsage = `usage: podres-proxy inspect [--state-dir DIR] [-o table|json] [NAMESPACE/NAME]

Prints the pods in the state store, as the files in DIR/pods say. It takes no
lock, so it works while serve runs. The json output is the list of records in
the format of docs/state-format.md.`

// runInspect prints the state store. Files that cannot be read are reported
// on stderr and the rest is still printed; only a state directory that
// cannot be read at all, or a NAMESPACE/NAME with no record, is an error.
func runInspect(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect", stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, inspectUsage); fs.PrintDefaults() }
	dir := fs.String("state-dir", defaultStateDir, "the state directory to read")
	output := fs.String("o", "table", "output format: table or json")
	pods, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := checkOutput(*output); err != nil {
		return err
	}
	var filter *state.PodKey
	switch len(pods) {
	case 0:
	case 1:
		ns, name, ok := strings.Cut(pods[0], "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return usageError{fmt.Errorf("want NAMESPACE/NAME, got %q", pods[0])}
		}
		filter = &state.PodKey{Namespace: ns, Name: name}
	default:
		return usageError{fmt.Errorf("want at most one NAMESPACE/NAME, got %q", strings.Join(pods, " "))}
	}

	records, errs := state.ReadDir(*dir)
	for _, err := range errs {
		var fe *state.FileError
		if !errors.As(err, &fe) {
			return err // the directory itself
		}
		fmt.Fprintf(stderr, "warning: %v\n", err)
	}
	if filter != nil {
		records = slices.DeleteFunc(records, func(r *state.Record) bool { return r.Key() != *filter })
		if len(records) == 0 {
			return fmt.Errorf("no pod %s in state directory %s", filter, *dir)
		}
	}

	if *output == "json" {
		if records == nil {
			records = []*state.Record{}
		}
		b, err := json.MarshalIndent(records, "", "  ")
		if err != nil {
			return fmt.Errorf("encode records: %w", err)
		}
		_, err = fmt.Fprintf(stdout, "%s\n", b)
		return err
	}
	if len(records) == 0 {
		fmt.Fprintf(stderr, "no pods in state directory %s\n", *dir)
		return nil
	}
	return printRecords(stdout, records, time.Now())
}

// printRecords prints one row per pod, like kubectl, then the decode errors
// in full: they are too long for a column and too important to cut.
func printRecords(out io.Writer, records []*state.Record, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "NAMESPACE\tNAME\tUID\tSTATE\tSANDBOX\tCONTAINERS\tDEVICES\tERRORS\tSOURCES\tUPDATED")
	var withErrors []*state.Record
	for _, r := range records {
		if len(r.DecodeErrors) > 0 {
			withErrors = append(withErrors, r)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n",
			orNone(r.Namespace), orNone(r.Name), r.UID, r.State, orNone(shortID(r.SandboxID)),
			containersColumn(r.Containers), devicesColumn(r.Devices), len(r.DecodeErrors),
			sourcesColumn(r.Sources), age(now, r.UpdatedAt))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(withErrors) > 0 {
		fmt.Fprintln(out, "\nAllocator annotations that could not be decoded (the pod is answered without those devices):")
		for _, r := range withErrors {
			for _, e := range r.DecodeErrors {
				fmt.Fprintf(out, "  %s/%s (uid %s): %s\n", r.Namespace, r.Name, r.UID, e)
			}
		}
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// shortID shortens a runtime id the way crictl and docker do.
func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

func containersColumn(cs []state.Container) string {
	var parts []string
	for _, c := range cs {
		name := c.Name
		if name == "" {
			name = shortID(c.ID)
		}
		parts = append(parts, name+":"+string(c.State))
	}
	return orNone(strings.Join(parts, ","))
}

func devicesColumn(ds []state.Device) string {
	var parts []string
	for _, d := range ds {
		ids := d.IDs
		if len(ids) == 0 {
			// Not translated to an id (yet): show what the allocator named.
			id := "?"
			if d.Minor != nil {
				id = "minor:" + strconv.FormatInt(*d.Minor, 10)
			} else if d.Index != nil {
				id = "index:" + strconv.FormatInt(*d.Index, 10)
			}
			ids = []string{id}
		}
		for _, id := range ids {
			parts = append(parts, d.Resource+"="+id)
		}
	}
	return orNone(strings.Join(parts, ","))
}

// sourcesColumn lists where the record's facts came from, sandbox first.
func sourcesColumn(s state.Sources) string {
	var out []string
	for _, seen := range []*state.Seen{s.Sandbox, s.Annotations, s.Spec, s.Containers} {
		if seen != nil && !slices.Contains(out, string(seen.Source)) {
			out = append(out, string(seen.Source))
		}
	}
	return orNone(strings.Join(out, ","))
}

// age is how long ago t was, in the style of kubectl's AGE column.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < 10*time.Minute:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 3*time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return strconv.Itoa(int(d.Hours()/24)) + "d"
	}
}
