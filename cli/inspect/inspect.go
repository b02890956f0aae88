// Package inspect is `podres-proxy inspect`: it prints serve's state store
// and the device inventory serve published, for an operator, without a
// lock, so that it works while serve runs. Each pod's devices are shown with
// the allocator that named them, and where the inventory puts them.
package inspect

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

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/cli/provenance"
	"github.com/podres-proxy/podres-proxy/internal/cmdline"
	"github.com/podres-proxy/podres-proxy/inventory/publish"
	"github.com/podres-proxy/podres-proxy/model"
	"github.com/podres-proxy/podres-proxy/state/record"
)

const usage = `usage: podres-proxy inspect [--state-dir DIR] [-o table|json] [NAMESPACE/NAME]
       podres-proxy inspect --inventory [--state-dir DIR] [-o table|json]

Prints the pods in the state store, as the files in DIR/pods say, with the
allocator of each device and, from the node inventory serve keeps in
DIR/inventory.json, its NUMA node and the inventory source that said so. It
takes no lock, so it works while serve runs. The json output is the list of
records in the format of docs/state-format.md.

With --inventory it prints the node inventory instead (json: the file, in the
format of docs/inventory.md).`

// Run is the inspect command: args are the arguments after "inspect". It
// prints the state store. Files that cannot be read are reported
// on stderr and the rest is still printed; only a state directory that
// cannot be read at all, or a NAMESPACE/NAME with no record, is an error.
func Run(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cmdline.NewFlagSet("inspect", stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, usage); fs.PrintDefaults() }
	dir := fs.String("state-dir", cmdline.DefaultStateDir, "the state directory to read")
	output := cmdline.Output(fs)
	showInventory := fs.Bool("inventory", false, "print the node inventory serve wrote to DIR/inventory.json instead of the pods")
	if err := cmdline.Parse(fs, args); err != nil {
		return err
	}
	pods := fs.Args()
	stdout, stderr, err := cmdline.Writers(*output, stdout, stderr)
	if err != nil {
		return err
	}
	if *showInventory {
		if len(pods) > 0 {
			return cmdline.Usage(fmt.Errorf("--inventory prints the whole node inventory; it takes no NAMESPACE/NAME (the pods' devices are shown without --inventory)"))
		}
		return printInventory(stdout, *dir, *output, time.Now())
	}
	var filter *model.PodKey
	switch len(pods) {
	case 0:
	case 1:
		ns, name, ok := cmdline.SplitPod(pods[0])
		if !ok {
			return cmdline.Usage(fmt.Errorf("want NAMESPACE/NAME, got %q", pods[0]))
		}
		filter = &model.PodKey{Namespace: ns, Name: name}
	default:
		return cmdline.Usage(fmt.Errorf("want at most one NAMESPACE/NAME, got %q", strings.Join(pods, " ")))
	}

	records, err := provenance.ReadRecords(*dir, func(err error) { fmt.Fprintf(stderr, "warning: %v\n", err) })
	if err != nil {
		return err
	}
	if filter != nil {
		records = slices.DeleteFunc(records, func(r *record.Record) bool { return r.Key() != *filter })
		if len(records) == 0 {
			return fmt.Errorf("no pod %s in state directory %s", filter, *dir)
		}
	}

	if *output == "json" {
		if records == nil {
			records = []*record.Record{} // [], not null
		}
		return printJSON(stdout, "records", records)
	}
	if len(records) == 0 {
		fmt.Fprintf(stderr, "no pods in state directory %s\n", *dir)
		return nil
	}
	// The inventory is an addition: without it the pods are still printed.
	inv, invPath, invErr := provenance.ReadInventory(*dir)
	if invErr != nil && !errors.Is(invErr, provenance.ErrNoInventoryFile) {
		fmt.Fprintf(stderr, "warning: %v\n", invErr)
	}
	now := time.Now()
	if err := printRecords(stdout, records, now); err != nil {
		return err
	}
	return printPlacement(stdout, records, inv, invPath, invErr, now)
}

// printJSON prints v as indented JSON.
func printJSON(out io.Writer, what string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", what, err)
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

// printPlacement lists each device of the records with its allocator and
// where the inventory puts it: the answer to "why does this pod have this
// device, and where does its NUMA node come from". Devices named by minor
// or index are translated through the inventory first, as the proxy does.
func printPlacement(out io.Writer, records []*record.Record, published *publish.File, path string, invErr error, now time.Time) error {
	hasDevices := slices.ContainsFunc(records, func(r *record.Record) bool { return len(r.Devices) > 0 })
	switch {
	case !hasDevices:
		return nil
	case errors.Is(invErr, provenance.ErrNoInventoryFile):
		_, err := fmt.Fprintf(out, "\nNUMA nodes unknown: no node inventory in %s (podres-proxy serve writes it at start).\n", path)
		return err
	case invErr != nil:
		_, err := fmt.Fprintf(out, "\nNUMA nodes unknown: the node inventory in %s cannot be read (see the warning).\n", path)
		return err
	}
	inv := published.Snapshot()
	fmt.Fprintf(out, "\nWhere the devices are, from the node inventory serve wrote %s ago to %s (sources: %s):\n",
		age(now, published.WrittenAt), path, orNone(strings.Join(published.Sources, ", ")))
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "POD\tRESOURCE\tDEVICE\tALLOCATOR\tNUMA")
	for _, r := range records {
		devs, _ := allocator.Translate(r.Devices, inv)
		for _, d := range devs {
			if len(d.IDs) == 0 {
				// Named by a number the inventory does not know.
				fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Name, d.Resource, deviceIDs(d)[0], d.Allocator, provenance.NUMAFacts{})
				continue
			}
			for _, id := range d.IDs {
				fmt.Fprintf(w, "%s/%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Name, d.Resource, printableID(id), d.Allocator, provenance.NUMAOf(inv, id))
			}
		}
	}
	return w.Flush()
}

