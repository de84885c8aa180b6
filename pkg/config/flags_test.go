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

// specsOf returns the flag specs of command.
func specsOf(command string) []flagSpec {
	var out []flagSpec
	for _, f := range flagSpecs {
		if f.only == "" || f.only == command {
			out = append(out, f)
		}
	}
	return out
}

func TestEveryFlagStatesItsEnvVarAndDefault(t *testing.T) {
	for _, command := range []string{CommandServe, CommandProxy} {
		t.Run(command, func(t *testing.T) { testFlagHelp(t, command) })
	}
}

func testFlagHelp(t *testing.T, command string) {
	fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
	AddCommandFlags(fs, command)
	if got, want := countFlags(fs), len(specsOf(command))+1; got != want {
		t.Fatalf("AddCommandFlags(%s) defined %d flags, want %d (every spec of the command and --config)", command, got, want)
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
	for _, command := range []string{CommandServe, CommandProxy} {
		fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
		AddCommandFlags(fs, command)
		testFlagDefaults(t, fs, command)
	}
}

// The flags of each command are its own: serve has no proxy flags, and
// the proxy neither the API's address nor the admin API's tokens.
func TestFlagsBelongToTheirCommand(t *testing.T) {
	for command, absent := range map[string][]string{
		CommandServe: {"upstream", "listen", "jwt-issuer"},
		CommandProxy: {"http-addr", "admin-tokens-file"},
	} {
		fs := pflag.NewFlagSet(command, pflag.ContinueOnError)
		AddCommandFlags(fs, command)
		for _, name := range absent {
			if fs.Lookup(name) != nil {
				t.Errorf("%s has --%s", command, name)
			}
		}
	}
}

func testFlagDefaults(t *testing.T, fs *pflag.FlagSet, command string) {
	t.Helper()
	def := DefaultFor(command)
	for _, spec := range specsOf(command) {
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
