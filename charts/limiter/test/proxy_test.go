package chart

import (
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/config"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// mode: proxy runs `limiter proxy` in the same pod: its port behind the
// Service, its config (which the proxy command accepts), the JWKS
// ConfigMap mounted as a directory.
func TestProxyMode(t *testing.T) {
	objs := render(t, []string{redisValues, proxyValues})
	dep := find(t, objs, "Deployment", "")
	pod := podSpec(t, dep)
	c := container(t, pod)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	if len(args) == 0 || args[0] != "proxy" {
		t.Errorf("container args %v, want proxy first", args)
	}
	ports, _, _ := unstructured.NestedSlice(c, "ports")
	if p := ports[0].(map[string]any); p["name"] != "http" || p["containerPort"] != int64(8000) {
		t.Errorf("first container port %v, want http 8000", p)
	}
	svc := find(t, objs, "Service", "limiter")
	svcPorts, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	if p := svcPorts[0].(map[string]any); p["port"] != int64(8000) || p["targetPort"] != "http" {
		t.Errorf("Service port %v, want 8000 to http", p)
	}
	var mounted bool
	for _, m := range c["volumeMounts"].([]any) {
		if m.(map[string]any)["mountPath"] == "/etc/limiter/jwks" {
			mounted = true
		}
	}
	var fromConfigMap bool
	for _, v := range pod["volumes"].([]any) {
		if cm, _ := v.(map[string]any)["configMap"].(map[string]any); cm != nil && cm["name"] == "llm-jwks" {
			fromConfigMap = true
		}
	}
	if !mounted || !fromConfigMap {
		t.Errorf("JWKS: mounted %v, from ConfigMap llm-jwks %v; want both", mounted, fromConfigMap)
	}

	cfg := loadRendered(t, objs, config.CommandProxy)
	if cfg.Proxy.Upstream != "http://vllm.inference.svc:8000" || cfg.Proxy.Listen != ":8000" ||
		cfg.Identity.JWT.JWKSFile != "/etc/limiter/jwks/jwks.json" || cfg.Identity.JWT.Audience != "llm" {
		t.Errorf("rendered proxy config %+v, identity %+v; want the values", cfg.Proxy, cfg.Identity)
	}
}

func TestProxyModeRefusesWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values string
		want   string
	}{
		{"no upstream", "mode: proxy\n", "mode proxy needs proxy.upstream"},
		{"an upstream that is no URL", "mode: proxy\nproxy:\n  upstream: vllm:8000\n", "/proxy/upstream"},
		{"a key set without an issuer", "mode: proxy\nproxy:\n  upstream: http://v:8000\nidentity:\n  jwt:\n    jwksURL: https://auth/jwks\n    audience: llm\n", "identity.jwt needs identity.jwt.issuer"},
		{"an issuer without a key set", "mode: proxy\nproxy:\n  upstream: http://v:8000\nidentity:\n  jwt:\n    issuer: https://auth\n", "need a key set"},
		{"the admin API", "mode: proxy\nproxy:\n  upstream: http://v:8000\nadmin:\n  existingSecret: tokens\n", "serves no admin API"},
		{"the ext_proc server", "mode: proxy\nproxy:\n  upstream: http://v:8000\nextproc:\n  enabled: true\n", "extproc.enabled is set with mode proxy, which serves no ext_proc"},
		{"client certificates", "mode: proxy\nproxy:\n  upstream: http://v:8000\nserver:\n  tls:\n    existingSecret: tls\n    clientCA: true\n", "server.tls.clientCA is set with mode proxy"},
		{"an unknown mode", "mode: gateway\n", "/mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := runHelm(t, templateArgs([]string{redisValues, writeValues(t, tc.values)})...)
			if err == nil || !strings.Contains(stderr, tc.want) {
				t.Errorf("helm template: %v, stderr %q; want a refusal saying %q", err, stderr, tc.want)
			}
		})
	}
}
