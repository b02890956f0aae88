// Command promrules writes the rule groups of a PrometheusRule object
// (monitoring.coreos.com/v1) as a plain Prometheus rule file, which is what
// promtool reads: hack/test.sh extracts deploy/components/monitoring's rules
// this way to run `promtool check rules` and `promtool test rules` on them.
//
// Usage:
//
//	promrules PROMETHEUSRULE.yaml > RULES.yaml
package main

import (
	"errors"
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "promrules:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: promrules PROMETHEUSRULE.yaml > RULES.yaml")
	}
	out, err := extract(args[0])
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}

// extract reads the PrometheusRule in file and returns its spec (the groups)
// as a rule file.
func extract(file string) ([]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var obj struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if obj.APIVersion != "monitoring.coreos.com/v1" || obj.Kind != "PrometheusRule" {
		return nil, fmt.Errorf("%s is a %s %s, not a monitoring.coreos.com/v1 PrometheusRule", file, obj.APIVersion, obj.Kind)
	}
	if len(obj.Spec.Groups) == 0 {
		return nil, fmt.Errorf("%s has no rule groups", file)
	}
	return yaml.Marshal(map[string]any{"groups": obj.Spec.Groups})
}
