// Package promexpr reads the queries of deploy/components/monitoring (the
// PrometheusRule's alerts and the Grafana dashboard's panels) and the metric
// names each selects, for the suites that check them against what a running
// serve serves.
package promexpr

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Query is one PromQL expression and where it is.
type Query struct {
	Where string // "alert NAME", or "panel TITLE query REFID"
	Expr  string
	Raw   string // a dashboard query as written, before GrafanaVars; "" for an alert
}

// The monitoring component's files, relative to the repository's root.
const (
	RuleFile      = "deploy/components/monitoring/prometheusrule.yaml"
	DashboardFile = "deploy/components/monitoring/dashboard.json"
)

// Load returns every alert's and every dashboard query's expression, the
// dashboard's variables replaced so that each parses as PromQL. It fails
// when a file is missing or not what it should be.
func Load(repo string) ([]Query, error) {
	var out []Query
	b, err := os.ReadFile(filepath.Join(repo, RuleFile))
	if err != nil {
		return nil, err
	}
	var rule struct {
		Spec struct {
			Groups []struct {
				Rules []struct{ Alert, Expr string } `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(b, &rule); err != nil {
		return nil, fmt.Errorf("%s: %w", RuleFile, err)
	}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			out = append(out, Query{Where: "alert " + r.Alert, Expr: r.Expr})
		}
	}
	if b, err = os.ReadFile(filepath.Join(repo, DashboardFile)); err != nil {
		return nil, err
	}
	panels, err := DashboardQueries(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	return append(out, panels...), nil
}

// DashboardQueries returns every query of a Grafana dashboard's JSON model
// (panels in rows included), its variables replaced (GrafanaVars) so that
// each parses as PromQL; Raw keeps it as written.
func DashboardQueries(b []byte) ([]Query, error) {
	var d struct{ Panels []panel }
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, err
	}
	var out []Query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, t := range p.Targets {
				out = append(out, Query{Where: fmt.Sprintf("panel %q query %s", p.Title, t.RefID), Expr: GrafanaVars.Replace(t.Expr), Raw: t.Expr})
			}
		}
	}
	walk(d.Panels)
	return out, nil
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
}

// GrafanaVars stand in for the dashboard's variables, so that its queries
// parse as PromQL.
var GrafanaVars = strings.NewReplacer("$__rate_interval", "5m", "${node}", ".*", "$node", ".*")

// Served returns the series names a /metrics answer in Prometheus' text
// format serves: a histogram's name_bucket, name_sum and name_count, any
// other family's name.
func Served(r io.Reader) (map[string]bool, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	served := map[string]bool{}
	for name, f := range families {
		if f.GetType() == dto.MetricType_HISTOGRAM {
			served[name+"_bucket"], served[name+"_sum"], served[name+"_count"] = true, true, true
			continue
		}
		served[name] = true
	}
	return served, nil
}

// Names parses expr and returns the metric names its selectors name, and
// the patterns of those that select names by a regular expression.
func Names(expr string) (names []string, patterns []*regexp.Regexp, err error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, nil, err
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		for _, m := range vs.LabelMatchers {
			switch {
			case m.Name != model.MetricNameLabel:
			case m.Type == labels.MatchEqual:
				names = append(names, m.Value)
			case m.Type == labels.MatchRegexp:
				re, rerr := regexp.Compile("^(?:" + m.Value + ")$")
				if rerr != nil {
					err = rerr
					return rerr
				}
				patterns = append(patterns, re)
			}
		}
		return nil
	})
	return names, patterns, err
}
