package chart

import (
	"fmt"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The admin API has a listener of its own (admin.addr), a container port
// "admin" and a ClusterIP Service of its own, whatever service.type: it is
// never exposed with the API. Without admin tokens there is no admin API,
// so neither port nor Service.
func TestAdminListener(t *testing.T) {
	tests := []struct {
		name      string
		files     []string
		flags     []string
		wantAdmin bool
		wantPort  int64
	}{
		{"admin API off (default values)", []string{redisValues}, nil, false, 8081},
		{"admin API on (ci/cluster-values.yaml)", []string{clusterValues}, nil, true, 8081},
		{"admin API on, API on a LoadBalancer", []string{clusterValues}, []string{"--set", "service.type=LoadBalancer"}, true, 8081},
		{"another admin port", []string{clusterValues}, []string{"--set", "server.adminPort=7081", "--set", "adminService.port=443"}, true, 7081},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.files, tt.flags...)
			wantPort := tt.wantPort

			admin := configFile(t, objs)["admin"].(map[string]any)
			if got, want := admin["addr"], fmt.Sprintf(":%d", wantPort); got != want {
				t.Errorf("config admin.addr: got %v, want %q", got, want)
			}

			ports := containerPorts(t, container(t, podSpec(t, find(t, objs, "Deployment", ""))))
			gotPort, hasPort := ports["admin"]
			if hasPort != tt.wantAdmin || (hasPort && gotPort != wantPort) {
				t.Errorf("container port admin: got %v (present %v), want %d present %v", gotPort, hasPort, wantPort, tt.wantAdmin)
			}
			if ports["http"] == ports["admin"] || ports["ops"] == ports["admin"] {
				t.Errorf("container ports %v: the admin port is shared with another listener", ports)
			}

			// The API Service carries the API port only.
			for _, p := range servicePorts(t, find(t, objs, "Service", "limiter")) {
				if p["targetPort"] != "http" {
					t.Errorf("the API Service exposes %v, want only the http port", p)
				}
			}

			svcs := map[string]bool{}
			for _, s := range ofKind(objs, "Service") {
				svcs[s.GetName()] = true
			}
			if svcs["limiter-admin"] != tt.wantAdmin {
				t.Fatalf("Service limiter-admin rendered: got %v, want %v", svcs["limiter-admin"], tt.wantAdmin)
			}
			if !tt.wantAdmin {
				return
			}
			svc := find(t, objs, "Service", "limiter-admin")
			if got, _, _ := unstructured.NestedString(svc.Object, "spec", "type"); got != "ClusterIP" {
				t.Errorf("admin Service type: got %q, want ClusterIP whatever service.type", got)
			}
			sp := servicePorts(t, svc)
			if len(sp) != 1 || sp[0]["targetPort"] != "admin" {
				t.Errorf("admin Service ports: got %v, want one, to the admin port", sp)
			}
			sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
			if !reflect.DeepEqual(sel, map[string]string{"app.kubernetes.io/name": "limiter", "app.kubernetes.io/instance": "limiter"}) {
				t.Errorf("admin Service selector: got %v, want the pods' selector labels", sel)
			}
		})
	}
}

