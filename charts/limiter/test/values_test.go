package chart

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/config"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Bad values fail `helm install` with a message naming the value and what
// is wrong, before anything reaches the cluster.
func TestBadValuesAreRefused(t *testing.T) {
	tests := []struct {
		name   string
		values string
		want   []string // each must appear in helm's error
	}{
		{
			name:   "replicas as a word",
			values: "replicaCount: three\n",
			want:   []string{"values don't meet the specifications of the schema", "at '/replicaCount': got string, want integer"},
		},
		{
			name:   "an unknown top-level key",
			values: "replicas: 3\n",
			want:   []string{"at '': additional properties 'replicas' not allowed"},
		},
		{
			name:   "a typo inside a known object",
			values: "redis:\n  adresses: [a:6379]\n",
			want:   []string{"at '/redis': additional properties 'adresses' not allowed"},
		},
		{
			name:   "an unknown failure mode",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      failureMode: Sometimes\n",
			want:   []string{"at '/tiers/items/0/failureMode': value must be one of 'Open', 'Closed'"},
		},
		{
			name:   "a negative limit",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: -1\n",
			want:   []string{"at '/tiers/items/0/maxConcurrentStreams': minimum: got -1, want 0"},
		},
		{
			name:   "a limit above 1000",
			values: "tiers:\n  items:\n    - name: bulk\n      maxConcurrentStreams: 1001\n",
			want:   []string{"at '/tiers/items/0/maxConcurrentStreams': maximum: got 1,001, want 1,000"},
		},
		{
			name:   "running as root",
			values: "securityContext:\n  runAsUser: 0\n",
			want:   []string{"at '/securityContext/runAsUser': minimum: got 0, want 1"},
		},
		{
			name:   "a duration without unit",
			values: "redis:\n  timeout: \"250\"\n",
			want:   []string{"at '/redis/timeout'"},
		},
		{
			name:   "an unknown tier source",
			values: "tiers:\n  source: configmap\n",
			want:   []string{"at '/tiers/source': value must be one of 'kubernetes', 'static'"},
		},
		{
			name:   "the embedded store with several replicas",
			values: "redis:\n  addrs: []\n",
			want:   []string{"redis.addrs is empty", "replicaCount 3"},
		},
		{
			name:   "two tiers claiming one plan",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n    - name: gratis\n      plan: free\n      maxConcurrentStreams: 2\n",
			want:   []string{`tiers.items[1]: plan "free" is already defined by tiers.items[0]`},
		},
		{
			name:   "a NetworkPolicy peer with a typo",
			values: "networkPolicy:\n  api:\n    from:\n      - podSelector:\n          matchLabel: {app: gateway}\n",
			want:   []string{"at '/networkPolicy/api/from/0/podSelector': additional properties 'matchLabel' not allowed"},
		},
		{
			name:   "an empty NetworkPolicy peer",
			values: "networkPolicy:\n  ops:\n    from:\n      - {}\n",
			want:   []string{"at '/networkPolicy/ops/from/0'"},
		},
		{
			name:   "a TLS Secret with TLS off",
			values: "redis:\n  tls:\n    existingSecret: redis-tls\n",
			want:   []string{"redis.tls.existingSecret is set but redis.tls.enabled is false"},
		},
		// Durations in range for the limiter (pkg/tiers, pkg/config) and the
		// LimitTier CRD; the schema only checks their form.
		{
			name:   "a slotTTL above 24h",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 48h\n",
			want:   []string{`tiers.items[0] (free): slotTTL "48h": must be between 100ms and 24h`},
		},
		{
			name:   "a zero slotTTL",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 0s\n",
			want:   []string{`tiers.items[0] (free): slotTTL "0s": must be between 100ms and 24h`},
		},
		{
			name:   "a heartbeat above slotTTL/3",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n    - name: paid\n      maxConcurrentStreams: 3\n      slotTTL: 30s\n      heartbeatInterval: 15s\n",
			want:   []string{`tiers.items[1] (paid): heartbeatInterval "15s": must be at most a third of slotTTL (30s)`},
		},
		{
			name:   "a heartbeat above a third of the default slotTTL",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      heartbeatInterval: 41s\n",
			want:   []string{`tiers.items[0] (free): heartbeatInterval "41s": must be at most a third of slotTTL (120s, the default)`},
		},
		{
			name:   "a zero heartbeat",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      heartbeatInterval: 0s\n",
			want:   []string{`tiers.items[0] (free): heartbeatInterval "0s": must be at least 1ms`},
		},
		{
			name:   "a heartbeat under 1ms",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      heartbeatInterval: 999us\n",
			want:   []string{`tiers.items[0] (free): heartbeatInterval "999us": must be at least 1ms`},
		},
		{
			name:   "microseconds written with the micro sign, which the CRD refuses",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 500000µs\n",
			want:   []string{`tiers.items[0] (free): slotTTL "500000µs": write microseconds as "us"`},
		},
		{
			name:   "a zero lease",
			values: "tiers:\n  leaseDuration: 0s\n",
			want:   []string{`tiers.leaseDuration "0s": must be between 1s and 5m`},
		},
		{
			name:   "a lease above 5m",
			values: "tiers:\n  leaseDuration: 10m\n",
			want:   []string{`tiers.leaseDuration "10m": must be between 1s and 5m`},
		},
		{
			name:   "a Redis timeout above 10s",
			values: "redis:\n  timeout: 11s\n",
			want:   []string{`redis.timeout "11s": must be above 0s and at most 10s`},
		},
		// LimitPools, with the CRD's bounds (pkg/pools).
		{
			name:   "a pool key with a space",
			values: "limitPools:\n  - name: model\n    keys: {\"gpt 4o\": 1}\n",
			want:   []string{"invalid propertyName 'gpt 4o'", "does not match pattern '^[A-Za-z0-9._:/@-]{1,128}$'"},
		},
		{
			name:   "a pool cap above 100000",
			values: "limitPools:\n  - name: model\n    keys: {gpt-4o: 100001}\n",
			want:   []string{"at '/limitPools/0/keys/gpt-4o': maximum: got 100,001, want 100,000"},
		},
		{
			name:   "a pool name in capitals",
			values: "limitPools:\n  - name: model\n    pool: Model\n",
			want:   []string{"at '/limitPools/0/pool'"},
		},
		{
			name:   "two LimitPools claiming one pool",
			values: "limitPools:\n  - name: model\n  - name: models\n    pool: model\n",
			want:   []string{`limitPools[1]: pool "model" is already defined by limitPools[0]`},
		},
		{
			name:   "a pool maxWait above 60s",
			values: "limitPools:\n  - name: model\n    maxWait: 61s\n",
			want:   []string{`limitPools[0] (model): maxWait "61s": must be between 0s and 60s`},
		},
		{
			name:   "a tier maxWait above 60s",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      maxWait: 61s\n",
			want:   []string{`tiers.items[0] (free): maxWait "61s": must be between 0s (no waiting) and 60s`},
		},
		{
			name:   "a tier maxWait in µs",
			values: "tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      maxWait: 5µs\n",
			want:   []string{`maxWait "5µs": write microseconds as "us"`},
		},
		{name: "extproc.wait above 60s", values: "extproc:\n  wait: 61s\n", want: []string{`extproc.wait "61s": must be between 0s and 60s`}},
		{name: "proxy.wait above 60s", values: "proxy:\n  wait: 60.001s\n", want: []string{`proxy.wait "60.001s": must be between 0s and 60s`}},
		{name: "proxy.stallTimeout under 1s", values: "proxy:\n  stallTimeout: 999ms\n", want: []string{`proxy.stallTimeout "999ms": must be between 1s and 1h`}},
		{name: "proxy.stallTimeout above 1h", values: "proxy:\n  stallTimeout: 1h0m1s\n", want: []string{`proxy.stallTimeout "1h0m1s": must be between 1s and 1h`}},
		{name: "telemetry.slotsUsedMaxWindow under 1s", values: "telemetry:\n  slotsUsedMaxWindow: 0s\n", want: []string{`telemetry.slotsUsedMaxWindow "0s": must be between 1s and 1h`}},
		{name: "telemetry.slotsUsedMaxWindow above 1h", values: "telemetry:\n  slotsUsedMaxWindow: 61m\n", want: []string{`telemetry.slotsUsedMaxWindow "61m": must be between 1s and 1h`}},
		// The ext_proc server verifies JWTs as the proxy does.
		{
			name:   "the ext_proc server with a key set and no issuer",
			values: "extproc:\n  enabled: true\nidentity:\n  jwt:\n    jwksURL: https://auth/jwks\n    audience: llm\n",
			want:   []string{"identity.jwt needs identity.jwt.issuer and identity.jwt.audience with a key set"},
		},
		{
			name:   "the ext_proc server with an audience and no key set",
			values: "extproc:\n  enabled: true\nidentity:\n  jwt:\n    issuer: https://auth\n    audience: llm\n",
			want:   []string{"identity.jwt.issuer, audience, planClaim and a userClaim other than sub need a key set"},
		},
		{
			name:   "the ext_proc server with a user claim and no key set",
			values: "extproc:\n  enabled: true\nidentity:\n  jwt:\n    userClaim: email\n",
			want:   []string{"identity.jwt.issuer, audience, planClaim and a userClaim other than sub need a key set"},
		},
		{
			name:   "LimitPools with the static tier source",
			values: "tiers:\n  source: static\nlimitPools:\n  - name: model\n",
			want:   []string{"limitPools needs tiers.source kubernetes"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := runHelm(t, templateArgs([]string{redisValues, writeValues(t, tt.values)})...)
			if err == nil {
				t.Fatalf("helm template accepted %q", tt.values)
			}
			for _, want := range tt.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("helm's error does not say %q:\n%s", want, stderr)
				}
			}
		})
	}
}

