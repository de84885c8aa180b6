package chart

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// observability lists the dashboards (*.json) and the YAML files of
// files/observability, the chart's copy of config/observability.
func observability(t testing.TB) (dashboards, yamls []string) {
	dir := filepath.Join(chartDir, "files", "observability")
	return listFiles(t, dir, []string{"*.json"}), listFiles(t, dir, []string{"*.yaml", "*.yml"})
}

// observabilityFlags enables the dashboard and the PrometheusRule when the
// chart carries what they need.
func observabilityFlags(t testing.TB) []string {
	dashboards, yamls := observability(t)
	var flags []string
	if len(dashboards) > 0 {
		flags = append(flags, "--set", "dashboard.enabled=true")
	}
	if len(ruleGroups(t, yamls)) > 0 {
		flags = append(flags, "--set", "prometheusRule.enabled=true")
	}
	return flags
}

// ruleGroups returns the Prometheus rule groups of the YAML files (a rules
// file's top-level groups, or a PrometheusRule's spec.groups).
func ruleGroups(t testing.TB, yamls []string) []any {
	var groups []any
	for _, name := range yamls {
		var doc map[string]any
		readYAML(t, filepath.Join(chartDir, "files", "observability", name), &doc)
		if g, ok := doc["groups"].([]any); ok {
			groups = append(groups, g...)
		} else if g, _, _ := unstructured.NestedSlice(doc, "spec", "groups"); g != nil {
			groups = append(groups, g...)
		}
	}
	return groups
}

func TestDashboardConfigMap(t *testing.T) {
	dashboards, _ := observability(t)
	if len(dashboards) == 0 {
		_, stderr, err := runHelm(t, templateArgs([]string{redisValues}, "--set", "dashboard.enabled=true")...)
		if err == nil || !strings.Contains(stderr, "the chart carries no dashboard") {
			t.Errorf("dashboard.enabled without a dashboard: got %v, want a refusal saying so:\n%s", err, stderr)
		}
		return
	}
	cm := find(t, render(t, []string{redisValues}, "--set", "dashboard.enabled=true"), "ConfigMap", "limiter-dashboard")
	if got := cm.GetLabels()["grafana_dashboard"]; got != "1" {
		t.Errorf("label grafana_dashboard: got %q, want \"1\"", got)
	}
	for _, name := range dashboards {
		data, _, _ := unstructured.NestedString(cm.Object, "data", name)
		want := strings.TrimRight(string(readFile(t, filepath.Join(chartDir, "files", "observability", name))), "\n")
		if data != want {
			t.Errorf("data[%s] is not files/observability/%s", name, name)
		}
		if !json.Valid([]byte(data)) {
			t.Errorf("data[%s] is not JSON", name)
		}
	}
}

func TestPrometheusRule(t *testing.T) {
	_, yamls := observability(t)
	groups := ruleGroups(t, yamls)
	if len(groups) == 0 {
		_, stderr, err := runHelm(t, templateArgs([]string{redisValues}, "--set", "prometheusRule.enabled=true")...)
		if err == nil || !strings.Contains(stderr, "the chart carries no alert rules") {
			t.Errorf("prometheusRule.enabled without rules: got %v, want a refusal saying so:\n%s", err, stderr)
		}
		return
	}
	rule := find(t, render(t, []string{redisValues}, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.labels.release=prometheus"), "PrometheusRule", "")
	got, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	if len(got) != len(groups) {
		t.Errorf("PrometheusRule holds %d groups, files/observability %d", len(got), len(groups))
	}
	if want := toInt64(groups); !reflect.DeepEqual(toInt64(got), want) {
		t.Errorf("PrometheusRule groups differ from files/observability:\n got %v\nwant %v", got, want)
	}
	if rule.GetLabels()["release"] != "prometheus" {
		t.Errorf("PrometheusRule labels %v lack prometheusRule.labels", rule.GetLabels())
	}
}

// alertRule is one alerting rule of a rules file.
type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// alertRules returns the alerting rules of files/observability by name.
func alertRules(t *testing.T) map[string]alertRule {
	t.Helper()
	_, yamls := observability(t)
	rules := map[string]alertRule{}
	for _, g := range ruleGroups(t, yamls) {
		raw, err := json.Marshal(g)
		if err != nil {
			t.Fatal(err)
		}
		var group struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		}
		if err := json.Unmarshal(raw, &group); err != nil {
			t.Fatalf("rule group %s: %v", raw, err)
		}
		for _, r := range group.Rules {
			if r.Alert == "" {
				continue // a recording rule
			}
			if _, dup := rules[r.Alert]; dup {
				t.Errorf("alert %s is defined twice", r.Alert)
			}
			rules[r.Alert] = r
		}
	}
	return rules
}

// Every alert is actionable: a limiter metric to watch, a severity the
// routing knows, and a summary and description for whoever is paged.
func TestAlertRulesAreComplete(t *testing.T) {
	rules := alertRules(t)
	if len(rules) == 0 {
		t.Fatal("the chart carries no alert rules: it must ship them (files/observability/alerts.yaml)")
	}
	for name, r := range rules {
		if !strings.Contains(r.Expr, "limiter_") {
			t.Errorf("%s: expr %q watches no limiter metric", name, r.Expr)
		}
		if s := r.Labels["severity"]; s != "warning" && s != "critical" {
			t.Errorf("%s: severity %q, want warning or critical", name, s)
		}
		for _, a := range []string{"summary", "description"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s annotation", name, a)
			}
		}
	}
}

// A Redis that never answered (or stopped answering) pages even while no
// request arrives: the alert follows limiter_redis_up, not degraded grants.
func TestRedisDownAlert(t *testing.T) {
	r, ok := alertRules(t)["LimiterRedisDown"]
	if !ok {
		t.Fatal("no LimiterRedisDown alert in files/observability")
	}
	if strings.TrimSpace(r.Expr) != "limiter_redis_up == 0" {
		t.Errorf("LimiterRedisDown expr %q, want limiter_redis_up == 0", r.Expr)
	}
	if r.For == "" || r.Labels["severity"] != "critical" {
		t.Errorf("LimiterRedisDown: for %q, severity %q; want a for duration and critical", r.For, r.Labels["severity"])
	}
}
