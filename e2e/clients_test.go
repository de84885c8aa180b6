package e2e

import (
	"context"
	"fmt"
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

// clientsTiers are incidentTiers and watch, a plan of one stream in shadow
// mode (enforce: false).
const clientsTiers = incidentTiers + `    - plan: watch
      maxConcurrentStreams: 1
      slotTTL: 2s
      heartbeatInterval: 500ms
      enforce: false
`

// clientsPools caps the pool key model=gpt-4o at one stream; every other
// key of the pool model is not capped. The pool org, in shadow mode, caps
// each of its keys at one stream.
const clientsPools = `pools:
  static:
    - pool: model
      keys: {gpt-4o: 1}
    - pool: org
      maxConcurrentStreams: 1
      enforce: false
`

// startClientServers starts what the Python and TypeScript clients' suites
// run against, and returns the environment that tells them where:
//
//   - LIMITER_TEST_URL, _OPS_URL, _ADMIN_URL: a serve on the shared Redis
//     with clientsTiers (free 1, paid 3, watch 1 in shadow mode; 2s TTL,
//     500ms heartbeats) and clientsPools (model=gpt-4o capped at 1, org's
//     keys at 1 in shadow mode), callers authenticated by
//     api.tokensFile and the admin API on (LIMITER_TEST_ADMIN_TOKEN, an
//     operator);
//   - LIMITER_TOKEN, the default caller token of the clients, which may use
//     every plan; LIMITER_TEST_SCOPED_TOKEN, a caller of paid only;
//   - LIMITER_TEST_TLS_URL: a serve over TLS trusting client certificates
//     of LIMITER_TEST_TLS_CA; LIMITER_TEST_TLS_CERT and _KEY name the
//     caller edge.example, which may use free only;
//     LIMITER_TEST_TLS_ADMIN_URL: its admin listener, over TLS too
//     (https://), with the same operator token.
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
	plain := servetest.Start(t, servetest.Options{AwaitRedis: true, Config: serveConfig(redis, prefix, clientsTiers) + clientsPools +
		"api:\n  tokensFile: " + apiTokens + "\nadmin:\n  tokensFile: " + adminTokens + "\n"})

	ca := testenv.NewCA(t)
	serverCert, serverKey := ca.IssueFiles(t, dir, "server", testenv.CertSpec{CommonName: "limiter", IPs: []string{"127.0.0.1"}})
	clientCert, clientKey := ca.IssueFiles(t, dir, "client", testenv.CertSpec{CommonName: "edge", DNSNames: []string{"edge.example"}})
	caFile := ca.File(t, dir)
	tlsTokens := write("tls-api-tokens", "app "+clientsAppToken+" *\nedge.example - free\n")
	secure := servetest.Start(t, servetest.Options{AwaitRedis: true, Config: serveConfig(redis, prefix, clientsTiers) + clientsPools +
		"api:\n  tokensFile: " + tlsTokens + "\nadmin:\n  tokensFile: " + adminTokens + "\n" +
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
		"LIMITER_TEST_TLS_ADMIN_URL=https://" + strings.TrimPrefix(secure.Admin, "http://"),
		"LIMITER_TEST_TLS_CA=" + caFile,
		"LIMITER_TEST_TLS_CERT=" + clientCert,
		"LIMITER_TEST_TLS_KEY=" + clientKey,
	}
}

// runSuite runs a command of a client's (its suite, an install) with env
// added and returns its output, failing the test when it fails.
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
	t.Parallel()
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
	wantPassed(t, "unittest", out, `(?m)^%s \(.*\) \.\.\. ok$`, []string{
		"test_acquire_up_to_the_limit_then_limit_reached",
		"test_release_frees_the_slot_and_is_idempotent",
		"test_close_releases_every_lease_and_marks_it_lost",
		"test_heartbeats_batch_every_lease_in_one_request_per_interval",
		"test_admin_release_marks_the_lease_lost",
		"test_unanswered_acquire_is_retried_under_the_same_stream_id",
		"test_acquire_that_gives_up_releases_its_stream_id",
		"test_a_given_up_acquire_that_lands_late_is_released_once_more",
		"test_given_up_acquire_is_released_once_more_only_under_an_id_of_the_clients_own",
		"test_callers_authenticate_with_their_token",
		"test_mutual_tls",
		"test_admin_over_tls",
		"test_acquire_sends_label_only_when_set",
		"test_a_redirect_is_not_followed",
		"test_label_is_recorded_with_the_slot",
		"test_a_slot_belongs_to_the_caller_that_took_it",
		"test_pool_key_is_a_cap_shared_by_every_user",
		"test_lease_says_what_its_acquire_answered",
		"test_release_of_a_lost_lease_spares_the_slot_reacquired_under_its_id",
		"test_release_of_a_lost_lease_is_sent_only_where_its_slot_may_be_held",
		"test_a_retry_waits_the_retry_after_of_the_answer_before",
		"test_ids_not_of_utf8_are_invalid_requests",
		"test_admin_path_ids_not_of_utf8_are_invalid_requests",
	})
}

