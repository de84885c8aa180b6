package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
)

// runMainEnv makes the test binary run main instead of the tests, so a test
// can start the command as a real process and signal it.
const runMainEnv = "LIMITER_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// local are listen flags that cannot collide with anything.
var local = []string{"--http-addr", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0"}

func TestRunExitCodes(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent")) // no API server to be found
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	badFile := filepath.Join(t.TempDir(), "limiter.yaml")
	if err := os.WriteFile(badFile, []byte("redis:\n  adrs: [r:6379]\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	badTier := filepath.Join(t.TempDir(), "limiter.yaml")
	if err := os.WriteFile(badTier, []byte("tiers:\n  static:\n    - plan: free\n      maxConcurentStreams: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	badTokens := filepath.Join(t.TempDir(), "api-tokens")
	if err := os.WriteFile(badTokens, []byte("# callers\nchat s3cr3t-short free\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	adminTokens := filepath.Join(t.TempDir(), "admin-tokens")
	if err := os.WriteFile(adminTokens, []byte("ops operator s3cr3t-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	inUse := busy.Addr().String() + ": bind: address already in use"

	checkRuns(t, []runCase{
		{"version prints the Go version", []string{"version"}, exitOK, runtime.Version(), ""},
		{"serve --help names each flag's env var and default", []string{"serve", "--help"}, exitOK, "(env LIMITER_REDIS_TIMEOUT) (default 250ms)", ""},
		{"an unknown flag is a usage error", []string{"serve", "--bogus"}, exitUsage, "", "unknown flag: --bogus (see limiter serve --help)"},
		{"an unknown command is a usage error", []string{"frobnicate"}, exitUsage, "", `unknown command "frobnicate"`},
		{"an argument to serve is a usage error", []string{"serve", "now"}, exitUsage, "", `unknown command "now"`},
		{"an invalid value is a configuration error naming its key", []string{"serve", "--redis-timeout", "-1s"}, exitUsage, "", "redis.timeout: must be > 0 and <= 10s (env LIMITER_REDIS_TIMEOUT, flag --redis-timeout), got -1s"},
		{"an unknown key in the file is a configuration error", []string{"serve", "--config", badFile}, exitUsage, "", `line 2: unknown key "redis.adrs" (did you mean redis.addrs?)`},
		{"a misspelt field of a tier names its line and the field meant", []string{"serve", "--config", badTier}, exitUsage, "",
			`tiers.static[0]: unknown field "maxConcurentStreams" (` + badTier + ` line 4); did you mean "maxConcurrentStreams"?`},
		{"a bad API tokens file is a configuration error naming the file and the line", append([]string{"serve", "--api-tokens-file", badTokens}, local...), exitUsage, "",
			"api.tokensFile (env LIMITER_API_TOKENSFILE): " + badTokens + ": line 2: the token (field 2) is 12 characters"},
		{"the kubernetes tier source without an API server is a failure", append([]string{"serve", "--tiers-source", "kubernetes", "--tiers-namespace", "limits"}, local...), exitFailure, "", "limiter: tiers.source kubernetes: no Kubernetes API server"},
		{"a listener that cannot start is a failure", []string{"serve", "--http-addr", busy.Addr().String(), "--ops-addr", "127.0.0.1:0"}, exitFailure, "", "http.addr " + busy.Addr().String()},
		{"the API listener's error names its key, variable and flag", []string{"serve", "--http-addr", busy.Addr().String(), "--ops-addr", "127.0.0.1:0"}, exitFailure, "",
			"http.addr " + busy.Addr().String() + ": listen tcp " + inUse + " (env LIMITER_HTTP_ADDR, flag --http-addr)"},
		{"the ops listener's error names its key, variable and flag", []string{"serve", "--http-addr", "127.0.0.1:0", "--ops-addr", busy.Addr().String()}, exitFailure, "",
			"ops.addr " + busy.Addr().String() + ": listen tcp " + inUse + " (env LIMITER_OPS_ADDR, flag --ops-addr)"},
		{"the admin listener's error names its key, variable and flag", append([]string{"serve", "--admin-tokens-file", adminTokens, "--admin-addr", busy.Addr().String()}, local...), exitFailure, "",
			"admin.addr " + busy.Addr().String() + ": listen tcp " + inUse + " (env LIMITER_ADMIN_ADDR, flag --admin-addr)"},
		{"the ext_proc listener's error names its key, variable and flag", append([]string{"serve", "--extproc-addr", busy.Addr().String()}, local...), exitFailure, "",
			"extproc.addr " + busy.Addr().String() + ": listen tcp " + inUse + " (env LIMITER_EXTPROC_ADDR, flag --extproc-addr)"},
	})
}

// A LIMITER_ variable that is no setting stops the start, as a
// configuration error, naming the setting meant; those of the limiter's
// tools do not.
func TestUnknownVariablesStopTheStart(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent"))
	t.Setenv("LIMITER_REDIS_ADDR", "127.0.0.1:1")
	// `limiter admin`'s variables are no settings, and left alone: were
	// they named, they would come before LIMITER_REDIS_ADDR.
	t.Setenv(envAdminURL, "http://127.0.0.1:8081")
	t.Setenv(envAdminToken, "s3cr3t-0123456789abcdef")
	t.Setenv(envAdminCAFile, "/etc/limiter/admin-ca.crt")
	checkRuns(t, []runCase{
		{"serve", append([]string{"serve"}, local...), exitUsage, "",
			"limiter: invalid configuration: environment: LIMITER_REDIS_ADDR is not a setting; did you mean LIMITER_REDIS_ADDRS (redis.addrs)?\n  (every LIMITER_ variable must be a setting"},
		{"proxy", []string{"proxy", "--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0"}, exitUsage, "",
			"LIMITER_REDIS_ADDR is not a setting; did you mean LIMITER_REDIS_ADDRS (redis.addrs)?"},
	})
}

// runCase is a command line and what run must answer it with.
type runCase struct {
	name       string
	args       []string
	wantCode   int
	wantStdout string // contained in stdout
	wantStderr string // contained in stderr
}

// checkRuns runs each case in a subtest of its own. No case's stderr may
// hold the tests' token (s3cr3t): a bad tokens file is named, never shown.
func checkRuns(t *testing.T, cases []runCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr testenv.Buffer
			code := run(t.Context(), tc.args, &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("run(%q) = %d, want %d; stderr:\n%s", tc.args, code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout = %q, want it to contain %q", stdout.String(), tc.wantStdout)
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tc.wantStderr)
			}
			if strings.Contains(stderr.String(), "s3cr3t") {
				t.Errorf("stderr = %q, want no token in it", stderr.String())
			}
		})
	}
}

func TestServeDrainsAndWarnsOnceAboutTheEmbeddedStore(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--log-format", "text"}, local...), &stdout, &stderr)
	}()

	waitFor(t, &stderr, "msg=listening", done)
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("run() = %d after a graceful drain, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return 10s after its context ended")
	}
	logs := stderr.String()
	if n := strings.Count(logs, "embedded store"); n != 1 {
		t.Errorf("the embedded-store warning appears %d times, want once; logs:\n%s", n, logs)
	}
	if !strings.Contains(logs, "level=WARN msg=\"redis.addrs is empty: using the embedded store") {
		t.Errorf("the embedded-store warning is not at WARN; logs:\n%s", logs)
	}
	if !strings.Contains(logs, "level=WARN msg=\"api.tokensFile is not set: the slot API is open") {
		t.Errorf("no WARN that the slot API is open; logs:\n%s", logs)
	}
}

// TestSIGTERMDrainsAndExitsZero runs the command as a process and sends it
// the signal Kubernetes sends.
func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	if testing.Short() && !testenv.Required() {
		t.Skip("starts a process")
	}
	cmd := exec.Command(os.Args[0], append([]string{"serve"}, local...)...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // already exited when the test passes

	var logs bytes.Buffer
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		logs.WriteString(lines.Text() + "\n")
		if strings.Contains(lines.Text(), `"msg":"listening"`) {
			break
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(stderr)
	logs.Write(rest)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v, want exit 0; stderr:\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Errorf("no \"stopped\" line after SIGTERM; stderr:\n%s", logs.String())
	}
}

func TestVersionUsesLinkTimeValues(t *testing.T) {
	oldVersion, oldCommit := version, commit
	version, commit = "v1.2.3", "abc123"
	defer func() { version, commit = oldVersion, oldCommit }()
	var stdout testenv.Buffer
	if code := run(t.Context(), []string{"version"}, &stdout, io.Discard); code != exitOK {
		t.Fatalf("run(version) = %d", code)
	}
	for _, want := range []string{"version: v1.2.3\n", "commit:  abc123\n", "go:      " + runtime.Version()} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("version output %q does not contain %q", stdout.String(), want)
		}
	}
}

// waitFor waits until buf holds s, failing if run returns first.
func waitFor(t *testing.T, buf *testenv.Buffer, s string, done <-chan int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !strings.Contains(buf.String(), s) {
		select {
		case code := <-done:
			t.Fatalf("run() returned %d before %q was logged; logs:\n%s", code, s, buf.String())
		case <-deadline:
			t.Fatalf("%q not logged within 10s; logs:\n%s", s, buf.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
