package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestFlagsNameKeys(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range flagSpecs {
		if _, ok := lookupKey(f.key); !ok {
			t.Errorf("flag --%s names key %q, which Config does not have", f.name, f.key)
		}
		if seen[f.key] {
			t.Errorf("key %s has two flags", f.key)
		}
		seen[f.key] = true
	}
}

func TestEveryFlagStatesItsEnvVarAndDefault(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	AddFlags(fs)
	if got, want := countFlags(fs), len(flagSpecs)+1; got != want {
		t.Fatalf("AddFlags defined %d flags, want %d (every spec and --config)", got, want)
	}
	usages := fs.FlagUsages()
	fs.VisitAll(func(f *pflag.Flag) {
		env := EnvConfig
		if spec, ok := specOf(f.Name); ok {
			env = EnvVar(spec.key)
		}
		if !strings.Contains(f.Usage, "(env "+env+")") {
			t.Errorf("--%s usage %q does not name its env var %s", f.Name, f.Usage, env)
		}
		line := lineOf(usages, "--"+f.Name+" ")
		if !strings.Contains(line, "(default ") {
			t.Errorf("--%s help %q does not state its default", f.Name, line)
		}
	})
}

func TestFlagDefaultsAreTheConfigDefaults(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	AddFlags(fs)
	def := Default()
	for _, spec := range flagSpecs {
		k, _ := lookupKey(spec.key)
		got := fs.Lookup(spec.name).DefValue
		wantVal := k.field(&def).Interface()
		if s, ok := wantVal.([]string); ok && len(s) == 0 {
			wantVal = "[]"
		}
		if got != fmt.Sprint(wantVal) {
			t.Errorf("--%s default = %q, want %v", spec.name, got, wantVal)
		}
	}
}

func specOf(name string) (flagSpec, bool) {
	for _, f := range flagSpecs {
		if f.name == name {
			return f, true
		}
	}
	return flagSpec{}, false
}

func countFlags(fs *pflag.FlagSet) int {
	n := 0
	fs.VisitAll(func(*pflag.Flag) { n++ })
	return n
}

func lineOf(usages, prefix string) string {
	for line := range strings.SplitSeq(usages, "\n") {
		if strings.Contains(line, prefix) {
			return line
		}
	}
	return ""
}
