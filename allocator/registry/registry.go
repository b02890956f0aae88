// Package registry builds the allocation decoders by name: the one place
// that knows every scheduler's format package (koordinator, hami, volcano,
// tensorfusion), their order, and their options, for the --allocators flag,
// and which scheduler writes which (Families, for the scheduler-names flags).
// It is apart from package allocator so that the Set and the attribution
// policy depend only on the Format interface, never on the formats.
package registry

import (
	"fmt"
	"slices"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator"
	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
)

// formats are the decoders NewFormats knows, in the order it builds them.
// Decoders whose devices replace the kubelet's come first: the merge drops
// a container's entries of a resource when the first replacing device
// reaches it, so a device another allocator added before would be dropped
// with the kubelet's.
var formats = []struct {
	name  string
	build func(Options) allocator.Format
}{
	{hami.Name, func(o Options) allocator.Format { return hami.New(o.HAMi) }},
	{volcano.VGPUName, func(o Options) allocator.Format { return volcano.NewVGPU(o.VolcanoVGPU) }},
	{koordinator.Name, func(o Options) allocator.Format { return koordinator.New(o.Koordinator) }},
	{volcano.GPUShareName, func(o Options) allocator.Format { return volcano.NewGPUShare(o.VolcanoGPUShare) }},
	{tensorfusion.Name, func(o Options) allocator.Format { return tensorfusion.New(o.TensorFusion) }},
}

// Names returns the name of every decoder NewFormats can build, in the
// order it builds them: the value of a command-line flag enabling them all.
func Names() []string {
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = f.name
	}
	return names
}

// Options configure the decoders NewFormats builds; each field is passed to
// its decoder's constructor.
type Options struct {
	Koordinator     koordinator.Options
	HAMi            hami.Options
	VolcanoVGPU     volcano.VGPUOptions
	VolcanoGPUShare volcano.GPUShareOptions
	TensorFusion    tensorfusion.Options
}

// NewFormats builds the decoders named, for a flag such as
// --allocators=koordinator,hami. Enabling all of them is harmless: each
// reads its own annotation keys only. They are built in the order of
// Names, whatever the order given. Unknown, repeated and empty names are
// errors, as is an empty list.
func NewFormats(enabled []string, opts Options) ([]allocator.Format, error) {
	names := Names()
	want := map[string]bool{}
	for _, n := range enabled {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			return nil, fmt.Errorf("empty allocator name (known: %s)", strings.Join(names, ", "))
		case !slices.Contains(names, n):
			return nil, fmt.Errorf("unknown allocator %q (known: %s)", n, strings.Join(names, ", "))
		case want[n]:
			return nil, fmt.Errorf("allocator %q named twice", n)
		}
		want[n] = true
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("no allocator named (known: %s)", strings.Join(names, ", "))
	}
	var out []allocator.Format
	for _, f := range formats {
		if want[f.name] {
			out = append(out, f.build(opts))
		}
	}
	return out, nil
}

// SchedulerNames returns the spec.schedulerName values of the pods whose
// annotations the allocator named is believed on by default
// (allocator.Scheduled), for the flags that override them; nil for a name
// NewFormats does not know.
func SchedulerNames(name string) []string {
	built, err := NewFormats([]string{name}, Options{})
	if err != nil {
		return nil
	}
	if s, ok := built[0].(allocator.Scheduled); ok {
		return s.SchedulerNames()
	}
	return nil
}

// Family is a scheduler whose pods' annotations are believed by their
// spec.schedulerName, as its serve flag --<Flag>-scheduler-names lists:
// the allocators whose annotations it writes (Volcano's two device plugins
// run in one scheduler), and how the flag's help names it and them.
type Family struct {
	Flag, Name, Annotations string
	Allocators              []string
}

// Families are the schedulers, one flag each.
var Families = []Family{
	{"koordinator", "Koordinator", "Koordinator", []string{koordinator.Name}},
	{"hami", "HAMi", "HAMi", []string{hami.Name}},
	{"volcano", "Volcano", "Volcano vGPU, gpushare and vNPU (HAMi's Ascend keys)", []string{volcano.VGPUName, volcano.GPUShareName}},
	{"tensorfusion", "TensorFusion", "TensorFusion", []string{tensorfusion.Name}},
}

// TrustedSchedulers returns the scheduler names per allocator, for
// trust.GateOptions, from each family's comma-separated list (list of its
// Flag). An empty list is an error: no pod's annotations of the family
// would be believed, which is never what an operator means.
func TrustedSchedulers(list func(flag string) string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, family := range Families {
		var names []string
		for _, n := range strings.Split(list(family.Flag), ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("--%s-scheduler-names is empty: name the scheduler(s) whose pods' %s annotations are believed", family.Flag, family.Annotations)
		}
		for _, a := range family.Allocators {
			out[a] = names
		}
	}
	return out, nil
}

// ParseResourceMap reads a flag value "key=resource,key=resource" into a
// map, such as HAMi's vendor words to resource names
// ("vgpu=nvidia.com/gpu,dcu=hygon.com/dcunum"). An empty resource is kept
// (for HAMiOptions.Resources it removes a default); an empty value is an
// empty map.
func ParseResourceMap(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ",") {
		key, value, ok := strings.Cut(pair, "=")
		key, value = strings.TrimSpace(key), strings.TrimSpace(value)
		if !ok || key == "" {
			return nil, fmt.Errorf("%q: want key=resource", strings.TrimSpace(pair))
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("%q given twice", key)
		}
		out[key] = value
	}
	return out, nil
}