// A NetworkPolicy selects the pods and admits, per port, only the peers of
// networkPolicy.api, .ops and .admin; egress is open unless rules are given.
func TestNetworkPolicy(t *testing.T) {
	clientPeers := []any{map[string]any{
		"namespaceSelector": map[string]any{},
		"podSelector":       map[string]any{"matchLabels": map[string]any{"limiter.joishi.dev/client": "true"}},
	}}
	monitoringPeers := []any{map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "monitoring"}},
	}}
	supportPeers := []any{map[string]any{
		"podSelector": map[string]any{"matchLabels": map[string]any{"limiter.joishi.dev/support": "true"}},
	}}
	openEgress := []any{map[string]any{}}
	tests := []struct {
		name        string
		files       []string
		flags       []string
		wantIngress map[string][]any // port name -> from
		wantEgress  []any
	}{
		{
			name:        "default values: callers and Prometheus, egress open",
			files:       []string{redisValues},
			wantIngress: map[string][]any{"http": clientPeers, "ops": monitoringPeers},
			wantEgress:  openEgress,
		},
		{
			name:        "admin API on: support on the admin port",
			files:       []string{clusterValues},
			wantIngress: map[string][]any{"http": clientPeers, "ops": monitoringPeers, "admin": supportPeers},
			wantEgress:  openEgress,
		},
		{
			name:        "no API peers: the API port admits no pod",
			files:       []string{redisValues},
			flags:       []string{"--set", "networkPolicy.api.from=null"},
			wantIngress: map[string][]any{"ops": monitoringPeers},
			wantEgress:  openEgress,
		},
		{
			name:        "no peers at all: no ingress",
			files:       []string{redisValues},
			flags:       []string{"--set", "networkPolicy.api.from=null", "--set", "networkPolicy.ops.from=null"},
			wantIngress: map[string][]any{},
			wantEgress:  openEgress,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.files, tt.flags...)
			np := find(t, objs, "NetworkPolicy", "limiter")
			checkSelectsPods(t, np, find(t, objs, "Deployment", ""))
			types, _, _ := unstructured.NestedStringSlice(np.Object, "spec", "policyTypes")
			if !reflect.DeepEqual(types, []string{"Ingress", "Egress"}) {
				t.Errorf("policyTypes: got %v, want [Ingress Egress]", types)
			}
			if got := ingressByPort(t, np); !reflect.DeepEqual(got, tt.wantIngress) {
				t.Errorf("ingress by port:\n got %v\nwant %v", got, tt.wantIngress)
			}
			egress, found, _ := unstructured.NestedSlice(np.Object, "spec", "egress")
			if !found || !reflect.DeepEqual(egress, tt.wantEgress) {
				t.Errorf("egress: got %v, want %v", egress, tt.wantEgress)
			}
		})
	}

	t.Run("every port it names is a container port", func(t *testing.T) {
		for _, files := range [][]string{{redisValues}, {clusterValues}, {redisValues, networkPolicyValues}} {
			objs := render(t, files)
			ports := containerPorts(t, container(t, podSpec(t, find(t, objs, "Deployment", ""))))
			for port := range ingressByPort(t, find(t, objs, "NetworkPolicy", "")) {
				if _, ok := ports[port]; !ok {
					t.Errorf("%v: the NetworkPolicy admits port %q, which the container does not have (%v)", files, port, ports)
				}
			}
		}
	})

	t.Run("egress rules given replace the open rule", func(t *testing.T) {
		objs := render(t, []string{redisValues, networkPolicyValues})
		egress, _, _ := unstructured.NestedSlice(find(t, objs, "NetworkPolicy", "").Object, "spec", "egress")
		var want struct {
			NetworkPolicy struct {
				Egress []any `json:"egress"`
			} `json:"networkPolicy"`
		}
		readYAML(t, networkPolicyValues, &want)
		if !reflect.DeepEqual(egress, toInt64(want.NetworkPolicy.Egress)) {
			t.Errorf("egress:\n got %v\nwant %v (%s)", egress, want.NetworkPolicy.Egress, networkPolicyValues)
		}
	})

	t.Run("disabled", func(t *testing.T) {
		if n := len(ofKind(render(t, []string{redisValues}, "--set", "networkPolicy.enabled=false"), "NetworkPolicy")); n != 0 {
			t.Errorf("rendered %d NetworkPolicies with networkPolicy.enabled false, want 0", n)
		}
	})
}

// checkSelectsPods fails unless np's podSelector matches the labels of
// dep's pods (and only the release's: it must name the instance).
func checkSelectsPods(t *testing.T, np, dep *unstructured.Unstructured) {
	t.Helper()
	sel, _, _ := unstructured.NestedStringMap(np.Object, "spec", "podSelector", "matchLabels")
	labels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	if sel["app.kubernetes.io/instance"] != release {
		t.Errorf("podSelector %v does not name the release's instance", sel)
	}
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("podSelector %s=%s: the pods carry %s=%q", k, v, k, labels[k])
		}
	}
}

// ingressByPort returns the NetworkPolicy's ingress rules as port name ->
// peers; each rule must name exactly one port.
func ingressByPort(t *testing.T, np *unstructured.Unstructured) map[string][]any {
	t.Helper()
	ingress, found, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
	if !found {
		t.Fatal("the NetworkPolicy has no spec.ingress (null would admit nothing too, but say so with [])")
	}
	out := map[string][]any{}
	for _, r := range ingress {
		rule := r.(map[string]any)
		ports, _ := rule["ports"].([]any)
		if len(ports) != 1 {
			t.Fatalf("ingress rule %v: want exactly one port", rule)
		}
		p := ports[0].(map[string]any)
		if p["protocol"] != "TCP" {
			t.Errorf("ingress rule %v: protocol %v, want TCP", rule, p["protocol"])
		}
		from, _ := rule["from"].([]any)
		if len(from) == 0 {
			t.Errorf("ingress rule %v: no from, which would admit every source", rule)
		}
		out[p["port"].(string)] = from
	}
	return out
}

// containerPorts returns a container's ports by name.
func containerPorts(t *testing.T, c map[string]any) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	ports, _ := c["ports"].([]any)
	for _, p := range ports {
		m := p.(map[string]any)
		out[m["name"].(string)] = m["containerPort"].(int64)
	}
	return out
}

func servicePorts(t *testing.T, svc *unstructured.Unstructured) []map[string]any {
	t.Helper()
	list, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	out := make([]map[string]any, len(list))
	for i, p := range list {
		out[i] = p.(map[string]any)
	}
	return out
}
