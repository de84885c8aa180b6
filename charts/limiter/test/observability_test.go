package chart

import (
	"encoding/json"
	"path/filepath"
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
	if rule.GetLabels()["release"] != "prometheus" {
		t.Errorf("PrometheusRule labels %v lack prometheusRule.labels", rule.GetLabels())
	}
}
