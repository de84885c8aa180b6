package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Every LIMITER_ environment variable is a setting, so that a misspelt one
// (LIMITER_REDIS_ADDR) stops the start instead of going unnoticed, except
// those of the limiter's other tools, which no setting will ever be named
// as. config/limiter.yaml's header states the same rule.
var (
	// toolEnvPrefixes start the variables of the tests and benchmarks.
	toolEnvPrefixes = []string{"LIMITER_TEST_", "LIMITER_BENCH_"}
	// toolEnvVars are read by the clients (LIMITER_TOKEN), by `limiter
	// admin` (LIMITER_ADMIN_URL, LIMITER_ADMIN_TOKEN,
	// LIMITER_ADMIN_CA_FILE), by fault-injection builds
	// (LIMITER_FAULT_POINT) and by hack/ (the rest).
	toolEnvVars = []string{
		"LIMITER_TOKEN", "LIMITER_ADMIN_URL", "LIMITER_ADMIN_TOKEN", "LIMITER_ADMIN_CA_FILE", "LIMITER_FAULT_POINT",
		"LIMITER_CACHE", "LIMITER_HELM", "LIMITER_KUBE_SCORE", "LIMITER_PROMTOOL", "LIMITER_REDOCLY",
		"LIMITER_E2E_NPM_DIR", "LIMITER_TS_NPM_DIR", "LIMITER_NPM_CACHE",
	}
)

// isToolEnv reports whether name is a variable of the limiter's tools.
func isToolEnv(name string) bool {
	return slices.Contains(toolEnvVars, name) ||
		slices.ContainsFunc(toolEnvPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// envRule states which LIMITER_ variables may be something else than a
// setting.
func envRule() string {
	prefixes := make([]string, len(toolEnvPrefixes))
	for i, p := range toolEnvPrefixes {
		prefixes[i] = p + "*"
	}
	return fmt.Sprintf("every %s variable must be a setting (config/limiter.yaml lists them), but for those of the limiter's tools: %s, %s",
		EnvPrefix, strings.Join(prefixes, ", "), strings.Join(toolEnvVars, ", "))
}

// checkEnv refuses (Load wraps its error in ErrInvalid) the LIMITER_
// variables of environ (KEY=value pairs, as
// os.Environ) that are neither a setting nor a tool's, naming the setting
// each most likely meant. An empty variable counts as unset.
func checkEnv(environ []string) error {
	known := map[string]bool{EnvConfig: true}
	for _, k := range configKeys() {
		known[EnvVar(k.name)] = true
	}
	var unknown []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) && value != "" && !known[name] && !isToolEnv(name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	errs := make([]error, 0, len(unknown)+1)
	for _, name := range unknown {
		msg := name + " is not a setting"
		if near := nearestEnv(name); near != "" {
			msg += "; did you mean " + near + "?"
		}
		errs = append(errs, errors.New(msg))
	}
	errs = append(errs, errors.New("("+envRule()+")"))
	return fmt.Errorf("environment: %w", errors.Join(errs...))
}

// nearestEnv names the setting whose environment variable, or whose flag
// spelt as one (--listen: LIMITER_LISTEN), is most like name:
// "LIMITER_PROXY_LISTEN (proxy.listen)"; "" when none is close.
func nearestEnv(name string) string {
	var spellings []string // spellings[i] is one of settings[i]'s
	var settings []string
	for _, k := range configKeys() {
		spellings, settings = append(spellings, EnvVar(k.name)), append(settings, k.name)
		if f, ok := flagOf(k.name); ok {
			spellings, settings = append(spellings, EnvPrefix+strings.ToUpper(strings.ReplaceAll(f.name, "-", "_"))), append(settings, k.name)
		}
	}
	spellings, settings = append(spellings, EnvConfig), append(settings, FlagConfig)
	i, ok := nearest(spellings, name)
	if !ok {
		return ""
	}
	if settings[i] == FlagConfig {
		return fmt.Sprintf("%s (the config file, flag --%s)", EnvConfig, FlagConfig)
	}
	return fmt.Sprintf("%s (%s)", EnvVar(settings[i]), settings[i])
}
