package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"go.yaml.in/yaml/v3"
)

// poolAlertSeries are the input series of the LimiterPoolKeyAtCap rule
// test, one value a minute from 0m (promtool's notation: "1x12" is 1 for
// 13 minutes).
//
//   - model: a key at its cap from 7m to 25m on replica a (b's keys are
//     emptier: the max across replicas is what counts), refusing all along.
//   - org: a key at its cap all along, but nothing refused: full, not
//     turning anyone away.
//   - provider: at its cap from 3m to 15m, one minute under it at 16m, at
//     it again from 17m, refusing all along.
var poolAlertSeries = map[string]string{
	`limiter_pool_fill_max{instance="a",job="limiter",pool="model"}`:                           `0.5x6 1x18 0.5x6`,
	`limiter_pool_fill_max{instance="b",job="limiter",pool="model"}`:                           `0.3x30`,
	`limiter_pool_acquire_total{instance="a",job="limiter",outcome="limited",pool="model"}`:    `0+2x30`,
	`limiter_pool_fill_max{instance="a",job="limiter",pool="org"}`:                             `1x30`,
	`limiter_pool_acquire_total{instance="a",job="limiter",outcome="limited",pool="org"}`:      `0x30`,
	`limiter_pool_acquire_total{instance="a",job="limiter",outcome="granted",pool="org"}`:      `0+5x30`,
	`limiter_pool_fill_max{instance="a",job="limiter",pool="provider"}`:                        `0.5x2 1x12 0.9 1x14`,
	`limiter_pool_acquire_total{instance="a",job="limiter",outcome="limited",pool="provider"}`: `0+3x30`,
}

