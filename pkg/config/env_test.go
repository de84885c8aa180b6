package config

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestLoadRefusesUnknownEnvironment(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		want    string
		notWant string
	}{
		{"a misspelt setting names the one meant", map[string]string{"LIMITER_REDIS_ADDR": "r:6379"},
			"LIMITER_REDIS_ADDR is not a setting; did you mean LIMITER_REDIS_ADDRS (redis.addrs)?", ""},
		{"a camelCase key split at its words", map[string]string{"LIMITER_HTTP_SHUTDOWN_GRACE": "5s"},
			"did you mean LIMITER_HTTP_SHUTDOWNGRACE (http.shutdownGrace)?", ""},
		{"a flag spelt as a variable names its setting", map[string]string{"LIMITER_LISTEN": ":8001"},
			"LIMITER_LISTEN is not a setting; did you mean LIMITER_PROXY_LISTEN (proxy.listen)?", ""},
		{"a setting in lower case", map[string]string{"LIMITER_redis_timeout": "1s"},
			"did you mean LIMITER_REDIS_TIMEOUT (redis.timeout)?", ""},
		{"the config file's variable misspelt", map[string]string{"LIMITER_CONFIGG": "x.yaml"},
			"did you mean LIMITER_CONFIG (the config file, flag --config)?", ""},
		{"nothing close is suggested", map[string]string{"LIMITER_FROBNICATE": "1"},
			"LIMITER_FROBNICATE is not a setting", "did you mean"},
		{"the rule is stated", map[string]string{"LIMITER_REDIS_ADDR": "r:6379"},
			"every LIMITER_ variable must be a setting (config/limiter.yaml lists them), but for those of the limiter's tools: LIMITER_TEST_*, LIMITER_BENCH_*, LIMITER_TOKEN, LIMITER_ADMIN_URL", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, "", tc.env)
			if err == nil || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Load() = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load() = %q, want it to contain %q", err, tc.want)
			}
			if tc.notWant != "" && strings.Contains(err.Error(), tc.notWant) {
				t.Errorf("Load() = %q, want no %q", err, tc.notWant)
			}
		})
	}
}

func TestLoadReportsTheEnvironmentAndTheFileAtOnce(t *testing.T) {
	_, err := load(t, "redis:\n  adrs: [r:6379]\n", map[string]string{"LIMITER_REDIS_ADDR": "r:6379"})
	for _, want := range []string{"LIMITER_REDIS_ADDR is not a setting", `unknown key "redis.adrs"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load() = %v, want it to say %q", err, want)
		}
	}
}

func TestLoadLeavesToolVariablesAlone(t *testing.T) {
	env := map[string]string{
		"LIMITER_TEST_REDIS": "r:6379", "LIMITER_BENCH_SCALE": "1",
		"LIMITER_REDIS_ADDR": "", // empty counts as unset
	}
	for _, name := range toolEnvVars {
		env[name] = "x"
	}
	if _, err := load(t, "", env); err != nil {
		t.Fatalf("Load() = %v, want the tools' variables left alone", err)
	}
}

// No setting may be named as a tool's variable: it would go unchecked.
func TestNoSettingIsAToolVariable(t *testing.T) {
	for _, k := range configKeys() {
		if isToolEnv(EnvVar(k.name)) {
			t.Errorf("%s's variable %s is a tool's (toolEnvVars, toolEnvPrefixes)", k.name, EnvVar(k.name))
		}
	}
	if isToolEnv(EnvConfig) {
		t.Errorf("%s is a tool's variable", EnvConfig)
	}
}

// config/limiter.yaml states the rule: it names every tool's variable.
func TestExampleConfigNamesTheToolVariables(t *testing.T) {
	b, err := os.ReadFile("../../config/limiter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append(append([]string(nil), toolEnvVars...), toolEnvPrefixes...) {
		if !strings.Contains(string(b), name) {
			t.Errorf("config/limiter.yaml does not name %s, a LIMITER_ variable that is no setting", name)
		}
	}
}
