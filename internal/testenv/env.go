package testenv

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Environment variables hack/test.sh sets.
const (
	envRequire      = "LIMITER_TEST_REQUIRE"       // "1": missing servers fail tests
	envRedis        = "LIMITER_TEST_REDIS"         // host:port of the shared standalone Redis
	envCluster      = "LIMITER_TEST_REDIS_CLUSTER" // comma-separated seed host:ports
	envTmpDir       = "LIMITER_TEST_TMPDIR"        // where private clusters live, so hack/test.sh can reap them
	envKubebuilder  = "KUBEBUILDER_ASSETS"         // directory of etcd and kube-apiserver
	envChromium     = "CHROMIUM"                   // path of a chromium binary
	envRedocly      = "LIMITER_REDOCLY"            // path of the Redocly CLI (hack/redocly.sh)
	envKubeScore    = "LIMITER_KUBE_SCORE"         // path of kube-score (hack/kube-score.sh)
	envPromtool     = "LIMITER_PROMTOOL"           // path of promtool (hack/promtool.sh)
	defaultChromium = "/usr/bin/chromium"
)

// Required reports whether the test command demands real servers
// (LIMITER_TEST_REQUIRE=1, set by make test).
func Required() bool {
	required, err := strconv.ParseBool(os.Getenv(envRequire))
	return err == nil && required
}

// missing fails the test if Required, and skips it otherwise. what names the
// missing thing; provides says what `make test` does about it.
func missing(t testing.TB, what, provides string) {
	t.Helper()
	msg := fmt.Sprintf("%s: run `make test`, which %s", what, provides)
	if Required() {
		t.Fatal(msg)
	} else {
		t.Skip(msg)
	}
}

// Redis returns the shared standalone Redis address (LIMITER_TEST_REDIS).
// When absent: t.Fatal if Required(), else t.Skip.
func Redis(t testing.TB) string {
	t.Helper()
	addr := strings.TrimSpace(os.Getenv(envRedis))
	if addr == "" {
		missing(t, envRedis+" is not set", "starts Redis")
	}
	return addr
}

// Cluster returns the shared Redis Cluster seed addresses
// (LIMITER_TEST_REDIS_CLUSTER, comma separated). Same absent rule as Redis.
func Cluster(t testing.TB) []string {
	t.Helper()
	var addrs []string
	for _, addr := range strings.Split(os.Getenv(envCluster), ",") {
		if addr = strings.TrimSpace(addr); addr != "" {
			addrs = append(addrs, addr)
		}
	}
	if len(addrs) == 0 {
		missing(t, envCluster+" is not set", "starts a Redis Cluster")
	}
	return addrs
}

// KubebuilderAssets returns KUBEBUILDER_ASSETS, the directory holding the
// envtest etcd and kube-apiserver. Absent: fatal if Required, else skip.
func KubebuilderAssets(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(envKubebuilder)
	if dir == "" {
		missing(t, envKubebuilder+" is not set", "builds the envtest binaries with hack/envtest-assets.sh")
		return ""
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		missing(t, fmt.Sprintf("%s=%s is not a directory", envKubebuilder, dir), "builds the envtest binaries with hack/envtest-assets.sh")
	}
	return dir
}

// Chromium returns the path of a chromium binary: $CHROMIUM if set, else
// /usr/bin/chromium, else chromium on $PATH. Absent: fatal if Required, else skip.
func Chromium(t testing.TB) string {
	t.Helper()
	if path := os.Getenv(envChromium); path != "" {
		if !isExecutable(path) {
			missing(t, fmt.Sprintf("%s=%s is not an executable", envChromium, path), "installs chromium")
		}
		return path
	}
	if isExecutable(defaultChromium) {
		return defaultChromium
	}
	if path, err := exec.LookPath("chromium"); err == nil {
		return path
	}
	missing(t, "chromium is not installed", "installs it")
	return ""
}

// Redocly returns the path of the Redocly CLI, the OpenAPI linter:
// $LIMITER_REDOCLY if set, else redocly on $PATH. Absent: fatal if
// Required, else skip.
func Redocly(t testing.TB) string {
	t.Helper()
	return tool(t, envRedocly, "redocly", "installs it with hack/redocly.sh")
}

// KubeScore returns the path of kube-score: $LIMITER_KUBE_SCORE if set,
// else kube-score on $PATH. Absent: fatal if Required, else skip.
func KubeScore(t testing.TB) string {
	t.Helper()
	return tool(t, envKubeScore, "kube-score", "installs it with hack/kube-score.sh")
}

// Promtool returns the path of promtool, Prometheus's rule tester:
// $LIMITER_PROMTOOL if set, else promtool on $PATH. Absent: fatal if
// Required, else skip.
func Promtool(t testing.TB) string {
	t.Helper()
	return tool(t, envPromtool, "promtool", "installs it with hack/promtool.sh")
}

// tool returns the executable that env names, else name on $PATH.
func tool(t testing.TB, env, name, provides string) string {
	t.Helper()
	if path := os.Getenv(env); path != "" {
		if !isExecutable(path) {
			missing(t, fmt.Sprintf("%s=%s is not an executable", env, path), provides)
		}
		return path
	}
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	missing(t, name+" is not installed", provides)
	return ""
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// redisBinary returns the path of binary name (redis-server, redis-cli).
// Absent: fatal if Required, else skip.
func redisBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		missing(t, name+" is not installed", "installs it")
	}
	return path
}

// RedisUserWithoutScripts makes a user of the shared standalone Redis that
// may run every command but EVAL and EVALSHA, as a misconfigured ACL
// would, and returns its name and password; t.Cleanup deletes it.
func RedisUserWithoutScripts(t testing.TB) (user, password string) {
	t.Helper()
	addr := Redis(t)
	user, password = fmt.Sprintf("noscripts-%d", rand.Uint64()), "pw-"+strconv.FormatUint(rand.Uint64(), 36)
	if reply, ok := RawRESP(addr, "ACL", "SETUSER", user, "reset", "on", ">"+password, "~*", "&*", "+@all", "-evalsha", "-eval"); reply != "+OK" {
		t.Fatalf("ACL SETUSER %s: %q (answered %t)", user, reply, ok)
	}
	t.Cleanup(func() { RawRESP(addr, "ACL", "DELUSER", user) })
	return user, password
}