// TestTypeScriptClient type-checks and compiles the TypeScript client and
// its tests with tsc (strict), then runs them with node --test against real
// serve processes on real Redis.
func TestTypeScriptClient(t *testing.T) {
	t.Parallel()
	node := testenv.Node(t, 18)
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
	wantPassed(t, "node --test", tap, `(?m)^\s*ok \d+ - %s$`, []string{
		"acquire up to the limit, then stream_limit_reached with its fields",
		"release frees the slot and is idempotent",
		"close releases every lease and marks it lost",
		"heartbeats batch every lease in one request per interval",
		"an admin release marks the lease lost",
		"an unanswered acquire is retried under the same stream id (503)",
		"an unanswered acquire is retried under the same stream id (drop)",
		"an acquire that gives up releases its stream id",
		"a given-up acquire that lands late is released once more",
		"a given-up acquire is released once more only under an id of the client's own",
		"callers authenticate with their token",
		"TLS: the global fetch trusting the service's CA, and mutual TLS through the fetch option",
		"TLS: the admin API over https, its CA trusted",
		"acquire sends label only when set",
		"a redirect is not followed: a 3xx is http_<status> naming its Location, and nothing is sent there",
		"the label is recorded with the slot",
		"a slot belongs to the caller that took it",
		"a pool key is a cap shared by every user",
		"a lease says what its acquire answered",
		"the release of a lost lease spares the slot re-acquired under its stream id (by the same client)",
		"the release of a lost lease spares the slot re-acquired under its stream id (by another client)",
		"a retry waits the Retry-After of the answer before it",
		"ids holding a lone surrogate are refused as invalid, as from the Python client",
		"admin path ids holding a lone surrogate are refused as invalid, as from the Python client",
	})
}

// wantPassed checks that out, what the test runner suite printed, reports
// each test of names passed: line is the regexp of a passing test's line,
// %s standing for its name.
func wantPassed(t *testing.T, suite, out, line string, names []string) {
	t.Helper()
	for _, name := range names {
		if !regexp.MustCompile(fmt.Sprintf(line, regexp.QuoteMeta(name))).MatchString(out) {
			t.Errorf("%s did not pass %q:\n%s", suite, name, out)
		}
	}
}

// debianPython is the interpreter the Python client is installed with: only
// the distribution's python3 sees Debian's setuptools and wheel, which build
// it offline (there is no Python package registry to fetch them from).
const debianPython = "/usr/bin/python3"

// pythonConsumer is an application of the installed Python client: it
// acquires, is refused a second stream on free (limit 1), and releases by
// leaving the with block, after which the slot is free again.
const pythonConsumer = `import os, sys
import limiter_client
from limiter_client import Client, LimitReached

user = sys.argv[1]
with Client(os.environ["LIMITER_TEST_URL"]) as limits:
    with limits.acquire(user, "free") as lease:
        try:
            limits.acquire(user, "free")
            sys.exit("a second stream on free (limit 1) was granted")
        except LimitReached as err:
            print("refused: %s of %s" % (err.used, err.limit))
    limits.acquire(user, "free").release()
print("released", lease.stream_id)
print("imported from", limiter_client.__file__)
`

