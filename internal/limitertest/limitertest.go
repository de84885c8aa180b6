// Package limitertest builds the stack a test of the limiter runs on: a
// Redis client on one of the test servers (internal/testenv), a tier table
// and a limiter with a key prefix of its own. Callers put their own server
// or client on top.
//
// It is apart from testenv because it imports pkg/cluster, whose own tests
// import testenv.
package limitertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// connectTimeout bounds the wait for the first connection to Redis.
const connectTimeout = 10 * time.Second

// Options configure a Stack. Zero values take the documented defaults.
type Options struct {
	// Backend is the server the stack runs on when Redis.Addrs is empty.
	// Default Standalone.
	Backend Backend
	// Redis configures the client. Addrs, when set, replace Backend (a
	// private server, a proxy, a black hole). Other zero fields take
	// cluster's defaults (a 250ms per-call deadline).
	Redis cluster.Options
	// Tiers fill the table. Default Tiers().
	Tiers []tiers.Tier
	// Limiter configures the limiter (Logger, Observer, TracerProvider).
	// An empty Keys.Prefix becomes "limitertest:<random>:", unique to the
	// stack, so tests sharing a Redis never see each other's keys.
	Limiter limiter.Options
	// NewObserver, when set, builds the limiter's Observer from the stack's
	// table (telemetry.NewObserver reads the plans from it) and replaces
	// Limiter.Observer. Default: Limiter.Observer as given.
	NewObserver func(*tiers.Table) (limiter.Observer, error)
	// NoWait returns the stack without waiting for Redis, for tests of an
	// outage. Default false: New waits up to 10s for the first connection
	// and fails the test if there is none.
	NoWait bool
}

// Stack is a limiter on a test Redis. Everything in it is closed on the
// test's cleanup.
type Stack struct {
	Redis   *cluster.Client
	Table   *tiers.Table // holds Options.Tiers; a test may Replace them
	Keys    keys.Schema  // the limiter's keys, under the stack's own prefix
	Limiter *limiter.Limiter
}

// New returns the stack opts describe. When the Backend's shared server is
// not set up (make test sets it up), the test fails under
// LIMITER_TEST_REQUIRE=1 and is skipped otherwise, as with testenv.Redis and
// testenv.Cluster.
func New(t testing.TB, opts Options) *Stack {
	t.Helper()
	if len(opts.Redis.Addrs) == 0 {
		opts.Redis.Addrs = opts.Backend.addrs(t)
	}
	if opts.Tiers == nil {
		opts.Tiers = Tiers()
	}
	if opts.Limiter.Keys.Prefix == "" {
		opts.Limiter.Keys.Prefix = "limitertest:" + randomHex() + ":"
	}

	redis, err := cluster.New(opts.Redis)
	if err != nil {
		t.Fatalf("cluster.New: %v", err)
	}
	t.Cleanup(redis.Close)
	table := tiers.NewTable()
	if err := table.Replace(opts.Tiers); err != nil {
		t.Fatalf("loading the test tiers: %v", err)
	}
	if opts.NewObserver != nil {
		if opts.Limiter.Observer, err = opts.NewObserver(table); err != nil {
			t.Fatalf("building the observer: %v", err)
		}
	}
	s := &Stack{
		Redis:   redis,
		Table:   table,
		Keys:    opts.Limiter.Keys,
		Limiter: limiter.New(redis, table, opts.Limiter),
	}
	if !opts.NoWait {
		s.waitConnected(t)
	}
	return s
}

// waitConnected waits up to 10s for the first connection to Redis and fails
// the test if there is none.
func (s *Stack) waitConnected(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if err := s.Redis.WaitConnected(ctx); err != nil {
		t.Fatalf("connecting to Redis: %v", err)
	}
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Backend is a server a stack runs on.
type Backend int

const (
	// Standalone is the shared standalone Redis (LIMITER_TEST_REDIS).
	Standalone Backend = iota
	// RedisCluster is the shared Redis Cluster (LIMITER_TEST_REDIS_CLUSTER).
	RedisCluster
	// Embedded is the in-process store of pkg/cluster: no server needed.
	Embedded
)

// String names the backend as subtests do: standalone, cluster, embedded.
func (b Backend) String() string {
	switch b {
	case Standalone:
		return "standalone"
	case RedisCluster:
		return "cluster"
	case Embedded:
		return "embedded"
	}
	return "Backend(" + strconv.Itoa(int(b)) + ")"
}

// addrs returns the backend's seed addresses; none for Embedded.
func (b Backend) addrs(t testing.TB) []string {
	t.Helper()
	switch b {
	case Standalone:
		return []string{testenv.Redis(t)}
	case RedisCluster:
		return testenv.Cluster(t)
	case Embedded:
		return nil
	}
	t.Fatalf("limitertest: unknown %v", b)
	return nil
}
