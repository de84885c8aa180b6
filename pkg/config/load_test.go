package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/spf13/pflag"
)

// load runs Load with file (when not empty) as --config, env set for the
// test, and args as flags.
func load(t *testing.T, file string, env map[string]string, args ...string) (Config, error) {
	t.Helper()
	path := ""
	if file != "" {
		path = writeFile(t, "limiter.yaml", file)
	}
	return loadFile(t, path, env, args...)
}

// loadFile is load with the file at path (when not empty).
func loadFile(t *testing.T, path string, env map[string]string, args ...string) (Config, error) {
	t.Helper()
	t.Setenv(EnvConfig, "")
	t.Setenv("POD_NAMESPACE", "")
	for k, v := range env {
		t.Setenv(k, v)
	}
	if path != "" {
		args = append([]string{"--config", path}, args...)
	}
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parsing flags %q: %v", args, err)
	}
	return Load(LoadOptions{Flags: fs, NamespaceFile: filepath.Join(t.TempDir(), "absent")})
}

func TestLoadPrecedence(t *testing.T) {
	const file = `
http:
  addr: ":1001"
redis:
  addrs: [file-a:6379, file-b:6379]
  timeout: 100ms
`
	cases := []struct {
		name  string
		file  string
		env   map[string]string
		args  []string
		check func(t *testing.T, c Config)
	}{
		{
			name: "the defaults apply when nothing is set",
			check: func(t *testing.T, c Config) {
				want(t, "http.addr", c.HTTP.Addr, ":8080")
				want(t, "http timeouts", c.HTTP.Timeouts(), server.Timeouts{ReadHeader: 5 * time.Second, Read: 10 * time.Second, Write: 10 * time.Second, Idle: 2 * time.Minute})
				want(t, "redis.timeout", c.Redis.Timeout, 250*time.Millisecond)
				want(t, "redis.addrs", c.Redis.Addrs, []string{})
				want(t, "redis.requiredForReadiness", c.Redis.RequiredForReadiness, false)
				want(t, "tiers.static", c.Tiers.Static, tiers.Defaults())
			},
		},
		{
			name: "the file overrides the defaults",
			file: file,
			check: func(t *testing.T, c Config) {
				want(t, "http.addr", c.HTTP.Addr, ":1001")
				want(t, "redis.timeout", c.Redis.Timeout, 100*time.Millisecond)
				want(t, "redis.addrs", c.Redis.Addrs, []string{"file-a:6379", "file-b:6379"})
				want(t, "ops.addr", c.Ops.Addr, ":9090")
			},
		},
		{
			name: "the environment overrides the file",
			file: file,
			env:  map[string]string{"LIMITER_HTTP_ADDR": ":2002", "LIMITER_REDIS_TIMEOUT": "200ms", "LIMITER_REDIS_ADDRS": "env-a:6379, env-b:6379,"},
			check: func(t *testing.T, c Config) {
				want(t, "http.addr", c.HTTP.Addr, ":2002")
				want(t, "redis.timeout", c.Redis.Timeout, 200*time.Millisecond)
				want(t, "redis.addrs", c.Redis.Addrs, []string{"env-a:6379", "env-b:6379"})
			},
		},
		{
			name: "flags override the environment and the file",
			file: file,
			env:  map[string]string{"LIMITER_HTTP_ADDR": ":2002", "LIMITER_REDIS_TIMEOUT": "200ms", "LIMITER_REDIS_ADDRS": "env-a:6379"},
			args: []string{"--http-addr", ":3003", "--redis-timeout", "300ms", "--redis-addrs", "flag-a:6379,flag-b:6379"},
			check: func(t *testing.T, c Config) {
				want(t, "http.addr", c.HTTP.Addr, ":3003")
				want(t, "redis.timeout", c.Redis.Timeout, 300*time.Millisecond)
				want(t, "redis.addrs", c.Redis.Addrs, []string{"flag-a:6379", "flag-b:6379"})
			},
		},
		{
			name: "a flag left unset does not hide the environment behind its default",
			env:  map[string]string{"LIMITER_OPS_ADDR": ":4004"},
			args: []string{"--http-addr", ":3003"},
			check: func(t *testing.T, c Config) {
				want(t, "ops.addr", c.Ops.Addr, ":4004")
			},
		},
		{
			name: "an empty environment variable counts as unset",
			file: file,
			env:  map[string]string{"LIMITER_HTTP_ADDR": ""},
			check: func(t *testing.T, c Config) {
				want(t, "http.addr", c.HTTP.Addr, ":1001")
			},
		},
		{
			name: "the listeners' timeouts come from the file and the environment",
			file: "http:\n  readHeaderTimeout: 2s\n  readTimeout: 3s\n  idleTimeout: 1m\n",
			env:  map[string]string{"LIMITER_HTTP_WRITETIMEOUT": "4s", "LIMITER_HTTP_READTIMEOUT": "5s"},
			check: func(t *testing.T, c Config) {
				want(t, "http timeouts", c.HTTP.Timeouts(), server.Timeouts{ReadHeader: 2 * time.Second, Read: 5 * time.Second, Write: 4 * time.Second, Idle: time.Minute})
			},
		},
		{
			name: "the file's tier list replaces the default list whole",
			file: "tiers:\n  static:\n    - plan: gold\n      maxConcurrentStreams: 9\n      slotTTL: 30s\n      maxWait: 15s\n      priority: 7\n",
			check: func(t *testing.T, c Config) {
				want(t, "tiers.static", c.StaticTiers(), []tiers.Tier{{Plan: "gold", MaxConcurrentStreams: 9, SlotTTL: 30 * time.Second, HeartbeatInterval: 10 * time.Second, FailureMode: tiers.FailOpen, MaxWait: 15 * time.Second, Priority: 7}})
			},
		},
		{
			name: "the environment's tier list may be JSON",
			env:  map[string]string{"LIMITER_TIERS_STATIC": `[{"plan":"free","maxConcurrentStreams":2,"failureMode":"Closed"}]`},
			check: func(t *testing.T, c Config) {
				want(t, "tiers.static", c.StaticTiers(), []tiers.Tier{withDefaults(tiers.Tier{Plan: "free", MaxConcurrentStreams: 2, FailureMode: tiers.FailClosed})})
			},
		},
		{
			name: "the environment's tier list may be YAML",
			env:  map[string]string{"LIMITER_TIERS_STATIC": "- plan: free\n  maxConcurrentStreams: 1\n- plan: team\n  maxConcurrentStreams: 5\n  slotTTL: 1m\n"},
			check: func(t *testing.T, c Config) {
				want(t, "tiers.static", c.StaticTiers(), []tiers.Tier{
					withDefaults(tiers.Tier{Plan: "free", MaxConcurrentStreams: 1}),
					withDefaults(tiers.Tier{Plan: "team", MaxConcurrentStreams: 5, SlotTTL: time.Minute}),
				})
			},
		},
		{
			name: "enums are case-insensitive",
			env:  map[string]string{"LIMITER_LOG_LEVEL": "WARN", "LIMITER_LOG_FORMAT": "Text", "LIMITER_TIERS_SOURCE": "Static"},
			check: func(t *testing.T, c Config) {
				want(t, "log.level", c.Log.Level, LevelWarn)
				want(t, "log.format", c.Log.Format, FormatText)
				want(t, "tiers.source", c.Tiers.Source, SourceStatic)
			},
		},
		{
			name: "booleans and numbers come from the environment as text",
			env:  map[string]string{"LIMITER_ADMIN_AUDITMAXLEN": "42", "LIMITER_REDIS_ADDRS": "r:6379", "LIMITER_REDIS_TLS_ENABLED": "true", "LIMITER_REDIS_REQUIREDFORREADINESS": "true"},
			check: func(t *testing.T, c Config) {
				want(t, "admin.auditMaxLen", c.Admin.AuditMaxLen, 42)
				want(t, "redis.tls.enabled", c.Redis.TLS.Enabled, true)
				want(t, "redis.requiredForReadiness", c.Redis.RequiredForReadiness, true)
			},
		},
		{
			name: "the kubernetes source defaults to the pod's namespace",
			env:  map[string]string{"LIMITER_TIERS_SOURCE": "kubernetes", "POD_NAMESPACE": "streams"},
			check: func(t *testing.T, c Config) {
				want(t, "tiers.namespace", c.Tiers.Namespace, "streams")
			},
		},
		{
			name: "an explicit namespace wins over the pod's",
			env:  map[string]string{"LIMITER_TIERS_SOURCE": "kubernetes", "POD_NAMESPACE": "streams"},
			args: []string{"--tiers-namespace", "tiers"},
			check: func(t *testing.T, c Config) {
				want(t, "tiers.namespace", c.Tiers.Namespace, "tiers")
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := load(t, tc.file, tc.env, tc.args...)
			if err != nil {
				t.Fatalf("Load() = %v, want no error", err)
			}
			tc.check(t, c)
		})
	}
}

