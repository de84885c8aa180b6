package limiter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// eachBackend runs fn against standalone Redis, Redis Cluster and, when
// withEmbedded, the embedded store.
func eachBackend(t *testing.T, withEmbedded bool, fn func(t *testing.T, env *env)) {
	backends := []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster}
	if withEmbedded {
		backends = append(backends, limitertest.Embedded)
	}
	for _, b := range backends {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			// These tests are about correctness, not latency: a generous
			// deadline keeps a loaded machine from turning them degraded.
			// The embedded store answers one call at a time: 500 acquires
			// at once, under -race on 2 cores busy with other packages'
			// tests, have waited more than 5s in its queue.
			fn(t, newEnv(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 30 * time.Second}}))
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

// newEnv returns the limiter opts describe.
func newEnv(t testing.TB, opts limitertest.Options) *env {
	t.Helper()
	s := limitertest.New(t, opts)
	return &env{redis: s.Redis, lim: s.Limiter, table: s.Table, keys: s.Keys}
}

// raw returns the client of a connected env, for what a test checks in
// Redis itself.
func (e *env) raw(t testing.TB) rueidis.Client {
	t.Helper()
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