// The bounds are inclusive, fractions and compound durations are read, and
// a short slotTTL without heartbeatInterval is fine: the limiter defaults
// the heartbeat to min(20s, slotTTL/3).
func TestDurationsInRangeAreAccepted(t *testing.T) {
	for _, values := range []string{
		"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 30s\n",
		"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 30s\n      heartbeatInterval: 10s\n",
		"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 1.5s\n      heartbeatInterval: 500ms\n",
		"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 100ms\n",
		"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      slotTTL: 23h59m60s\n      heartbeatInterval: 8h\n",
		"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      heartbeatInterval: 40s\n",
		"tiers:\n  leaseDuration: 1s\n",
		"tiers:\n  leaseDuration: 5m\n",
		"redis:\n  timeout: 10s\n",
		"limitPools:\n  - name: model\n    maxWait: 60s\n",
		"limitPools:\n  - name: model\n    maxWait: 1m\n",
		"tiers:\n  items:\n    - name: free\n      maxConcurrentStreams: 1\n      maxWait: 60s\n",
		"extproc:\n  wait: 60s\n",
		"proxy:\n  wait: 1m\n  stallTimeout: 1s\n",
		"proxy:\n  stallTimeout: 1h\n",
		"telemetry:\n  slotsUsedMaxWindow: 1s\n",
		"telemetry:\n  slotsUsedMaxWindow: 60m\n",
	} {
		if _, stderr, err := runHelm(t, templateArgs([]string{redisValues, writeValues(t, values)})...); err != nil {
			t.Errorf("helm template refused %q: %v\n%s", values, err, stderr)
		}
	}
}

