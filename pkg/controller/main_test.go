package controller_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/joishi/limiter/internal/kubetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/controller"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// kube is one API server for every test of the package.
var kube kubetest.Shared

func TestMain(m *testing.M) { kube.Main(m) }

// testLease is short, so that tests of the election do not wait long.
const testLease = 2 * time.Second

// started is a Controller running for one test.
type started struct {
	*controller.Controller
	Table *tiers.Table
	Pools *pools.Table
	logs  *testenv.Buffer
	// Stop stops the controller, as a replica's shutdown does, and waits
	// for it; the test's cleanup calls it too.
	Stop func()
}

// startController runs a controller of LimitTiers and LimitPools on
// namespace ns as cfg's user until the test ends; its logs are shown if the
// test fails.
func startController(t *testing.T, cfg *rest.Config, ns string) *started {
	t.Helper()
	return startWithPools(t, cfg, ns, pools.NewTable())
}

// startWithPools is startController with poolTable as Options.Pools (nil:
// LimitPools are not watched).
func startWithPools(t *testing.T, cfg *rest.Config, ns string, poolTable *pools.Table) *started {
	t.Helper()
	s := &started{Table: tiers.NewTable(), Pools: poolTable, logs: &testenv.Buffer{}}
	c, err := controller.New(cfg, controller.Options{
		Namespace:     ns,
		Table:         s.Table,
		Pools:         s.Pools,
		Logger:        slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		LeaseDuration: testLease,
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Controller = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	var once sync.Once
	s.Stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Start() = %v after its context ended, want nil", err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("the controller did not stop within 30s of its context ending")
			}
		})
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("controller %s logs:\n%s", c.Identity(), s.logs.String())
		}
	})
	return s
}

// restartAll stops every one of replicas, as a rollout does, and starts a
// fresh replica, which knows the namespace from its objects alone; it
// returns once the fresh replica's table has synced.
func restartAll(t *testing.T, cfg *rest.Config, ns string, replicas []*started) *started {
	t.Helper()
	for _, r := range replicas {
		r.Stop()
	}
	fresh := startController(t, cfg, ns)
	select {
	case <-fresh.Table.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("the restarted replica's table did not sync within 10s")
	}
	return fresh
}

// eventually polls cond every 20ms until it returns "" or within passes,
// then fails with its last answer.
func eventually(t *testing.T, within time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consistently polls cond every 20ms for d, and fails as soon as it
// returns anything but "".
func consistently(t *testing.T, d time.Duration, cond func() string) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if msg := cond(); msg != "" {
			t.Fatalf("within %v: %s", d, msg)
		}
	}
}
