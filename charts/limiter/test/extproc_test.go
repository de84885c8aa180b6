package chart

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/config"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// With extproc.enabled the pods serve the ext_proc server: extproc.addr
// and extproc.wait in the config file, a container port "extproc", a
// ClusterIP Service of its own, and a NetworkPolicy rule admitting the
// Envoy proxies on it. Without it, none of them.
func TestExtProcPort(t *testing.T) {
	tests := []struct {
		name    string
		flags   []string
		enabled bool
		port    int64
		svcPort int64
		wait    string
	}{
		{"off (default values)", nil, false, 9091, 9091, ""},
		{"on", []string{"--set", "extproc.enabled=true"}, true, 9091, 9091, "0s"},
		{"on, other ports, waiting", []string{"--set", "extproc.enabled=true", "--set", "server.extprocPort=7091", "--set", "extprocService.port=443",
			"--set", "extproc.wait=15s"}, true, 7091, 443, "15s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, []string{redisValues}, tt.flags...)

			ext, inConfig := configFile(t, objs)["extproc"].(map[string]any)
			if inConfig != tt.enabled {
				t.Fatalf("config extproc section present %v, want %v", inConfig, tt.enabled)
			}
			if tt.enabled && ext["addr"] != fmt.Sprintf(":%d", tt.port) {
				t.Errorf("config extproc.addr %v, want :%d", ext["addr"], tt.port)
			}
			if tt.enabled && ext["wait"] != tt.wait {
				t.Errorf("config extproc.wait %v, want %s", ext["wait"], tt.wait)
			}

			ports := containerPorts(t, container(t, podSpec(t, find(t, objs, "Deployment", ""))))
			got, has := ports["extproc"]
			if has != tt.enabled || (has && got != tt.port) {
				t.Errorf("container port extproc %d (present %v), want %d present %v", got, has, tt.port, tt.enabled)
			}

			var svcFound bool
			for _, s := range ofKind(objs, "Service") {
				if s.GetName() != "limiter-extproc" {
					continue
				}
				svcFound = true
				if typ, _, _ := unstructured.NestedString(s.Object, "spec", "type"); typ != "ClusterIP" {
					t.Errorf("Service limiter-extproc type %q, want ClusterIP", typ)
				}
				sp := servicePorts(t, s)
				if len(sp) != 1 || sp[0]["name"] != "extproc" || sp[0]["targetPort"] != "extproc" || sp[0]["port"] != tt.svcPort {
					t.Errorf("Service limiter-extproc ports %v, want extproc %d -> extproc", sp, tt.svcPort)
				}
			}
			if svcFound != tt.enabled {
				t.Errorf("Service limiter-extproc rendered %v, want %v", svcFound, tt.enabled)
			}

			rules := ingressByPort(t, find(t, objs, "NetworkPolicy", ""))
			if _, ok := rules["extproc"]; ok != tt.enabled {
				t.Errorf("NetworkPolicy rule for port extproc present %v, want %v (rules %v)", ok, tt.enabled, rules)
			}
		})
	}
}