// Every key of values.yaml is in values.schema.json and in README.md, and
// the schema closes every object it describes.
func TestEveryValueDocumented(t *testing.T) {
	var values map[string]any
	readYAML(t, filepath.Join(chartDir, "values.yaml"), &values)
	var schema map[string]any
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Free-form maps (labels, annotations, ...) and lists are documented as
	// a whole; their entries are the user's.
	var walk func(path string, v any, s map[string]any)
	walk = func(path string, v any, s map[string]any) {
		if s == nil {
			t.Errorf("%s: not in values.schema.json", path)
			return
		}
		if path != "" && !strings.Contains(string(readme), "`"+path+"`") && !strings.Contains(string(readme), "`"+path+".") {
			t.Errorf("%s: not documented in README.md", path)
		}
		m, ok := v.(map[string]any)
		props, closed := s["properties"].(map[string]any)
		if !ok || !closed {
			return
		}
		if s["additionalProperties"] != false {
			t.Errorf("%s: the schema allows unknown keys", path)
		}
		for k, child := range m {
			cs, _ := props[k].(map[string]any)
			walk(strings.TrimPrefix(path+"."+k, "."), child, cs)
		}
	}
	walk("", values, schema)
}

// The rendered config file is one the limiter accepts: pkg/config loads it
// with its unknown-key check and validation. Only the mounted Secret files
// (absent here) may be missing.
func TestConfigFileLoads(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			cfg := loadRendered(t, render(t, vs.files), config.CommandServe)
			if cfg.Tiers.Source != config.SourceKubernetes || cfg.Tiers.Namespace != namespace {
				t.Errorf("tiers: got source %q namespace %q, want kubernetes in %q", cfg.Tiers.Source, cfg.Tiers.Namespace, namespace)
			}
			if len(cfg.Redis.Addrs) == 0 {
				t.Error("redis.addrs is empty")
			}
		})
	}
}

