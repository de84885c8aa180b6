package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
)

const (
	clientsAppToken    = "e2e-clients-app-token-0123456789"
	clientsScopedToken = "e2e-clients-scoped-token-0123456789"
	clientsAdminToken  = "e2e-clients-operator-token-0123456789"
)

// clientsPools caps the pool key model=gpt-4o at one stream; every other
// key of the pool model is not capped.
const clientsPools = `pools:
  static:
    - pool: model
      keys: {gpt-4o: 1}
`

// startClientServers starts what the Python and TypeScript clients' suites
// run against, and returns the environment that tells them where:
//
//   - LIMITER_TEST_URL, _OPS_URL, _ADMIN_URL: a serve on the shared Redis
//     with incidentTiers (free 1, paid 3; 2s TTL, 500ms heartbeats) and
//     clientsPools (model=gpt-4o capped at 1), callers authenticated by
//     api.tokensFile and the admin API on (LIMITER_TEST_ADMIN_TOKEN, an
//     operator);
//   - LIMITER_TOKEN, the default caller token of the clients, which may use
//     every plan; LIMITER_TEST_SCOPED_TOKEN, a caller of paid only;
//   - LIMITER_TEST_TLS_URL: a serve over TLS trusting client certificates
//     of LIMITER_TEST_TLS_CA; LIMITER_TEST_TLS_CERT and _KEY name the
//     caller edge.example, which may use free only.
//
// It also sets LIMITER_TEST_REQUIRE=1: a suite never skips a test for a
// missing server.
func startClientServers(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	redis := []string{testenv.Redis(t)}
	prefix := "e2e-clients-" + randomID() + ":"
	apiTokens := write("api-tokens", "app "+clientsAppToken+" *\nscoped "+clientsScopedToken+" paid\n")
	adminTokens := write("admin-tokens", "support operator "+clientsAdminToken+"\n")
	plain := servetest.Start(t, servetest.Options{AwaitRedis: true, Config: serveConfig(redis, prefix, incidentTiers) + clientsPools +
		"api:\n  tokensFile: " + apiTokens + "\nadmin:\n  tokensFile: " + adminTokens + "\n"})

	ca := testenv.NewCA(t)
	serverCert, serverKey := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	clientCert, clientKey := ca.IssueFiles(t, dir, "client", testenv.CertSpec{CommonName: "edge", DNSNames: []string{"edge.example"}})
	caFile := ca.File(t, dir)
	tlsTokens := write("tls-api-tokens", "app "+clientsAppToken+" *\nedge.example - free\n")
	secure := servetest.Start(t, servetest.Options{AwaitRedis: true, Config: serveConfig(redis, prefix, incidentTiers) + clientsPools +
		"api:\n  tokensFile: " + tlsTokens + "\n" +
		"http:\n  tls:\n    certFile: " + serverCert + "\n    keyFile: " + serverKey + "\n    clientCAFile: " + caFile + "\n"})

	return []string{
		"LIMITER_TEST_REQUIRE=1",
		"LIMITER_TEST_URL=" + plain.API,
		"LIMITER_TEST_OPS_URL=" + plain.Ops,
		"LIMITER_TEST_ADMIN_URL=" + plain.Admin,
		"LIMITER_TEST_ADMIN_TOKEN=" + clientsAdminToken,
		"LIMITER_TOKEN=" + clientsAppToken,
		"LIMITER_TEST_SCOPED_TOKEN=" + clientsScopedToken,
		"LIMITER_TEST_TLS_URL=https://" + strings.TrimPrefix(secure.API, "http://"),
		"LIMITER_TEST_TLS_CA=" + caFile,
		"LIMITER_TEST_TLS_CERT=" + clientCert,
		"LIMITER_TEST_TLS_KEY=" + clientKey,
	}
}

// runSuite runs a client's test command with env added and returns its
// output, failing the test when it fails.
func runSuite(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s in %s: %v after %v\n%s", filepath.Base(name), strings.Join(args, " "), dir, err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("%s %s: passed in %v", filepath.Base(name), strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return string(out)
}

