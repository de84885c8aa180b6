package testenv

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

const clusterStartTimeout = 2 * time.Minute

// StartCluster starts a private 6-node Redis Cluster (3 masters, 3 replicas)
// with `hack/redis-cluster.sh start DIR cluster`, stops it on t.Cleanup and
// returns its seed addresses. It is for tests that do destructive things
// (CLUSTER FAILOVER, killing nodes) so they never disturb the shared cluster.
// DIR is under $LIMITER_TEST_TMPDIR when set, so hack/test.sh can reap a
// cluster whose test binary died. A missing redis-server or redis-cli is fatal
// if Required, else the test is skipped.
func StartCluster(t testing.TB) []string {
	t.Helper()
	return StartPrivateCluster(t).Addrs
}

// StartPrivateCluster is StartCluster returning a handle that can also find
// a key's master and kill nodes (see PrivateCluster).
func StartPrivateCluster(t testing.TB) *PrivateCluster {
	t.Helper()
	redisBinary(t, "redis-server")
	redisBinary(t, "redis-cli")
	script := filepath.Join(repoRoot(t), "hack", "redis-cluster.sh")

	parent := os.Getenv(envTmpDir)
	if parent != "" {
		if err := os.MkdirAll(parent, 0o755); err != nil {
			t.Fatalf("start cluster: %v", err)
		}
	}
	dir, err := os.MkdirTemp(parent, "cluster-")
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	// Registered before starting, so a half-started cluster is stopped too.
	t.Cleanup(func() {
		if out, err := exec.Command("bash", script, "stop", dir).CombinedOutput(); err != nil {
			t.Logf("stop cluster in %s: %v\n%s", dir, err, out)
		}
		os.RemoveAll(dir)
	})

	ctx, cancel := context.WithTimeout(context.Background(), clusterStartTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script, "start", dir, "cluster")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second // daemonized servers must not hold the pipes open
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s start %s cluster: %v\n%s", script, dir, err, stderr.String())
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if value, ok := strings.CutPrefix(line, "export "+envCluster+"="); ok {
			return &PrivateCluster{Addrs: strings.Split(strings.TrimSpace(value), ","), t: t, dir: dir}
		}
	}
	t.Fatalf("%s start printed no %s:\n%s", script, envCluster, stdout.String())
	return nil
}

// repoRoot returns the directory holding go.mod: found from this source
// file's path, or from the working directory when the binary was built with
// -trimpath.
func repoRoot(t testing.TB) string {
	t.Helper()
	var starts []string
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	for _, dir := range starts {
		for {
			if _, err := os.Stat(filepath.Join(dir, "hack", "redis-cluster.sh")); err == nil {
				if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
					return dir
				}
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	t.Fatal("cannot find the repository root (go.mod next to hack/redis-cluster.sh)")
	return ""
}
