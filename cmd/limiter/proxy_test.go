package main

import (
	"net"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/spf13/pflag"
)

func TestProxyCommandLine(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	listen := []string{"--listen", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0"}
	inUse := busy.Addr().String() + ": bind: address already in use"
	checkRuns(t, []runCase{
		{"--help names each flag's env var and default", []string{"proxy", "--help"}, exitOK, "(env LIMITER_PROXY_UPSTREAM) (default none: required)", ""},
		{"no upstream is a configuration error", append([]string{"proxy"}, listen...), exitUsage, "", "proxy.upstream: is required"},
		{"an upstream that is no URL", append([]string{"proxy", "--upstream", "my-llm:8000"}, listen...), exitUsage, "", "proxy.upstream: must be an http:// or https:// URL"},
		{"a JWT without its issuer", append([]string{"proxy", "--upstream", "http://x", "--jwt-jwks-url", "https://auth/jwks", "--jwt-audience", "a"}, listen...), exitUsage, "", "identity.jwt.issuer: is required"},
		{"serve's own flags are not the proxy's", []string{"proxy", "--http-addr", ":1"}, exitUsage, "", "unknown flag: --http-addr"},
		{"a listener that cannot start is a failure", []string{"proxy", "--upstream", "http://127.0.0.1:1", "--listen", busy.Addr().String(), "--ops-addr", "127.0.0.1:0"}, exitFailure, "", "proxy.listen " + busy.Addr().String()},
		{"the proxy listener's error names its key, variable and flag", []string{"proxy", "--upstream", "http://127.0.0.1:1", "--listen", busy.Addr().String(), "--ops-addr", "127.0.0.1:0"}, exitFailure, "",
			"proxy.listen " + busy.Addr().String() + ": listen tcp " + inUse + " (env LIMITER_PROXY_LISTEN, flag --listen)\n"},
		{"the ops listener's error names its key, variable and flag", []string{"proxy", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--ops-addr", busy.Addr().String()}, exitFailure, "",
			"ops.addr " + busy.Addr().String() + ": listen tcp " + inUse + " (env LIMITER_OPS_ADDR, flag --ops-addr)"},
		{"a listen port taken by the upstream on this host says so", []string{"proxy", "--upstream", "http://" + busy.Addr().String(), "--listen", busy.Addr().String(), "--ops-addr", "127.0.0.1:0"}, exitFailure, "",
			"(env LIMITER_PROXY_LISTEN, flag --listen); the upstream http://" + busy.Addr().String() + " is likely what listens there (vLLM, like the proxy, defaults to :8000)"},
		{"--help states the proxy's own ops port", []string{"proxy", "--help"}, exitOK, `(env LIMITER_OPS_ADDR) (default ":9092")`, ""},
	})
}

// proxy --help explains every one of its flags.
func TestProxyHelpListsEveryFlag(t *testing.T) {
	var stdout, stderr testenv.Buffer
	if code := run(t.Context(), []string{"proxy", "--help"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("proxy --help = %d: %s", code, stderr.String())
	}
	cmd := newProxyCommand(serveDeps{})
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(stdout.String(), "--"+f.Name+" ") || f.Usage == "" {
			t.Errorf("proxy --help does not explain --%s", f.Name)
		}
	})
	for _, want := range []string{"stream_limit_reached", "SIGTERM", "trusted as\n    they come"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("proxy --help does not say %q", want)
		}
	}
}
