package limiter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// backend is one place the slot engine runs.
type backend struct {
	name  string
	addrs func(t *testing.T) []string // nil: embedded store
}

var (
	standalone   = backend{"standalone", func(t *testing.T) []string { return []string{testenv.Redis(t)} }}
	redisCluster = backend{"cluster", func(t *testing.T) []string { return testenv.Cluster(t) }}
	embedded     = backend{"embedded", nil}
)

// eachBackend runs fn against standalone Redis, Redis Cluster and, when
// withEmbedded, the embedded store.
func eachBackend(t *testing.T, withEmbedded bool, fn func(t *testing.T, env *env)) {
	backends := []backend{standalone, redisCluster}
	if withEmbedded {
		backends = append(backends, embedded)
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var addrs []string
			if b.addrs != nil {
				addrs = b.addrs(t)
			}
			// These tests are about correctness, not latency: a generous
			// deadline keeps a loaded machine from turning them degraded.
			fn(t, newEnv(t, cluster.Options{Addrs: addrs, Timeout: 5 * time.Second}))
		})
	}
}

// env is a limiter on one backend with the test tiers.
type env struct {
	redis *cluster.Client
	lim   *limiter.Limiter
	table *tiers.Table
	keys  keys.Schema
}

// Test tiers: short TTLs so expiry is observable in a test.
var testTiers = []tiers.Tier{
	{Plan: "three", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
	{Plan: "one", MaxConcurrentStreams: 1, SlotTTL: 2 * time.Second, HeartbeatInterval: 500 * time.Millisecond, FailureMode: tiers.FailOpen},
	{Plan: "short", MaxConcurrentStreams: 3, SlotTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, FailureMode: tiers.FailOpen},
	{Plan: "short-one", MaxConcurrentStreams: 1, SlotTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, FailureMode: tiers.FailOpen},
	{Plan: "closed", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed},
	{Plan: "none", MaxConcurrentStreams: 0, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
}

// newEnv returns a limiter on opts' backend, connected.
func newEnv(t testing.TB, opts cluster.Options) *env {
	t.Helper()
	e := newEnvNoWait(t, opts)
	e.waitConnected(t)
	return e
}

// newEnvNoWait returns a limiter on opts' backend without waiting for Redis.
func newEnvNoWait(t testing.TB, opts cluster.Options) *env {
	t.Helper()
	redis, err := cluster.New(opts)
	if err != nil {
		t.Fatalf("cluster.New: %v", err)
	}
	t.Cleanup(redis.Close)
	table := tiers.NewTable()
	if err := table.Replace(testTiers); err != nil {
		t.Fatal(err)
	}
	e := &env{redis: redis, table: table, keys: keys.Schema{Prefix: "limitertest:"}}
	e.lim = limiter.New(redis, table, limiter.Options{Keys: e.keys})
	return e
}

// waitConnected waits for the first connection (tests that expect Redis up).
func (e *env) waitConnected(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.redis.WaitConnected(ctx); err != nil {
		t.Fatal(err)
	}
}

func (e *env) raw(t testing.TB) rueidis.Client {
	t.Helper()
	e.waitConnected(t)
	c, err := e.redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *env) key(t testing.TB, user string) string {
	t.Helper()
	k, err := e.keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newUser returns a user id no other test uses.
func newUser(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "u-" + hex.EncodeToString(b[:])
}

func (e *env) acquire(t testing.TB, user, plan, stream string) limiter.AcquireResult {
	t.Helper()
	res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan, StreamID: stream})
	if err != nil {
		t.Fatalf("Acquire(%s, %s, %q): %v", user, plan, stream, err)
	}
	return res
}

// newAuditID returns an id for one ReleaseAll call, as the admin API's
// audit ids are: a second call under the same id is a retry of the first.
func newAuditID() string { return keys.NewStreamID()[:16] }
