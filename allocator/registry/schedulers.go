package registry

import (
	"fmt"
	"strings"

	"github.com/podres-proxy/podres-proxy/allocator/hami"
	"github.com/podres-proxy/podres-proxy/allocator/koordinator"
	"github.com/podres-proxy/podres-proxy/allocator/tensorfusion"
	"github.com/podres-proxy/podres-proxy/allocator/volcano"
)

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