// printInventory prints the inventory serve published: a table of every
// device and VF, or the file itself as json.
func printInventory(out io.Writer, dir, output string, now time.Time) error {
	published, path, err := provenance.ReadInventory(dir)
	if err != nil {
		return err
	}
	if output == "json" {
		return printJSON(out, "the inventory", published)
	}
	fmt.Fprintf(out, "Node inventory, written by serve %s ago to %s (sources: %s):\n",
		age(now, published.WrittenAt), path, orNone(strings.Join(published.Sources, ", ")))
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "TYPE\tDEVICE\tBUS-ID\tVF-OF\tNUMA\tSOURCE\tHEALTHY\tMINOR\tINDEX\tVENDOR")
	// Devices() is the snapshot's order: by type, then PCI address. A VF
	// is a row of its own, looked up as the proxy looks up the VF addresses
	// it adds (on its PF's node when it has none of its own).
	snap := published.Snapshot()
	for _, d := range snap.Devices() {
		fmt.Fprintf(w, "%s\t%s\t%s\t-\t%s\t%s\t%t\t%s\t%s\t%s\n", d.Type, orNone(d.ID), orNone(d.BusID),
			provenance.NUMAFactsOf(d), d.Source, d.Healthy, optInt(d.Minor), optInt(d.Index), orNone(d.Vendor))
		for _, vf := range d.VFs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%t\t-\t-\t%s\n", d.Type, vf.BusID, vf.BusID, orNone(d.BusID),
				provenance.NUMAOf(snap, vf.BusID), d.Source, d.Healthy, orNone(d.Vendor))
		}
	}
	return w.Flush()
}

func optInt(p *int64) string {
	if p == nil {
		return "-"
	}
	return strconv.FormatInt(*p, 10)
}

// printRecords prints one row per pod, like kubectl, then the decode errors
// in full: they are too long for a column and too important to cut.
func printRecords(out io.Writer, records []*record.Record, now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "NAMESPACE\tNAME\tUID\tSTATE\tSANDBOX\tCONTAINERS\tDEVICES\tERRORS\tSOURCES\tUPDATED")
	var withErrors, withRefused []*record.Record
	for _, r := range records {
		if len(r.DecodeErrors) > 0 {
			withErrors = append(withErrors, r)
		}
		if len(r.Refused) > 0 {
			withRefused = append(withRefused, r)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n",
			orNone(r.Namespace), orNone(r.Name), r.UID, r.State, orNone(shortID(r.SandboxID)),
			containersColumn(r.Containers), devicesColumn(r.Devices, r.Refused), len(r.DecodeErrors),
			sourcesColumn(r.Provenance), age(now, r.UpdatedAt))
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
	if len(withRefused) > 0 {
		fmt.Fprintln(out, "\nAllocations refused (not reported to consumers; forged: the pod has no right to the device, malformed: no device has that id):")
		for _, r := range withRefused {
			for _, x := range r.Refused {
				ids := make([]string, len(x.IDs))
				for i, id := range x.IDs {
					ids[i] = printableID(id)
				}
				fmt.Fprintf(out, "  %s/%s (uid %s): %s %s=%s: %s (%s): %s\n", r.Namespace, r.Name, r.UID,
					x.Allocator, x.Resource, orNone(strings.Join(ids, ",")), x.Reason, x.Class, x.Detail)
			}
		}
	}
	return nil
}

// printableID returns an id as it is when it is plain printable ASCII
// without spaces or commas, else quoted: ids come from annotations any
// tenant writes, and a terminal must not interpret them.
func printableID(id string) string {
	for _, c := range id {
		if c <= ' ' || c > '~' || c == ',' || c == '"' {
			return strconv.Quote(id)
		}
	}
	return id
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

func containersColumn(cs []record.Container) string {
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

// devicesColumn shows each device as resource=id(allocator), so that a pod
// whose annotations several allocators read says which one gave what, and
// marks the devices the trust rules refused with [refused].
func devicesColumn(ds []model.Device, refused []model.Refused) string {
	var parts []string
	for _, d := range ds {
		isRefused := slices.ContainsFunc(refused, func(x model.Refused) bool {
			return x.Allocator == d.Allocator && x.Resource == d.Resource && slices.Equal(x.IDs, d.IDs)
		})
		for _, id := range deviceIDs(d) {
			part := d.Resource + "=" + printableID(id)
			if d.Allocator != "" {
				part += "(" + d.Allocator + ")"
			}
			if isRefused {
				part += "[refused]"
			}
			parts = append(parts, part)
		}
	}
	return orNone(strings.Join(parts, ","))
}

// deviceIDs returns a device's ids, or what the allocator named when it gave
// no id (minor:N, index:N, or ? when nothing).
func deviceIDs(d model.Device) []string {
	if len(d.IDs) > 0 {
		return d.IDs
	}
	switch {
	case d.Minor != nil:
		return []string{"minor:" + strconv.FormatInt(*d.Minor, 10)}
	case d.Index != nil:
		return []string{"index:" + strconv.FormatInt(*d.Index, 10)}
	}
	return []string{"?"}
}

// sourcesColumn lists where the record's facts came from, sandbox first.
func sourcesColumn(s record.Provenance) string {
	var out []string
	for _, seen := range []*record.Seen{s.Sandbox, s.Annotations, s.Spec, s.Containers} {
		if seen != nil && !slices.Contains(out, string(seen.Origin)) {
			out = append(out, string(seen.Origin))
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
