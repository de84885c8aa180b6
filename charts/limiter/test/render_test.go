package chart

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// valueSets are the values files every rendering test covers.
var valueSets = []struct {
	name  string
	files []string
}{
	{"default values", []string{redisValues}},
	{"cluster mode (ci/cluster-values.yaml)", []string{clusterValues}},
	{"restricted egress and custom peers", []string{redisValues, networkPolicyValues}},
	{"proxy mode (testdata/proxy-values.yaml)", []string{redisValues, proxyValues}},
	{"the ext_proc server on", []string{redisValues, extprocValues}},
	{"LimitPools (testdata/pools-values.yaml)", []string{redisValues, poolsValues}},
}

func TestLint(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			args := []string{"lint", chartDir, "--strict", "--namespace", namespace}
			for _, f := range vs.files {
				args = append(args, "--values", f)
			}
			out, stderr, err := runHelm(t, args...)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s%s", err, out, stderr)
			}
		})
	}
}

func TestTemplateRendersEveryObject(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			objs := render(t, vs.files)
			kinds := []string{
				"CustomResourceDefinition", "Deployment", "ConfigMap", "Service",
				"ServiceAccount", "Role", "RoleBinding", "PodDisruptionBudget", "LimitTier",
				"NetworkPolicy",
			}
			if !slices.Contains(vs.files, proxyValues) {
				kinds = append(kinds, "Secret") // the callers' tokens; mode proxy reads none
			}
			for _, kind := range kinds {
				if len(ofKind(objs, kind)) == 0 {
					t.Errorf("no %s rendered", kind)
				}
			}
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" {
					continue
				}
				if got := o.GetNamespace(); got != namespace {
					t.Errorf("%s/%s: namespace %q, want the release namespace %q", o.GetKind(), o.GetName(), got, namespace)
				}
			}
		})
	}
}

// redis.addrs has no default: a guessed address that does not exist would
// leave the pods ready while every plan fails open. So values.yaml alone,
// with its 3 replicas, is refused with a message saying what to set; with
// redis.addrs, or one replica on the embedded store, it renders.
func TestDefaultValuesNeedRedis(t *testing.T) {
	_, stderr, err := runHelm(t, templateArgs(nil)...)
	if err == nil {
		t.Fatal("helm template accepted the default values, whose redis.addrs is empty, with 3 replicas")
	}
	for _, want := range []string{"redis.addrs is empty", "replicaCount 3", "Set redis.addrs, or replicaCount: 1 for a trial"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("helm's error does not say %q:\n%s", want, stderr)
		}
	}

	t.Run("with redis.addrs", func(t *testing.T) {
		objs := render(t, nil, "--set", "redis.addrs={redis-cluster.redis.svc:6379}")
		addrs := configFile(t, objs)["redis"].(map[string]any)["addrs"]
		if !reflect.DeepEqual(addrs, []any{"redis-cluster.redis.svc:6379"}) {
			t.Errorf("config redis.addrs: got %v, want the address set", addrs)
		}
		dep := find(t, objs, "Deployment", "")
		if got := dep.Object["spec"].(map[string]any)["replicas"]; got != int64(3) {
			t.Errorf("replicas: got %v, want 3", got)
		}
		// A new pod ready before an old one stops: every replica serves.
		strategy, _, _ := unstructured.NestedMap(dep.Object, "spec", "strategy")
		want := map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxUnavailable": int64(0), "maxSurge": int64(1)}}
		if !reflect.DeepEqual(strategy, want) {
			t.Errorf("strategy: got %v, want %v", strategy, want)
		}
	})
	t.Run("one replica on the embedded store", func(t *testing.T) {
		objs := render(t, nil, "--set", "replicaCount=1")
		addrs := configFile(t, objs)["redis"].(map[string]any)["addrs"]
		if !reflect.DeepEqual(addrs, []any{}) {
			t.Errorf("config redis.addrs: got %v, want []", addrs)
		}
		if n := len(ofKind(objs, "PodDisruptionBudget")); n != 0 {
			t.Errorf("rendered %d PodDisruptionBudgets for one replica, want 0", n)
		}
		// The store lives in the pod: a rollout that started a second pod
		// before stopping the first would run two stores behind one
		// Service, each enforcing its own limits.
		strategy, _, _ := unstructured.NestedMap(find(t, objs, "Deployment", "").Object, "spec", "strategy")
		if want := map[string]any{"type": "Recreate"}; !reflect.DeepEqual(strategy, want) {
			t.Errorf("strategy on the embedded store: got %v, want %v", strategy, want)
		}
	})
}