// withDefaults is a tier with its defaults applied.
func withDefaults(t tiers.Tier) tiers.Tier { return t.WithDefaults() }

func want(t *testing.T, key string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", key, got, want)
	}
}

func TestLoadReadsTheNamespaceFile(t *testing.T) {
	t.Setenv(EnvConfig, "")
	t.Setenv("POD_NAMESPACE", "")
	t.Setenv("LIMITER_TIERS_SOURCE", "kubernetes")
	file := filepath.Join(t.TempDir(), "namespace")
	if err := os.WriteFile(file, []byte("limits\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(LoadOptions{NamespaceFile: file})
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	want(t, "tiers.namespace", c.Tiers.Namespace, "limits")
}

func TestLoadRefusesUnknownFileKeys(t *testing.T) {
	cases := []struct {
		name string
		file string
		want []string
	}{
		{"a misspelt key is named, with the key meant", "redis:\n  keyprefx: x\n", []string{`line 2: unknown key "redis.keyprefx"`, "did you mean redis.keyPrefix?"}},
		{"a key is named as written", "ops:\n  addr: \":1\"\nRedis:\n  KeyPrefx: x\n", []string{`line 4: unknown key "Redis.KeyPrefx" (did you mean redis.keyPrefix?)`}},
		{"a snake_case key is matched to its camelCase name", "http:\n  shutdown_grace: 5s\n", []string{`unknown key "http.shutdown_grace"`, "did you mean http.shutdownGrace?"}},
		{"an unknown section is named", "metrics:\n  addr: x\n", []string{`line 2: unknown key "metrics.addr"`}},
		{"a value where a section belongs is named", "redis:\n  tls: true\n", []string{`line 2: "redis.tls" is a section`, "redis.tls.enabled"}},
		{"an unknown key under an anchor's merge is named", "x: &base\n  addr: x\nops:\n  <<: *base\n  adr: y\n", []string{`line 2: unknown key "x.addr"`, `line 5: unknown key "ops.adr" (did you mean ops.addr?)`}},
		{"an unknown field of a tier is named, with the fields there are", "tiers:\n  static:\n    - plan: x\n      maxStreams: 3\n",
			[]string{`tiers.static[0]: unknown field "maxStreams" (`, "limiter.yaml line 4); the fields of a tier are plan, maxConcurrentStreams, slotTTL, heartbeatInterval, failureMode, maxWait, priority"}},
		{"a tier field that cannot be read is named, with its line", "tiers:\n  static:\n    - plan: x\n      maxConcurrentStreams: 1\n      slotTTL: 30\n",
			[]string{"tiers.static[0].slotTTL: cannot be read: 30 has no unit", "limiter.yaml line 5)"}},
		{"a tier that is no mapping", "tiers:\n  static:\n    - free\n", []string{"tiers.static[0]: must be a mapping of a tier's fields (plan, maxConcurrentStreams", "limiter.yaml line 3)"}},
		{"a tier list that is no list", "tiers:\n  static:\n    plan: free\n", []string{"tiers.static: must be a list of tiers, like [{plan: free, maxConcurrentStreams: 1}]", "limiter.yaml line 3)"}},
		{"a duration without a unit is refused", "redis:\n  timeout: 250\n", []string{"redis.timeout: cannot be read", "has no unit", "LIMITER_REDIS_TIMEOUT"}},
		{"a file that is not YAML is refused", "http: [\n", []string{"reading the config file (flag --config, env LIMITER_CONFIG)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.file, nil)
			if err == nil {
				t.Fatal("Load() = nil, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Load() = %q, want it to contain %q", err, w)
				}
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(%v, ErrInvalid) = false, want true", err)
			}
		})
	}
}

func TestLoadAcceptsAnEmptySection(t *testing.T) {
	if _, err := load(t, "redis:\ntelemetry:\n  serviceName: x\n", nil); err != nil {
		t.Fatalf("Load() = %v, want nil", err)
	}
}

func TestLoadFileFromEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("ops:\n  addr: \":7070\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvConfig, path)
	c, err := Load(LoadOptions{})
	if err != nil {
		t.Fatalf("Load() = %v", err)
	}
	want(t, "ops.addr", c.Ops.Addr, ":7070")
}

func TestLoadMissingFile(t *testing.T) {
	t.Setenv(EnvConfig, filepath.Join(t.TempDir(), "absent.yaml"))
	if _, err := Load(LoadOptions{}); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "absent.yaml") {
		t.Fatalf("Load() = %v, want an ErrInvalid naming the file", err)
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	const path = "../../config/limiter.yaml"
	c, err := load(t, "", nil, "--config", path)
	if err != nil {
		t.Fatalf("Load(%s) = %v", path, err)
	}
	if len(c.Redis.Addrs) == 0 || len(c.StaticTiers()) < 2 {
		t.Errorf("example config: redis.addrs = %v, tiers.static = %v: want an example of each", c.Redis.Addrs, c.Tiers.Static)
	}
	// Every key is documented in the example, set or commented out.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range configKeys() {
		if !strings.Contains(string(b), EnvVar(k.name)) {
			t.Errorf("%s does not document %s (its env var %s is not mentioned)", path, k.name, EnvVar(k.name))
		}
	}
}