// The Envoy configuration shipped in config/envoy points at the Service
// and port this chart renders for release "limiter" in namespace
// "limiter" with extproc.enabled.
func TestShippedEnvoyConfigTargetsTheChart(t *testing.T) {
	objs := render(t, []string{redisValues, extprocValues})
	var svc *unstructured.Unstructured
	for _, s := range ofKind(objs, "Service") {
		if s.GetName() == "limiter-extproc" {
			svc = s
		}
	}
	if svc == nil {
		t.Fatal("no Service limiter-extproc rendered")
	}
	port := servicePorts(t, svc)[0]["port"]
	host := svc.GetName() + "." + svc.GetNamespace() + ".svc.cluster.local"

	var policy map[string]any
	readYAML(t, filepath.Join(chartDir, "..", "..", "config", "envoy", "gateway", "envoyextensionpolicy.yaml"), &policy)
	ref, _, _ := unstructured.NestedSlice(policy, "spec", "extProc")
	backend := ref[0].(map[string]any)["backendRefs"].([]any)[0].(map[string]any)
	if backend["name"] != svc.GetName() || backend["namespace"] != svc.GetNamespace() || fmt.Sprint(backend["port"]) != fmt.Sprint(port) {
		t.Errorf("the EnvoyExtensionPolicy's backendRef %v, want Service %s/%s port %v", backend, svc.GetNamespace(), svc.GetName(), port)
	}
	bootstrap, err := os.ReadFile(filepath.Join(chartDir, "..", "..", "config", "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("address: %s, port_value: %v", host, port); !strings.Contains(string(bootstrap), want) {
		t.Errorf("config/envoy/envoy.yaml does not reach the limiter at %q", want)
	}
}

// server.tls.existingSecret puts the API and ext_proc listeners on TLS
// (http.tls.*) from the Secret, mounted as a directory; clientCA adds its
// ca.crt as the client CA, and needs the Secret.
func TestListenerTLS(t *testing.T) {
	plain := configFile(t, render(t, []string{redisValues}))["http"].(map[string]any)
	if _, ok := plain["tls"]; ok {
		t.Errorf("default values: http.tls %v, want none", plain["tls"])
	}
	objs := render(t, []string{redisValues, extprocValues})
	tls, _ := configFile(t, objs)["http"].(map[string]any)["tls"].(map[string]any)
	want := map[string]any{"certFile": "/etc/limiter/tls/tls.crt", "keyFile": "/etc/limiter/tls/tls.key", "clientCAFile": "/etc/limiter/tls/ca.crt"}
	for k, v := range want {
		if tls[k] != v {
			t.Errorf("http.tls.%s = %v, want %v", k, tls[k], v)
		}
	}
	pod := podSpec(t, find(t, objs, "Deployment", ""))
	var secret string
	for _, v := range pod["volumes"].([]any) {
		if m := v.(map[string]any); m["name"] == "tls" {
			secret, _, _ = unstructured.NestedString(m, "secret", "secretName")
		}
	}
	if secret != "limiter-tls" {
		t.Errorf("volume tls from Secret %q, want limiter-tls", secret)
	}
	_, stderr, err := runHelm(t, templateArgs([]string{redisValues}, "--set", "server.tls.clientCA=true")...)
	if err == nil || !strings.Contains(stderr, "server.tls.clientCA needs server.tls.existingSecret") {
		t.Errorf("clientCA without a Secret: %v %s, want the render refused", err, stderr)
	}
}

// The ext_proc server reads identity.* as `limiter proxy` does, so with
// extproc.enabled the chart renders the whole identity block, not only
// identity.pools: the headers, the default plan and the JWT (with the JWKS
// ConfigMap mounted), in a config file `limiter serve` accepts. Dropping
// identity.jwt would leave the server trusting the identity headers
// instead of verifying tokens.
func TestExtProcIdentity(t *testing.T) {
	jwt := []string{
		"--set", "identity.jwt.issuer=https://auth.example.com",
		"--set", "identity.jwt.audience=llm",
		"--set", "identity.jwt.userClaim=uid",
		"--set", "identity.jwt.planClaim=plan",
	}
	tests := []struct {
		name  string
		flags []string
		want  config.Identity // the fields compared below
		jwks  bool            // the JWKS ConfigMap is mounted
	}{
		{
			name: "the default headers",
			want: config.Identity{UserHeader: "X-User-Id", PlanHeader: "X-Plan"},
		},
		{
			name:  "other headers and a default plan",
			flags: []string{"--set", "identity.userHeader=X-Caller", "--set", "identity.planHeader=X-Tier", "--set", "identity.defaultPlan=free"},
			want:  config.Identity{UserHeader: "X-Caller", PlanHeader: "X-Tier", DefaultPlan: "free"},
		},
		{
			name:  "a JWT from a key set URL",
			flags: append([]string{"--set", "identity.jwt.jwksURL=https://auth.example.com/.well-known/jwks.json"}, jwt...),
			want: config.Identity{UserHeader: "X-User-Id", PlanHeader: "X-Plan", JWT: config.JWT{
				JWKSURL: "https://auth.example.com/.well-known/jwks.json", Issuer: "https://auth.example.com", Audience: "llm", UserClaim: "uid", PlanClaim: "plan"}},
		},
		{
			name:  "a JWT from a key set ConfigMap",
			flags: append([]string{"--set", "identity.jwt.jwks.existingConfigMap=llm-jwks"}, jwt...),
			want: config.Identity{UserHeader: "X-User-Id", PlanHeader: "X-Plan", JWT: config.JWT{
				JWKSFile: "/etc/limiter/jwks/jwks.json", Issuer: "https://auth.example.com", Audience: "llm", UserClaim: "uid", PlanClaim: "plan"}},
			jwks: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, []string{redisValues, extprocValues}, tt.flags...)
			cfg := loadRendered(t, objs, config.CommandServe)
			got := cfg.Identity
			if got.UserHeader != tt.want.UserHeader || got.PlanHeader != tt.want.PlanHeader || got.DefaultPlan != tt.want.DefaultPlan {
				t.Errorf("limiter serve reads identity headers %q/%q, default plan %q; want %q/%q, %q",
					got.UserHeader, got.PlanHeader, got.DefaultPlan, tt.want.UserHeader, tt.want.PlanHeader, tt.want.DefaultPlan)
			}
			w := tt.want.JWT
			if got.JWT.Enabled() != w.Enabled() || got.JWT.JWKSFile != w.JWKSFile || got.JWT.JWKSURL != w.JWKSURL ||
				got.JWT.Issuer != w.Issuer || got.JWT.Audience != w.Audience || got.JWT.PlanClaim != w.PlanClaim ||
				(w.Enabled() && got.JWT.UserClaim != w.UserClaim) {
				t.Errorf("limiter serve reads identity.jwt %+v, want %+v", got.JWT, w)
			}

			pod := podSpec(t, find(t, objs, "Deployment", ""))
			var mounted, fromConfigMap bool
			for _, m := range container(t, pod)["volumeMounts"].([]any) {
				if m.(map[string]any)["mountPath"] == "/etc/limiter/jwks" {
					mounted = true
				}
			}
			for _, v := range pod["volumes"].([]any) {
				if cm, _ := v.(map[string]any)["configMap"].(map[string]any); cm != nil && cm["name"] == "llm-jwks" {
					fromConfigMap = true
				}
			}
			if mounted != tt.jwks || fromConfigMap != tt.jwks {
				t.Errorf("JWKS: mounted %v, from ConfigMap llm-jwks %v; want %v", mounted, fromConfigMap, tt.jwks)
			}
		})
	}
}