func TestDefaultLimitTiers(t *testing.T) {
	objs := render(t, []string{redisValues})
	got := map[string]int64{}
	for _, lt := range ofKind(objs, "LimitTier") {
		n, _, _ := unstructured.NestedInt64(lt.Object, "spec", "maxConcurrentStreams")
		got[lt.GetName()] = n
	}
	want := map[string]int64{"free": 1, "paid": 3}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("LimitTiers: got %v, want %v", got, want)
	}
}

// limitPools become LimitPool objects, each field as given and nothing
// more: an unset maxConcurrentStreams stays unset (keys not listed are not
// capped), and the CRD defaults the rest. The default values hold none.
func TestLimitPools(t *testing.T) {
	if n := len(ofKind(render(t, []string{redisValues}), "LimitPool")); n != 0 {
		t.Errorf("the default values rendered %d LimitPools, want none", n)
	}
	objs := render(t, []string{redisValues, poolsValues})
	specs := map[string]any{}
	for _, lp := range ofKind(objs, "LimitPool") {
		specs[lp.GetName()] = lp.Object["spec"]
		if got := lp.GetLabels()["app.kubernetes.io/name"]; got == "" {
			t.Errorf("LimitPool %s has no app.kubernetes.io/name label: %v", lp.GetName(), lp.GetLabels())
		}
	}
	want := map[string]any{
		"model": map[string]any{
			"maxConcurrentStreams": int64(100),
			"keys":                 map[string]any{"gpt-4o": int64(500), "llama-70b": int64(64), "meta-llama/Llama-3.1-70B-Instruct": int64(16)},
		},
		"orgs": map[string]any{
			"pool": "org", "keys": map[string]any{"acme": int64(40)}, "maxWait": "10s", "failureMode": "Closed", "enforce": false,
		},
	}
	if !reflect.DeepEqual(specs, want) {
		t.Errorf("LimitPool specs: got %v, want %v", specs, want)
	}
	if got := find(t, objs, "LimitPool", "orgs").GetLabels()["team"]; got != "platform" {
		t.Errorf("LimitPool orgs label team: got %q, want platform", got)
	}
}

func TestDeploymentShape(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			dep := find(t, render(t, vs.files), "Deployment", "")
			spec := dep.Object["spec"].(map[string]any)
			if vs.name == "default values" {
				if got := spec["replicas"]; got != int64(3) {
					t.Errorf("replicas: got %v, want 3", got)
				}
			}
			ru, _, _ := unstructured.NestedMap(dep.Object, "spec", "strategy", "rollingUpdate")
			if fmt.Sprint(ru["maxUnavailable"]) != "0" || fmt.Sprint(ru["maxSurge"]) != "1" {
				t.Errorf("rollingUpdate: got %v, want maxUnavailable 0, maxSurge 1", ru)
			}
			pod := podSpec(t, dep)
			tsc, _ := pod["topologySpreadConstraints"].([]any)
			if len(tsc) == 0 || tsc[0].(map[string]any)["topologyKey"] != "kubernetes.io/hostname" {
				t.Errorf("topologySpreadConstraints: got %v, want one across kubernetes.io/hostname", tsc)
			}
			c := container(t, pod)
			for probe, path := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz", "startupProbe": "/healthz"} {
				gotPath, _, _ := unstructured.NestedString(c, probe, "httpGet", "path")
				gotPort, _, _ := unstructured.NestedFieldNoCopy(c, probe, "httpGet", "port")
				if gotPath != path || gotPort != "ops" {
					t.Errorf("%s: got %s on port %v, want %s on port ops", probe, gotPath, gotPort, path)
				}
			}
			for _, field := range []string{"requests", "limits"} {
				for _, res := range []string{"cpu", "memory", "ephemeral-storage"} {
					if v, _, _ := unstructured.NestedFieldNoCopy(c, "resources", field, res); v == nil {
						t.Errorf("resources.%s.%s is not set", field, res)
					}
				}
			}
			ann := dep.Object["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["annotations"].(map[string]any)
			if sum, _ := ann["checksum/config"].(string); len(sum) != 64 {
				t.Errorf("checksum/config annotation: got %q, want a sha256", sum)
			}
		})
	}
}