// TestLoadStringsAsWritten: a string setting written in the file as YAML
// would read a number or a date (007, 1.0, 1e3, 0x1F) is the string as
// written, as the same value set by the environment is: a keyPrefix of
// 007 read as "7" would put the replica's slots in other keys than its
// peers' given LIMITER_REDIS_KEYPREFIX=007. A true or false is still
// refused (quote it).
func TestLoadStringsAsWritten(t *testing.T) {
	for _, v := range []string{"007", "1.0", "1e3", "0x1F", "2026-01-01"} {
		t.Run(v, func(t *testing.T) {
			fromFile, err := load(t, "redis:\n  addrs: [127.0.0.1:6379]\n  username: "+v+"\n  keyPrefix: "+v+"\n", nil)
			if err != nil {
				t.Fatal(err)
			}
			if fromFile.Redis.Username != v || fromFile.Redis.KeyPrefix != v {
				t.Errorf("the file's username %q, keyPrefix %q; want %q as written", fromFile.Redis.Username, fromFile.Redis.KeyPrefix, v)
			}
			fromEnv, err := load(t, "", map[string]string{"LIMITER_REDIS_ADDRS": "127.0.0.1:6379", "LIMITER_REDIS_USERNAME": v, "LIMITER_REDIS_KEYPREFIX": v})
			if err != nil {
				t.Fatal(err)
			}
			if fromEnv.Redis.KeyPrefix != fromFile.Redis.KeyPrefix {
				t.Errorf("keyPrefix from the environment %q, from the file %q; want the same", fromEnv.Redis.KeyPrefix, fromFile.Redis.KeyPrefix)
			}
		})
	}
	t.Run("true", func(t *testing.T) {
		if _, err := load(t, "redis:\n  keyPrefix: true\n", nil); err == nil || !strings.Contains(err.Error(), "quote it") {
			t.Errorf("keyPrefix: true: %v; want refused, saying to quote it", err)
		}
	})
}