// TestPythonClientInstall installs the Python client as its README says,
// pip install ./clients/python, into a new virtual environment, offline and
// with Debian's setuptools, then runs an application of it against a real
// serve.
func TestPythonClientInstall(t *testing.T) {
	t.Parallel()
	if err := exec.Command(debianPython, "-c", "import ensurepip, setuptools, wheel").Run(); err != nil {
		missingTool(t, fmt.Sprintf("%s cannot build the package in a venv (%v)", debianPython, err),
			"installs python3-venv, python3-setuptools and python3-wheel")
	}
	env := append(startClientServers(t), "PYTHONDONTWRITEBYTECODE=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	dir := t.TempDir()
	// A copy, so that setuptools' build/ and *.egg-info stay out of the clone.
	src := filepath.Join(dir, "clients", "python")
	copyClient(t, filepath.Join("..", "clients", "python"), src)
	venv := filepath.Join(dir, "venv")
	runSuite(t, dir, env, debianPython, "-m", "venv", "--system-site-packages", venv)
	runSuite(t, dir, env, filepath.Join(venv, "bin", "pip"), "install", "--no-index", "--no-build-isolation", "./clients/python")

	python := filepath.Join(venv, "bin", "python")
	// The distribution is named as its package is: limiter-client, limiter_client.
	if got := strings.TrimSpace(runSuite(t, dir, env, python, "-c", "import importlib.metadata as m; print(m.packages_distributions()['limiter_client'])")); got != "['limiter-client']" {
		t.Errorf("distributions of the package limiter_client: got %s, want ['limiter-client']", got)
	}
	app := filepath.Join(dir, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(app, "app.py"), []byte(pythonConsumer), 0o600); err != nil {
		t.Fatal(err)
	}
	out := runSuite(t, app, env, python, "app.py", "py-install-"+randomID())
	wantLines(t, out, `(?m)^refused: 1 of 1$`, `(?m)^released \S+$`,
		`(?m)^imported from `+regexp.QuoteMeta(venv)+`/lib/python3[.\d]*/site-packages/limiter_client/__init__\.py$`)
}

// typeScriptConsumer is an application of the installed TypeScript client
// (an ES module): it acquires, is refused a second stream on free (limit
// 1), releases, and acquires again.
const typeScriptConsumer = `import { Client, isLimited } from "@joishi/limiter-client";

const user = process.argv[2];
const limits = new Client(process.env.LIMITER_TEST_URL);
const lease = await limits.acquire(user, "free");
try {
  await limits.acquire(user, "free").then(
    () => { throw new Error("a second stream on free (limit 1) was granted"); },
    (err) => {
      if (!isLimited(err)) throw err;
      console.log("refused: " + err.used + " of " + err.limit);
    },
  );
} finally {
  await lease.release();
}
await (await limits.acquire(user, "free")).release();
await limits.close();
console.log("released " + lease.streamId);
console.log("imported from " + import.meta.resolve("@joishi/limiter-client"));
`

// TestTypeScriptClientInstall installs the TypeScript client as its README
// says, npm install /path/to/clients/typescript, into a new project (its
// prepare script builds dist), then runs an application of it against a
// real serve. npm's cache is LIMITER_TEST_NPM_CACHE (default
// ~/.cache/limiter/npm-cache), preferred to the registry: after a first run
// the test needs no network.
func TestTypeScriptClientInstall(t *testing.T) {
	t.Parallel()
	node := testenv.Node(t, 18)
	npm, err := exec.LookPath("npm")
	if err != nil {
		missingTool(t, "npm is not installed", "installs it")
	}
	cache := os.Getenv("LIMITER_TEST_NPM_CACHE")
	if cache == "" {
		home, err := os.UserCacheDir()
		if err != nil {
			t.Fatalf("no npm cache: LIMITER_TEST_NPM_CACHE is not set and %v", err)
		}
		cache = filepath.Join(home, "limiter", "npm-cache")
	}
	env := startClientServers(t)
	dir := t.TempDir()
	// A copy, as a fresh clone has it (no node_modules, no dist), outside
	// the project that installs it.
	pkg := filepath.Join(dir, "limiter", "clients", "typescript")
	copyClient(t, filepath.Join("..", "clients", "typescript"), pkg)
	// What node resolves the linked package to.
	real, err := filepath.EvalSymlinks(pkg)
	if err != nil {
		t.Fatal(err)
	}
	app := filepath.Join(dir, "app")
	if err := os.MkdirAll(app, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"package.json": `{"name": "app", "private": true, "type": "module"}` + "\n",
		"app.js":       typeScriptConsumer,
	} {
		if err := os.WriteFile(filepath.Join(app, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	runSuite(t, app, env, npm, "install", pkg, "--cache", cache, "--prefer-offline",
		"--foreground-scripts", "--no-audit", "--no-fund", "--loglevel=error")
	for _, built := range []string{"index.js", "index.d.ts"} {
		if _, err := os.Stat(filepath.Join(pkg, "dist", "src", built)); err != nil {
			t.Errorf("npm install did not build dist/src/%s: %v", built, err)
		}
	}
	out := runSuite(t, app, env, node, "app.js", "ts-install-"+randomID())
	wantLines(t, out, `(?m)^refused: 1 of 1$`, `(?m)^released \S+$`,
		`(?m)^imported from file://`+regexp.QuoteMeta(real)+`/dist/src/index\.js$`)
}

// copyClient copies a client's source tree from src to dst, leaving out
// what installing or testing it adds (node_modules, dist, build,
// *.egg-info, __pycache__).
func copyClient(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case name == "node_modules", name == "dist", name == "build", name == "__pycache__", strings.HasSuffix(name, ".egg-info"):
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		content, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), content, 0o644)
	})
	if err != nil {
		t.Fatalf("copying %s to %s: %v", src, dst, err)
	}
}

// missingTool fails the test under LIMITER_TEST_REQUIRE=1 and skips it
// otherwise, as testenv does for what it finds missing: what names the
// missing thing, provides what `make test` does about it.
func missingTool(t *testing.T, what, provides string) {
	t.Helper()
	msg := fmt.Sprintf("%s: run `make test`, which %s", what, provides)
	if testenv.Required() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// wantLines checks that out matches each of the regexps lines.
func wantLines(t *testing.T, out string, lines ...string) {
	t.Helper()
	for _, line := range lines {
		if !regexp.MustCompile(line).MatchString(out) {
			t.Errorf("output does not match %s:\n%s", line, out)
		}
	}
}