// The drain must end before SIGKILL: terminationGracePeriodSeconds above
// the preStop delay plus http.shutdownGrace.
func TestTerminationGraceCoversDrain(t *testing.T) {
	tests := []struct {
		name      string
		flags     []string
		wantGrace int64
	}{
		{"defaults: 5s preStop + 15s drain + 15s", nil, 35},
		{"a longer drain", []string{"--set", "server.shutdownGraceSeconds=60"}, 80},
		{"no preStop delay", []string{"--set", "server.preStopSleepSeconds=0"}, 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, []string{redisValues}, tt.flags...)
			pod := podSpec(t, find(t, objs, "Deployment", ""))
			if got := pod["terminationGracePeriodSeconds"]; got != tt.wantGrace {
				t.Errorf("terminationGracePeriodSeconds: got %v, want %d", got, tt.wantGrace)
			}
			cfg := configFile(t, objs)
			grace := strings.TrimSuffix(cfg["http"].(map[string]any)["shutdownGrace"].(string), "s")
			var graceSeconds int64
			fmt.Sscan(grace, &graceSeconds)
			if graceSeconds >= tt.wantGrace {
				t.Errorf("http.shutdownGrace %ss is not below terminationGracePeriodSeconds %d", grace, tt.wantGrace)
			}
		})
	}
}

// A change of the config file changes the pod template, so pods roll.
func TestConfigChangeRollsPods(t *testing.T) {
	sum := func(flags ...string) string {
		dep := find(t, render(t, []string{redisValues}, flags...), "Deployment", "")
		v, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "metadata", "annotations", "checksum/config")
		return v
	}
	before, after := sum(), sum("--set", "log.level=debug")
	if before == after {
		t.Errorf("checksum/config did not change with log.level: %s", before)
	}
}

// Every field the "restricted" Pod Security Standard checks
// (kubernetes.io/docs/concepts/security/pod-security-standards), on the
// rendered pod. TestAppliedObjectsAreAccepted also has the API server's
// PodSecurity admission judge the same pod.
func TestPodMeetsRestrictedProfile(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			pod := podSpec(t, find(t, render(t, vs.files), "Deployment", ""))
			psc, _ := pod["securityContext"].(map[string]any)
			check := func(what string, got, want any) {
				t.Helper()
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s: got %v, want %v", what, got, want)
				}
			}
			check("pod runAsNonRoot", psc["runAsNonRoot"], true)
			check("pod runAsUser", psc["runAsUser"], int64(65532))
			check("pod seccompProfile.type", nested(psc, "seccompProfile", "type"), "RuntimeDefault")
			for _, forbidden := range []string{"hostNetwork", "hostPID", "hostIPC"} {
				if v, ok := pod[forbidden]; ok && v != false {
					t.Errorf("pod %s: got %v, want unset or false", forbidden, v)
				}
			}
			for _, vol := range pod["volumes"].([]any) {
				v := vol.(map[string]any)
				for key := range v {
					switch key {
					case "name", "configMap", "secret", "emptyDir", "projected", "downwardAPI", "persistentVolumeClaim", "ephemeral", "csi":
					default:
						t.Errorf("volume %v: type %s is not allowed by the restricted profile", v["name"], key)
					}
				}
			}
			for _, kind := range []string{"initContainers", "containers"} {
				list, _ := pod[kind].([]any)
				for _, item := range list {
					c := item.(map[string]any)
					sc, _ := c["securityContext"].(map[string]any)
					name := kind + "/" + c["name"].(string)
					check(name+" allowPrivilegeEscalation", sc["allowPrivilegeEscalation"], false)
					check(name+" readOnlyRootFilesystem", sc["readOnlyRootFilesystem"], true)
					check(name+" runAsNonRoot", sc["runAsNonRoot"], true)
					check(name+" privileged", sc["privileged"], false)
					check(name+" capabilities.drop", nested(sc, "capabilities", "drop"), []any{"ALL"})
					if add := nested(sc, "capabilities", "add"); add != nil {
						t.Errorf("%s capabilities.add: got %v, want none", name, add)
					}
					check(name+" seccompProfile.type", nested(sc, "seccompProfile", "type"), "RuntimeDefault")
					if uid, ok := sc["runAsUser"]; ok && uid == int64(0) {
						t.Errorf("%s runAsUser: got 0, want non-root", name)
					}
					ports, _ := c["ports"].([]any)
					for _, p := range ports {
						if hp, ok := p.(map[string]any)["hostPort"]; ok && hp != int64(0) {
							t.Errorf("%s: hostPort %v", name, hp)
						}
					}
				}
			}
		})
	}
}

