package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/controller"
)

// fakeKubeconfig points KUBECONFIG at an API server that is never called:
// the watch is stood in for (fakeWatch), and controller.New does not dial.
func fakeKubeconfig(t *testing.T) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: fake
  context:
    cluster: fake
    user: fake
current-context: fake
users:
- name: fake
  user:
    token: fake
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", path)
}

// fakeWatch is a stand-in for the LimitTier watch that waits until ctx
// ends (returning nil, as the real watch does) or until die yields an
// error (a watch that cannot run on).
func fakeWatch() (watch tierWatch, die chan<- error) {
	ch := make(chan error, 1)
	return func(_ *controller.Controller, ctx context.Context) error {
		select {
		case <-ctx.Done():
			return nil
		case err := <-ch:
			return err
		}
	}, ch
}

// runWithWatch is run with watch standing in for the LimitTier watch.
func runWithWatch(ctx context.Context, watch tierWatch, args []string, stdout, stderr io.Writer) int {
	return execute(ctx, newRootCommand(serveDeps{logs: stderr, watchTiers: watch}), args, stdout, stderr)
}

// A LimitTier watch that dies must not leave the replica serving a frozen
// table with /readyz true: serve drains and exits 1, so Kubernetes
// restarts the container with a fresh watch.
func TestServeFailsWhenTheTierWatchDies(t *testing.T) {
	fakeKubeconfig(t)
	watch, die := fakeWatch()

	var stdout, stderr testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWithWatch(t.Context(), watch, append([]string{"serve", "--log-format", "text", "--tiers-source", "kubernetes", "--tiers-namespace", "limits"}, local...), &stdout, &stderr)
	}()
	waitFor(t, &stderr, "msg=listening", done)

	die <- errors.New("informer exploded")
	select {
	case code := <-done:
		if code != exitFailure {
			t.Errorf("run() = %d after the watch died, want %d; stderr:\n%s", code, exitFailure, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("serve still running 10s after the LimitTier watch died; stderr:\n%s", stderr.String())
	}
	for _, want := range []string{
		"limiter: tiers.source kubernetes: the LimitTier watch stopped",
		"informer exploded",
		"msg=stopped", // drained, not cut short
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr does not contain %q:\n%s", want, stderr.String())
		}
	}
}

// The control: a watch that ends because serve is told to stop is no
// failure.
func TestServeWithKubernetesTiersDrainsAndExitsZero(t *testing.T) {
	fakeKubeconfig(t)
	watch, _ := fakeWatch()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWithWatch(ctx, watch, append([]string{"serve", "--log-format", "text", "--tiers-source", "kubernetes", "--tiers-namespace", "limits"}, local...), &stdout, &stderr)
	}()
	waitFor(t, &stderr, "msg=listening", done)
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Errorf("run() = %d after its context ended, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("serve still running 10s after its context ended; stderr:\n%s", stderr.String())
	}
}

// With tiers.source kubernetes, pools come from LimitPool objects only: a
// pools.static list would be silently ignored, making its pools
// unknown_pool for every acquire, so serve refuses to start and names the
// key.
func TestKubernetesTiersRefusePoolsStatic(t *testing.T) {
	fakeKubeconfig(t)
	t.Setenv("LIMITER_POOLS_STATIC", `[{pool: model, keys: {gpt-4o: 1}}, {pool: org}]`)
	watch, _ := fakeWatch()
	var stdout, stderr testenv.Buffer
	code := runWithWatch(t.Context(), watch, append([]string{"serve", "--log-format", "text", "--tiers-source", "kubernetes", "--tiers-namespace", "limits"}, local...), &stdout, &stderr)
	if code != exitUsage {
		t.Errorf("run() = %d, want %d (a configuration error); stderr:\n%s", code, exitUsage, stderr.String())
	}
	want := "pools.static: must be empty with tiers.source kubernetes: pools come from the LimitPool objects of tiers.namespace (config/samples/model-pool.yaml) (env LIMITER_POOLS_STATIC), got \"model\", \"org\""
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr does not contain %q:\n%s", want, stderr.String())
	}

	// The control: the same list with the static tier source serves.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var static testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- runWithWatch(ctx, watch, append([]string{"serve", "--log-format", "text"}, local...), &stdout, &static)
	}()
	waitFor(t, &static, "msg=listening", done)
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("run() with tiers.source static = %d, want 0; stderr:\n%s", code, static.String())
	}
}