// loadRendered loads the config file of the rendered ConfigMap as `limiter
// command` does, with no LIMITER_ variable set and no namespace file, and
// fails t for each error it finds but a missing file the pod mounts (a
// Secret, the JWKS ConfigMap): not here.
func loadRendered(t *testing.T, objs []*unstructured.Unstructured, command string) config.Config {
	t.Helper()
	cm := find(t, objs, "ConfigMap", "limiter")
	data, _, _ := unstructured.NestedString(cm.Object, "data", "limiter.yaml")
	path := filepath.Join(t.TempDir(), "limiter.yaml")
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, env := range os.Environ() {
		if name, _, _ := strings.Cut(env, "="); strings.HasPrefix(name, config.EnvPrefix) {
			t.Setenv(name, "")
		}
	}
	t.Setenv(config.EnvConfig, path)
	cfg, err := config.Load(config.LoadOptions{Command: command, NamespaceFile: filepath.Join(t.TempDir(), "none")})
	for _, e := range leafErrors(err) {
		var ke *config.KeyError
		if errors.As(e, &ke) && strings.HasPrefix(ke.Problem, "must name a readable file") {
			continue // mounted in the pod
		}
		t.Errorf("limiter %s refuses the rendered config: %v\n%s", command, e, data)
	}
	return cfg
}

// leafErrors flattens the errors.Join tree of Load into its KeyErrors (and
// any other error).
func leafErrors(err error) []error {
	if err == nil {
		return nil
	}
	if ke, ok := err.(*config.KeyError); ok {
		return []error{ke}
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			if e != config.ErrInvalid {
				out = append(out, leafErrors(e)...)
			}
		}
		return out
	}
	return []error{err}
}

// configFile returns the parsed config file of the rendered ConfigMap.
func configFile(t testing.TB, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	cm := find(t, objs, "ConfigMap", "limiter")
	data, _, _ := unstructured.NestedString(cm.Object, "data", "limiter.yaml")
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(data), &cfg); err != nil {
		t.Fatalf("the rendered config file is not YAML: %v\n%s", err, data)
	}
	return toInt64(cfg).(map[string]any)
}

// toInt64 turns the float64 numbers of a JSON-decoded value into int64 where
// they are whole, as the unstructured objects hold them.
func toInt64(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = toInt64(e)
		}
	case []any:
		for i, e := range x {
			x[i] = toInt64(e)
		}
	case float64:
		if x == float64(int64(x)) {
			return int64(x)
		}
	}
	return v
}

func readYAML(t testing.TB, path string, into any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