// TestPythonClient runs the Python client's unittest suite
// (clients/python/tests) against real serve processes on real Redis.
func TestPythonClient(t *testing.T) {
	python := testenv.Python(t)
	// No __pycache__ in the source tree.
	env := append(startClientServers(t), "PYTHONDONTWRITEBYTECODE=1")
	out := runSuite(t, filepath.Join("..", "clients", "python"), env, python, "-m", "unittest", "discover", "-v", "-b", "-s", "tests", "-t", ".")

	// unittest's closing lines: "Ran N tests in Xs", then "OK" alone (a
	// skip would read "OK (skipped=N)").
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests? in .*\n\n(.*)$`).FindStringSubmatch(out)
	if ran == nil || ran[2] != "OK" {
		t.Fatalf("unittest did not close with a plain OK (no test may be skipped):\n%s", out)
	}
	t.Logf("unittest ran %s tests", ran[1])
	for _, name := range []string{
		"test_acquire_up_to_the_limit_then_limit_reached",
		"test_release_frees_the_slot_and_is_idempotent",
		"test_close_releases_every_lease_and_marks_it_lost",
		"test_heartbeats_batch_every_lease_in_one_request_per_interval",
		"test_admin_release_marks_the_lease_lost",
		"test_unanswered_acquire_is_retried_under_the_same_stream_id",
		"test_acquire_that_gives_up_releases_its_stream_id",
		"test_callers_authenticate_with_their_token",
		"test_mutual_tls",
		"test_acquire_sends_label_only_when_set",
		"test_label_is_recorded_with_the_slot",
		"test_a_slot_belongs_to_the_caller_that_took_it",
		"test_pool_key_is_a_cap_shared_by_every_user",
	} {
		if !regexp.MustCompile(`(?m)^` + name + ` \(.*\) \.\.\. ok$`).MatchString(out) {
			t.Errorf("the suite did not pass %s:\n%s", name, out)
		}
	}
}

// TestTypeScriptClient type-checks and compiles the TypeScript client and
// its tests with tsc (strict), then runs them with node --test against real
// serve processes on real Redis.
func TestTypeScriptClient(t *testing.T) {
	node := testenv.Node(t, 20)
	modules := testenv.TypeScriptModules(t)
	env := startClientServers(t)
	var caFile string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LIMITER_TEST_TLS_CA="); ok {
			caFile = v
		}
	}
	// The global fetch trusts the CA only through this, read at start.
	env = append(env, "NODE_EXTRA_CA_CERTS="+caFile)

	src, err := filepath.Abs(filepath.Join("..", "clients", "typescript"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "dist")
	runSuite(t, src, nil, node, filepath.Join(modules, "typescript", "bin", "tsc"), "-p", src,
		"--outDir", out, "--typeRoots", filepath.Join(modules, "@types"))
	// The compiled modules are ES modules, as the package says.
	if err := os.WriteFile(filepath.Join(out, "package.json"), []byte(`{"type": "module"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(out, "test", "*.test.js"))
	if err != nil || len(files) == 0 {
		t.Fatalf("tsc wrote no test files to %s/test (%v)", out, err)
	}
	tap := runSuite(t, out, env, node, append([]string{"--test", "--test-reporter=tap"}, files...)...)

	// node's closing lines; a skipped suite is counted in none of them,
	// hence the check for SKIP.
	for _, want := range []string{"# fail 0", "# cancelled 0", "# skipped 0", "# todo 0"} {
		if !regexp.MustCompile(`(?m)^` + want + `$`).MatchString(tap) {
			t.Errorf("node --test did not close with %q:\n%s", want, tap)
		}
	}
	if strings.Contains(tap, "# SKIP") {
		t.Errorf("node --test skipped tests:\n%s", tap)
	}
	if m := regexp.MustCompile(`(?m)^# pass (\d+)$`).FindStringSubmatch(tap); m != nil {
		t.Logf("node --test passed %s tests", m[1])
	}
	for _, name := range []string{
		"acquire up to the limit, then stream_limit_reached with its fields",
		"release frees the slot and is idempotent",
		"close releases every lease and marks it lost",
		"heartbeats batch every lease in one request per interval",
		"an admin release marks the lease lost",
		"an unanswered acquire is retried under the same stream id (503)",
		"an unanswered acquire is retried under the same stream id (drop)",
		"an acquire that gives up releases its stream id",
		"callers authenticate with their token",
		"TLS: the global fetch trusting the service's CA, and mutual TLS through the fetch option",
		"acquire sends label only when set",
		"the label is recorded with the slot",
		"a slot belongs to the caller that took it",
		"a pool key is a cap shared by every user",
	} {
		if !regexp.MustCompile(`(?m)^\s*ok \d+ - ` + regexp.QuoteMeta(name) + `$`).MatchString(tap) {
			t.Errorf("node --test did not pass %q:\n%s", name, tap)
		}
	}
}