// TestLoadMapKeysAsWritten: a map setting's keys written as YAML reads
// numbers are the keys as written, as the environment's are: the pools
// 007 and 1.10 of pools.static are named so by identity.pools too.
func TestLoadMapKeysAsWritten(t *testing.T) {
	const base = "redis:\n  addrs: [127.0.0.1:6379]\npools:\n  static:\n    - {pool: 007, maxConcurrentStreams: 1}\n    - {pool: 1.10, maxConcurrentStreams: 1}\n"
	fromFile, err := load(t, base+"identity:\n  pools:\n    007: header:X-Org\n    1.10: header:X-Model\n", nil)
	if err != nil {
		t.Fatalf("identity.pools from the file: %v", err)
	}
	want := map[string]string{"007": "header:X-Org", "1.10": "header:X-Model"}
	if !reflect.DeepEqual(fromFile.Identity.Pools, want) {
		t.Errorf("identity.pools from the file: %q; want %q as written", fromFile.Identity.Pools, want)
	}
	fromEnv, err := load(t, base, map[string]string{"LIMITER_IDENTITY_POOLS": "007=header:X-Org,1.10=header:X-Model"})
	if err != nil || !reflect.DeepEqual(fromEnv.Identity.Pools, fromFile.Identity.Pools) {
		t.Errorf("identity.pools from the environment: %q, %v; want the file's %q", fromEnv.Identity.Pools, err, fromFile.Identity.Pools)
	}
}