// TestPoolKeyAtCapAlert: the shipped LimiterPoolKeyAtCap fires for a pool
// whose key sat at its cap in every minute of the last 10 while the pool
// refused streams, by pool (never by key), with its summary and
// description filled in; and not for a pool full without refusals, nor
// while the last 10 minutes held one under the cap. Prometheus's own
// promtool evaluates the rules, as in the incident drill.
func TestPoolKeyAtCapAlert(t *testing.T) {
	promtool := testenv.Promtool(t)
	rules, err := filepath.Abs(filepath.Join("..", "config", "observability", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rule := shippedAlert(t, rules, "LimiterPoolKeyAtCap")

	var test promTest
	test.Interval = "1m"
	for name, values := range poolAlertSeries {
		test.Input = append(test.Input, promSeries{Series: name, Values: values})
	}
	for _, c := range []struct {
		at    int      // minutes
		pools []string // the pools it fires for
	}{
		{at: 10},                              // model and provider were under their caps within the 10 minutes
		{at: 14, pools: []string{"provider"}}, // 3m-14m at the cap
		{at: 20, pools: []string{"model"}},    // provider's minute under the cap is within the 10 minutes
		{at: 24, pools: []string{"model"}},
		{at: 28, pools: []string{"provider"}}, // model under its cap since 26m
	} {
		want := promCheck{EvalTime: fmt.Sprintf("%dm", c.at), AlertName: rule.Alert, Alerts: []promAlert{}}
		for _, pool := range c.pools {
			// The template's two fields: the pool, and the value (the
			// least fill of the 10 minutes, 1).
			fill := strings.NewReplacer("{{ $labels.pool }}", pool, "{{ $value }}", "1")
			want.Alerts = append(want.Alerts, promAlert{
				Labels:      map[string]string{"job": "limiter", "pool": pool, "severity": rule.Labels["severity"]},
				Annotations: map[string]string{"summary": fill.Replace(rule.Annotations["summary"]), "description": fill.Replace(rule.Annotations["description"])},
			})
		}
		test.Checks = append(test.Checks, want)
	}
	promtoolRules(t, promtool, rules, test)
}

// promTest is one test of `promtool test rules`, evaluated every minute:
// its input series (promtool's notation: "1x12" is 1 for 13 minutes) and
// the alerts expected to fire at given times.
type promTest struct {
	Interval string       `yaml:"interval"`
	Input    []promSeries `yaml:"input_series"`
	Checks   []promCheck  `yaml:"alert_rule_test"`
}

type promSeries struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

type promCheck struct {
	EvalTime  string      `yaml:"eval_time"`
	AlertName string      `yaml:"alertname"`
	Alerts    []promAlert `yaml:"exp_alerts"`
}

type promAlert struct {
	Labels      map[string]string `yaml:"exp_labels"`
	Annotations map[string]string `yaml:"exp_annotations"`
}

// promtoolRules has promtool evaluate the rules file at rules against test,
// and fails t, showing the test, when an expected alert does not fire as
// given or another does.
func promtoolRules(t *testing.T, promtool, rules string, test promTest) {
	t.Helper()
	test.Interval = "1m"
	doc, err := yaml.Marshal(map[string]any{"rule_files": []string{rules}, "evaluation_interval": "1m", "tests": []any{test}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "alert-test.yaml")
	if err := os.WriteFile(path, doc, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, promtool, "test", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s\nthe test:\n%s", err, out, doc)
	}
}

// shippedRule is an alerting rule of a rules file.
type shippedRule struct {
	Alert       string            `yaml:"alert"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// shippedAlert returns the alerting rule name of the rules file at path.
func shippedAlert(t *testing.T, path, name string) shippedRule {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []shippedRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Alert == name {
				return r
			}
		}
	}
	t.Fatalf("%s has no alert %s", path, name)
	return shippedRule{}
}

// TestPoolFailingOpenAlert: a pool key's shard that does not answer, the
// pool failing open, fires the shipped LimiterPoolFailingOpen for that
// pool while its degraded joins are within the last 5 minutes, and not
// LimiterFailingOpen: the plans' own limits held, their acquires counted
// by their verdicts (granted). A plan's own degraded grants fire
// LimiterFailingOpen for the plan, and not the pool's.
func TestPoolFailingOpenAlert(t *testing.T) {
	promtool := testenv.Promtool(t)
	rules, err := filepath.Abs(filepath.Join("..", "config", "observability", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	poolRule, planRule := shippedAlert(t, rules, "LimiterPoolFailingOpen"), shippedAlert(t, rules, "LimiterFailingOpen")
	var test promTest
	for name, values := range map[string]string{
		// model's shard down from 5m to 10m: 3 degraded joins a minute
		// (9 by 8m).
		`limiter_pool_acquire_total{instance="a",job="limiter",outcome="degraded",pool="model"}`: `0x5 3+3x4 15x20`,
		`limiter_pool_acquire_total{instance="a",job="limiter",outcome="granted",pool="org"}`:    `0+2x30`,
		`limiter_acquire_total{instance="a",job="limiter",outcome="granted",plan="paid"}`:        `0+5x30`,
		// free's users' shard down from 20m to 23m: 2 degraded grants a
		// minute (4 by 22m).
		`limiter_acquire_total{instance="a",job="limiter",outcome="degraded",plan="free"}`: `0x20 2+2x2 6x8`,
	} {
		test.Input = append(test.Input, promSeries{Series: name, Values: values})
	}
	fired := func(rule shippedRule, label, value, n string) []promAlert {
		fill := strings.NewReplacer("{{ $labels."+label+" }}", value, "{{ $value | humanize }}", n)
		return []promAlert{{
			Labels:      map[string]string{"job": "limiter", label: value, "severity": rule.Labels["severity"]},
			Annotations: map[string]string{"summary": fill.Replace(rule.Annotations["summary"]), "description": fill.Replace(rule.Annotations["description"])},
		}}
	}
	for _, c := range []struct {
		at         int
		pool, plan []promAlert
	}{
		{at: 4},
		{at: 8, pool: fired(poolRule, "pool", "model", "9")},
		{at: 18},
		{at: 22, plan: fired(planRule, "plan", "free", "4")},
		{at: 29},
	} {
		for _, want := range []struct {
			rule   shippedRule
			alerts []promAlert
		}{{poolRule, c.pool}, {planRule, c.plan}} {
			if want.alerts == nil {
				want.alerts = []promAlert{}
			}
			test.Checks = append(test.Checks, promCheck{EvalTime: fmt.Sprintf("%dm", c.at), AlertName: want.rule.Alert, Alerts: want.alerts})
		}
	}
	promtoolRules(t, promtool, rules, test)
}