func TestRoleIsLeastPrivilege(t *testing.T) {
	role := find(t, render(t, []string{redisValues}), "Role", "")
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	if len(rules) == 0 {
		t.Fatal("the Role has no rules")
	}
	for i, r := range rules {
		rule := r.(map[string]any)
		for _, field := range []string{"apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"} {
			list, _ := rule[field].([]any)
			for _, v := range list {
				s := fmt.Sprint(v)
				if strings.Contains(s, "*") {
					t.Errorf("rule %d: %s holds a wildcard %q", i, field, s)
				}
				if field == "resources" && (s == "secrets" || strings.HasPrefix(s, "secrets/")) {
					t.Errorf("rule %d: grants access to %s", i, s)
				}
				if field == "verbs" && (s == "escalate" || s == "bind" || s == "impersonate") {
					t.Errorf("rule %d: grants %s", i, s)
				}
			}
		}
	}
	binding := find(t, render(t, []string{redisValues}), "RoleBinding", "")
	if ref, _, _ := unstructured.NestedString(binding.Object, "roleRef", "kind"); ref != "Role" {
		t.Errorf("RoleBinding.roleRef.kind: got %s, want Role (never a ClusterRole)", ref)
	}
}

// With tiers.source static the plans go into the config file: no LimitTier,
// no RBAC, no API token in the pods.
func TestStaticSource(t *testing.T) {
	objs := render(t, []string{redisValues}, "--set", "tiers.source=static")
	for _, kind := range []string{"LimitTier", "Role", "RoleBinding"} {
		if n := len(ofKind(objs, kind)); n != 0 {
			t.Errorf("rendered %d %s with tiers.source static, want 0", n, kind)
		}
	}
	pod := podSpec(t, find(t, objs, "Deployment", ""))
	if got := pod["automountServiceAccountToken"]; got != false {
		t.Errorf("automountServiceAccountToken: got %v, want false", got)
	}
	static := configFile(t, objs)["tiers"].(map[string]any)["static"]
	want := []any{
		map[string]any{"plan": "free", "maxConcurrentStreams": int64(1)},
		map[string]any{"plan": "paid", "maxConcurrentStreams": int64(3), "maxWait": "10s"},
	}
	if !reflect.DeepEqual(static, want) {
		t.Errorf("tiers.static: got %v, want %v", static, want)
	}
}

// redis.requiredForReadiness reaches the config file; off by default, as
// readiness must not follow Redis unless asked to.
func TestRequiredForReadiness(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want bool
	}{
		{"off by default", nil, false},
		{"on when set", []string{"--set", "redis.requiredForReadiness=true"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := configFile(t, render(t, []string{redisValues}, tc.set...))["redis"].(map[string]any)["requiredForReadiness"]
			if got != tc.want {
				t.Errorf("redis.requiredForReadiness in the config file: got %v, want %v", got, tc.want)
			}
		})
	}
}

// The optional Prometheus Operator objects render only when asked for.
func TestServiceMonitor(t *testing.T) {
	if n := len(ofKind(render(t, []string{redisValues}), "ServiceMonitor")); n != 0 {
		t.Errorf("default values rendered %d ServiceMonitors, want 0", n)
	}
	objs := render(t, []string{clusterValues})
	sm := find(t, objs, "ServiceMonitor", "")
	svc := find(t, objs, "Service", "limiter-metrics")
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	for k, v := range sel {
		if svc.GetLabels()[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s, which the metrics Service does not carry", k, v)
		}
	}
	port, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(port) != 1 || port[0].(map[string]any)["port"] != "ops" {
		t.Errorf("ServiceMonitor endpoints: got %v, want the ops port", port)
	}
}

// podSpec returns the Deployment's pod template spec.
func podSpec(t testing.TB, dep *unstructured.Unstructured) map[string]any {
	t.Helper()
	pod, found, err := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	if err != nil || !found {
		t.Fatalf("Deployment has no pod spec: %v", err)
	}
	return pod
}

// container returns the limiter container of a pod spec.
func container(t testing.TB, pod map[string]any) map[string]any {
	t.Helper()
	for _, c := range pod["containers"].([]any) {
		if m := c.(map[string]any); m["name"] == "limiter" {
			return m
		}
	}
	t.Fatal("no limiter container")
	return nil
}

func nested(m map[string]any, fields ...string) any {
	v, _, _ := unstructured.NestedFieldNoCopy(m, fields...)
	return v
}
