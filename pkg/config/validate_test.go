package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v, want nil", err)
	}
}

func TestInvalidValuesNameTheirKey(t *testing.T) {
	dir := t.TempDir()
	absent := filepath.Join(dir, "absent")
	present := filepath.Join(dir, "present")
	if err := os.WriteFile(present, []byte("x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		key  string // named by the error, with its env var
		env  map[string]string
		want string // also in the error
	}{
		{"a listen address without a port", "http.addr", map[string]string{"LIMITER_HTTP_ADDR": "localhost"}, `must be host:port or :port with a port 0-65535 (env LIMITER_HTTP_ADDR, flag --http-addr), got "localhost"`},
		{"a listen port out of range", "http.addr", map[string]string{"LIMITER_HTTP_ADDR": ":70000"}, `got ":70000"`},
		{"the ops listener on the API's port", "ops.addr", map[string]string{"LIMITER_OPS_ADDR": "0.0.0.0:8080"}, "must not be the address of http.addr"},
		{"a negative shutdown grace", "http.shutdownGrace", map[string]string{"LIMITER_HTTP_SHUTDOWNGRACE": "-1s"}, "must be >= 0s"},
		{"no header timeout", "http.readHeaderTimeout", map[string]string{"LIMITER_HTTP_READHEADERTIMEOUT": "0s"}, "http.readHeaderTimeout: must be > 0 (env LIMITER_HTTP_READHEADERTIMEOUT), got 0s"},
		{"a negative read timeout", "http.readTimeout", map[string]string{"LIMITER_HTTP_READTIMEOUT": "-1s"}, "must be > 0 (env LIMITER_HTTP_READTIMEOUT), got -1s"},
		{"no write timeout", "http.writeTimeout", map[string]string{"LIMITER_HTTP_WRITETIMEOUT": "0s"}, "must be > 0 (env LIMITER_HTTP_WRITETIMEOUT), got 0s"},
		{"no idle timeout", "http.idleTimeout", map[string]string{"LIMITER_HTTP_IDLETIMEOUT": "0s"}, "must be > 0 (env LIMITER_HTTP_IDLETIMEOUT), got 0s"},
		{"a timeout without a unit", "http.readTimeout", map[string]string{"LIMITER_HTTP_READTIMEOUT": "10"}, `"10" is not a duration`},
		{"a redis address without a port", "redis.addrs", map[string]string{"LIMITER_REDIS_ADDRS": "redis"}, `got "redis"`},
		{"a negative redis timeout", "redis.timeout", map[string]string{"LIMITER_REDIS_TIMEOUT": "-1s"}, "redis.timeout: must be > 0 and <= 10s (env LIMITER_REDIS_TIMEOUT, flag --redis-timeout), got -1s"},
		{"a zero redis timeout", "redis.timeout", map[string]string{"LIMITER_REDIS_TIMEOUT": "0s"}, "got 0s"},
		{"a redis timeout that defeats failing open", "redis.timeout", map[string]string{"LIMITER_REDIS_TIMEOUT": "1m"}, "got 1m0s"},
		{"a redis timeout that is not a duration", "redis.timeout", map[string]string{"LIMITER_REDIS_TIMEOUT": "fast"}, `"fast" is not a duration`},
		{"a zero shards refresh interval", "redis.shardsRefreshInterval", map[string]string{"LIMITER_REDIS_SHARDSREFRESHINTERVAL": "0s"}, "must be > 0"},
		{"a negative replica count to wait for", "redis.syncReplicas", map[string]string{"LIMITER_REDIS_ADDRS": "r:6379", "LIMITER_REDIS_SYNCREPLICAS": "-1"}, "redis.syncReplicas: must be >= 0 (0: acquires do not wait for replicas) (env LIMITER_REDIS_SYNCREPLICAS), got -1"},
		{"replicas to wait for on the embedded store", "redis.syncReplicas", map[string]string{"LIMITER_REDIS_SYNCREPLICAS": "1"}, "requires redis.addrs"},
		{"a key prefix with a brace", "redis.keyPrefix", map[string]string{"LIMITER_REDIS_KEYPREFIX": "a{b"}, "must not contain '{' or '}'"},
		{"a missing password file", "redis.passwordFile", map[string]string{"LIMITER_REDIS_ADDRS": "r:6379", "LIMITER_REDIS_PASSWORDFILE": absent}, "must name a readable file"},
		{"a password on the embedded store", "redis.passwordFile", map[string]string{"LIMITER_REDIS_PASSWORDFILE": absent}, "requires redis.addrs"},
		{"a sentinel master set on the embedded store", "redis.sentinelMasterSet", map[string]string{"LIMITER_REDIS_SENTINELMASTERSET": "mymaster"}, "requires redis.addrs"},
		{"TLS on the embedded store", "redis.tls.enabled", map[string]string{"LIMITER_REDIS_TLS_ENABLED": "true"}, "requires redis.addrs"},
		{"a TLS flag that is not a boolean", "redis.tls.enabled", map[string]string{"LIMITER_REDIS_TLS_ENABLED": "maybe"}, "cannot be read"},
		{"a CA file with TLS off", "redis.tls.caFile", map[string]string{"LIMITER_REDIS_ADDRS": "r:6379", "LIMITER_REDIS_TLS_CAFILE": absent}, "requires redis.tls.enabled: true"},
		{"skipping verification with TLS off", "redis.tls.insecureSkipVerify", map[string]string{"LIMITER_REDIS_ADDRS": "r:6379", "LIMITER_REDIS_TLS_INSECURESKIPVERIFY": "true"}, "requires redis.tls.enabled: true"},
		{"a missing CA file", "redis.tls.caFile", map[string]string{"LIMITER_REDIS_ADDRS": "r:6379", "LIMITER_REDIS_TLS_ENABLED": "true", "LIMITER_REDIS_TLS_CAFILE": absent}, "must name a readable file"},
		{"a client certificate without its key", "redis.tls.certFile", map[string]string{"LIMITER_REDIS_ADDRS": "r:6379", "LIMITER_REDIS_TLS_ENABLED": "true", "LIMITER_REDIS_TLS_CERTFILE": absent}, "must be set together"},
		{"an unknown tier source", "tiers.source", map[string]string{"LIMITER_TIERS_SOURCE": "etcd"}, `tiers.source: must be static or kubernetes (env LIMITER_TIERS_SOURCE, flag --tiers-source), got "etcd"`},
		{"a namespace that Kubernetes would refuse", "tiers.namespace", map[string]string{"LIMITER_TIERS_SOURCE": "kubernetes", "LIMITER_TIERS_NAMESPACE": "Bad_NS"}, `got "Bad_NS"`},
		{"the kubernetes source outside a pod with no namespace", "tiers.namespace", map[string]string{"LIMITER_TIERS_SOURCE": "kubernetes"}, "is required with tiers.source kubernetes"},
		{"a tier list that does not parse", "tiers.static", map[string]string{"LIMITER_TIERS_STATIC": "[{"}, "want a JSON or YAML list of tiers"},
		{"an empty tier list", "tiers.static", map[string]string{"LIMITER_TIERS_STATIC": "[]"}, "must hold at least one tier"},
		{"a tier out of bounds", "tiers.static[0].heartbeatInterval", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":1,"slotTTL":"30s","heartbeatInterval":"20s"}]`}, `tiers.static[0].heartbeatInterval: must be <= slotTTL/3 (10s) (env LIMITER_TIERS_STATIC), got 20s`},
		{"a heartbeat under 1ms, which heartbeat_interval_ms would read as 0", "tiers.static[0].heartbeatInterval", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":1,"heartbeatInterval":"500us"}]`}, `tiers.static[0].heartbeatInterval: must be at least 1ms (heartbeat_interval_ms is whole milliseconds) (env LIMITER_TIERS_STATIC), got 500µs`},
		{"a limit above 1000", "tiers.static[1].maxConcurrentStreams", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":1},{"plan":"bulk","maxConcurrentStreams":5000}]`}, `tiers.static[1].maxConcurrentStreams: must be <= 1000 (env LIMITER_TIERS_STATIC), got 5000`},
		{"a negative limit", "tiers.static[0].maxConcurrentStreams", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":-1}]`}, "must be >= 0 (env LIMITER_TIERS_STATIC), got -1"},
		{"a tier with an unknown failure mode", "tiers.static[0].failureMode", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":1,"failureMode":"open"}]`}, `must be Open or Closed (env LIMITER_TIERS_STATIC), got "open"`},
		{"a proxy wait above 60s", "proxy.wait", map[string]string{"LIMITER_PROXY_WAIT": "90s"}, "proxy.wait: must be between 0s (no waiting) and 60s (the plan's maxWait caps it) (env LIMITER_PROXY_WAIT, flag --wait), got 1m30s"},
		{"a stall timeout under 1s", "proxy.stallTimeout", map[string]string{"LIMITER_PROXY_STALLTIMEOUT": "999ms"}, "proxy.stallTimeout: must be between 1s and 1h: how long a client may read nothing of its stream before the stream is cut and its slot released (env LIMITER_PROXY_STALLTIMEOUT), got 999ms"},
		{"a stall timeout over 1h", "proxy.stallTimeout", map[string]string{"LIMITER_PROXY_STALLTIMEOUT": "1h0m1s"}, "got 1h0m1s"},
		{"a tier waiting longer than 60s", "tiers.static[0].maxWait", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":1,"maxWait":"2m"}]`}, `tiers.static[0].maxWait: must be between 0s (no waiting) and 60s (env LIMITER_TIERS_STATIC), got 2m0s`},
		{"a tier with a maxWait without a unit", "tiers.static[0].maxWait", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":1,"maxWait":10}]`}, "cannot be read: 10 has no unit"},
		{"a tier without a plan", "tiers.static[0].plan", map[string]string{"LIMITER_TIERS_STATIC": `[{"maxConcurrentStreams":1}]`}, "is required"},
		{"a plan defined twice", "tiers.static[1].plan", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"a","maxConcurrentStreams":1},{"plan":"a","maxConcurrentStreams":2}]`}, `tiers.static[1].plan: "a" is already defined by tiers.static[0]`},
		{"a tier with an unknown field", "tiers.static[0]", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"a","max":1}]`}, `unknown field "max" (env LIMITER_TIERS_STATIC); the fields of a tier are plan,`},
		{"a tier with a misspelt field", "tiers.static[0]", map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"a","maxConcurentStreams":1}]`}, `unknown field "maxConcurentStreams" (env LIMITER_TIERS_STATIC); did you mean "maxConcurrentStreams"?`},
		{"a missing API tokens file", "api.tokensFile", map[string]string{"LIMITER_API_TOKENSFILE": absent}, "must name a readable file"},
		{"an API certificate without its key", "http.tls.certFile", map[string]string{"LIMITER_HTTP_TLS_CERTFILE": present}, "and http.tls.keyFile must be set together"},
		{"a missing API key file", "http.tls.keyFile", map[string]string{"LIMITER_HTTP_TLS_CERTFILE": present, "LIMITER_HTTP_TLS_KEYFILE": absent}, "must name a readable file"},
		{"a client CA without TLS", "http.tls.clientCAFile", map[string]string{"LIMITER_HTTP_TLS_CLIENTCAFILE": present, "LIMITER_API_TOKENSFILE": present}, "requires http.tls.certFile and http.tls.keyFile"},
		{"a client CA without an API tokens file", "http.tls.clientCAFile", map[string]string{"LIMITER_HTTP_TLS_CERTFILE": present, "LIMITER_HTTP_TLS_KEYFILE": present, "LIMITER_HTTP_TLS_CLIENTCAFILE": present},
			`requires api.tokensFile: it scopes each certificate's name to its plans`},
		{"an admin listen address without a port", "admin.addr", map[string]string{"LIMITER_ADMIN_ADDR": "localhost"}, `must be host:port or :port with a port 0-65535 (env LIMITER_ADMIN_ADDR, flag --admin-addr), got "localhost"`},
		{"the admin listener on the API's port", "admin.addr", map[string]string{"LIMITER_ADMIN_ADDR": ":8080", "LIMITER_ADMIN_TOKENSFILE": present}, "must not be the address of http.addr (:8080)"},
		{"the admin listener on the ops port", "admin.addr", map[string]string{"LIMITER_ADMIN_ADDR": "127.0.0.1:9090", "LIMITER_ADMIN_TOKENSFILE": present}, "must not be the address of ops.addr (:9090)"},
		{"a missing admin tokens file", "admin.tokensFile", map[string]string{"LIMITER_ADMIN_TOKENSFILE": absent}, "must name a readable file"},
		{"an admin tokens directory", "admin.tokensFile", map[string]string{"LIMITER_ADMIN_TOKENSFILE": dir}, "must name a file, not a directory"},
		{"a zero audit length", "admin.auditMaxLen", map[string]string{"LIMITER_ADMIN_AUDITMAXLEN": "0"}, "admin.auditMaxLen: must be between 1 and 10000000 (env LIMITER_ADMIN_AUDITMAXLEN), got 0"},
		{"an audit length that is not a number", "admin.auditMaxLen", map[string]string{"LIMITER_ADMIN_AUDITMAXLEN": "many"}, "cannot be read"},
		{"an OTLP endpoint of another scheme", "telemetry.otlpEndpoint", map[string]string{"LIMITER_TELEMETRY_OTLPENDPOINT": "ftp://collector"}, `got "ftp://collector"`},
		{"a blank service name", "telemetry.serviceName", map[string]string{"LIMITER_TELEMETRY_SERVICENAME": " "}, "must not be empty"},
		{"a used-max window under a second", "telemetry.slotsUsedMaxWindow", map[string]string{"LIMITER_TELEMETRY_SLOTSUSEDMAXWINDOW": "500ms"},
			"must be between 1s and 1h0m0s (env LIMITER_TELEMETRY_SLOTSUSEDMAXWINDOW, flag --slots-used-max-window), got 500ms"},
		{"an unknown log level", "log.level", map[string]string{"LIMITER_LOG_LEVEL": "verbose"}, `must be debug, info, warn or error (env LIMITER_LOG_LEVEL, flag --log-level), got "verbose"`},
		{"an unknown log format", "log.format", map[string]string{"LIMITER_LOG_FORMAT": "xml"}, `got "xml"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, "", tc.env)
			if err == nil {
				t.Fatal("Load() = nil, want an error")
			}
			msg := err.Error()
			// An entry of a list (tiers.static[1].plan) is set by the
			// list's key.
			setting, _, _ := strings.Cut(tc.key, "[")
			for _, w := range []string{tc.key + ": ", "env " + EnvVar(setting), tc.want} {
				if !strings.Contains(msg, w) {
					t.Errorf("Load() = %q, want it to contain %q", msg, w)
				}
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false, want true", err)
			}
		})
	}
}

// The stall timeout's bounds themselves are accepted, and reach the
// proxy's options.
func TestStallTimeoutBounds(t *testing.T) {
	for _, d := range []string{"1s", "1h"} {
		c, err := load(t, "", map[string]string{"LIMITER_PROXY_STALLTIMEOUT": d, "LIMITER_PROXY_UPSTREAM": "http://vllm:8000"})
		if err != nil {
			t.Fatalf("proxy.stallTimeout %s: %v", d, err)
		}
		opts, err := c.ProxyOptions()
		if want, _ := time.ParseDuration(d); err != nil || opts.StallTimeout != want {
			t.Errorf("proxy.stallTimeout %s: the proxy's StallTimeout %s (%v), want %s", d, opts.StallTimeout, err, want)
		}
	}
}

func TestValidateReportsEveryError(t *testing.T) {
	c := Default()
	c.HTTP.Addr = "x"
	c.Log.Level = "loud"
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate() = nil, want errors")
	}
	var keyErrs []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ke *KeyError
		if errors.As(e, &ke) {
			keyErrs = append(keyErrs, ke.Key)
		}
	}
	if strings.Join(keyErrs, ",") != "http.addr,log.level" {
		t.Fatalf("Validate() reported keys %v, want [http.addr log.level]", keyErrs)
	}
}

func TestPasswordFileIsNotQuoted(t *testing.T) {
	// The only error about a password file that has content is none.
	path := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(path, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.Redis.Addrs = []string{"r:6379"}
	c.Redis.PasswordFile = path
	c.Redis.Timeout = -1
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("Validate() = %v, want an error that does not quote the password", err)
	}
}

// editCase is an edit of the default config that Validate must refuse
// with a *KeyError for key, saying want and naming key's env var.
type editCase struct {
	name string
	edit func(c *Config)
	key  string
	want string
}

// checkEdits checks each case in a subtest of its own.
func checkEdits(t *testing.T, cases []editCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.edit(&c)
			err := c.Validate()
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), EnvVar(tc.key)) {
				t.Fatalf("Validate() = %v; want a %s error saying %q and naming %s", err, tc.key, tc.want, EnvVar(tc.key))
			}
		})
	}
}

// TestLoadRefusesAValueOfAnotherType: a scalar key written in the file
// with a value of another type stops the start naming the key, rather
// than being turned into something else (true as a timeout was 1ns, and
// every acquire of a plan failing open was granted degraded, uncapped);
// the environment's strings are read as before.
func TestLoadRefusesAValueOfAnotherType(t *testing.T) {
	cases := []struct{ file, want string }{
		{"redis:\n  timeout: true\n", "redis.timeout"},
		{"http:\n  shutdownGrace: true\n", "true is true or false, not a duration"},
		{"http:\n  readHeaderTimeout: false\n", "http.readHeaderTimeout"},
		{"admin:\n  auditMaxLen: 1.5\n", "1.5 is not a whole number"},
		{"admin:\n  auditMaxLen: true\n", "not a whole number"},
		{"redis:\n  addrs: [r:6379]\n  syncReplicas: 1.9\n", "redis.syncReplicas"},
		{"redis:\n  requiredForReadiness: 1\n", "1 is not true or false"},
		{"redis:\n  keyPrefix: true\n", "not a string (quote it)"},
	}
	for _, c := range cases {
		wantLoadError(t, c.file, nil, c.want)
	}
	cfg, err := load(t, "redis:\n  keyPrefix: 123456\n  syncReplicas: 1.0\n  addrs: [r:6379]\n", map[string]string{
		"LIMITER_REDIS_TIMEOUT": "2s", "LIMITER_REDIS_REQUIREDFORREADINESS": "true", "LIMITER_ADMIN_AUDITMAXLEN": "500"})
	if err != nil || cfg.Redis.KeyPrefix != "123456" || cfg.Redis.SyncReplicas != 1 || cfg.Redis.Timeout != 2*time.Second ||
		!cfg.Redis.RequiredForReadiness || cfg.Admin.AuditMaxLen != 500 {
		t.Errorf("a number as a key prefix, a whole 1.0 and the environment's strings: %+v, %v; want them read", cfg.Redis, err)
	}
}

// TestKubernetesTiersRefuseAStaticList: with tiers.source kubernetes the
// tiers come from LimitTiers alone; a tiers.static list, in the file or
// the environment, would be taken silently and enforced nowhere (nor
// checked: a limit above 1000 passed), so the start is refused naming it.
func TestKubernetesTiersRefuseAStaticList(t *testing.T) {
	const kube = "tiers:\n  source: kubernetes\n  namespace: limits\n"
	t.Run("file", func(t *testing.T) {
		wantLoadError(t, kube+"  static:\n    - {plan: enterprise, maxConcurrentStreams: 5000}\n", nil, "tiers.static")
	})
	t.Run("env", func(t *testing.T) {
		wantLoadError(t, kube, map[string]string{"LIMITER_TIERS_STATIC": `[{plan: enterprise, maxConcurrentStreams: 5}]`}, "must be unset with tiers.source kubernetes")
	})
	t.Run("none", func(t *testing.T) {
		if _, err := load(t, kube, nil); err != nil {
			t.Errorf("tiers.source kubernetes without tiers.static: %v; want loaded", err)
		}
	})
}

// TestLoadRefusesAKeyWrittenTwiceInTwoCases: keys are read without case,
// so a section or key written twice in two cases ("redis" and "Redis",
// "timeout" and "Timeout"), or a pool of identity.pools in two (the file,
// and the environment's JSON), would lose one of them unseen.
func TestLoadRefusesAKeyWrittenTwiceInTwoCases(t *testing.T) {
	const pools = "pools:\n  static:\n    - {pool: model, maxConcurrentStreams: 1}\n"
	for name, c := range map[string]struct {
		file string
		env  map[string]string
		want string
	}{
		"two sections":      {file: "redis:\n  timeout: 100ms\nRedis:\n  keyPrefix: \"b:\"\n", want: `"Redis" is "redis" again`},
		"two keys":          {file: "redis:\n  timeout: 100ms\n  Timeout: 2s\n", want: `"redis.Timeout" is "redis.timeout" again`},
		"a pool twice":      {file: pools + "identity:\n  pools:\n    model: body:model\n    Model: header:X-M\n", want: `"identity.pools.Model" is "identity.pools.model" again`},
		"a pool twice, env": {file: pools, env: map[string]string{"LIMITER_IDENTITY_POOLS": `{"model":"body:model","model":"header:X-M"}`}, want: `"model" is set twice`},
	} {
		t.Run(name, func(t *testing.T) { wantLoadError(t, c.file, c.env, c.want) })
	}
	if _, err := load(t, pools+"identity:\n  pools:\n    model: body:model\nredis:\n  timeout: 100ms\n", map[string]string{"LIMITER_IDENTITY_POOLS": `{"model":"header:X-M"}`}); err != nil {
		t.Errorf("each key once: %v; want loaded", err)
	}
}
