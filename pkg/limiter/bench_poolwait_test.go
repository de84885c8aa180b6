//go:build unix

package limiter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// Sizes of BenchmarkPoolWaitCost: the waiters of BenchmarkWaitCost
// (costUsers users, costPerUser acquires each) wait for poolCostKeys keys
// of the pool poolCostPool, each held at its cap of poolCostCap: ten
// waiters per held slot, as there. Each user's plan is one of
// poolCostPriorities priorities.
const (
	poolCostKeys       = 10
	poolCostCap        = 10
	poolCostPriorities = 3
	poolCostPool       = "model"
)

// poolCostTiers: plan prio-<p> of priority p for each of the priorities,
// a user's slots far more than it holds here (only the pool keys are
// full), slots that outlive a run unrefreshed (so the holders never leave)
// and the default heartbeat interval, a wait of up to a minute.
func poolCostTiers() []tiers.Tier {
	out := make([]tiers.Tier, poolCostPriorities)
	for p := range out {
		out[p] = tiers.Tier{Plan: poolCostPlan(p), Priority: p, MaxConcurrentStreams: 100, SlotTTL: 10 * time.Minute,
			HeartbeatInterval: 20 * time.Second, FailureMode: tiers.FailOpen, MaxWait: time.Minute}
	}
	return out
}

func poolCostPlan(priority int) string { return fmt.Sprintf("prio-%d", priority) }

// poolCostTable holds the pool model: every key capped at poolCostCap, a
// wait of up to a minute.
func poolCostTable(b *testing.B) *pools.Table {
	b.Helper()
	limit := poolCostCap
	return poolTable(b,
		pools.Pool{Pool: poolCostPool, MaxConcurrentStreams: &limit, MaxWait: time.Minute},
	)
}

// BenchmarkPoolWaitCost is BenchmarkWaitCost for a pool key's queue
// (DESIGN §17): poolCostKeys keys of one pool are each held at their cap,
// and costUsers*costPerUser acquires, of costUsers users of
// poolCostPriorities priorities, each user's spread over the keys and the
// acquires over two replicas, wait for them while nothing frees up. One op
// is a second of that. Then the waiters leave and as many clients each
// poll a non-waiting acquire of the same pool keys once a second. It
// reports what BenchmarkWaitCost does, with the same names.
//
// A waiter also holds its user's slot while it waits, kept alive once a
// heartbeat interval of its plan (20s): a run shorter than that measures
// none of those refreshes. The waiters wait a minute at the most, so b.N
// stays below 50 or so.
func BenchmarkPoolWaitCost(b *testing.B) {
	replicas := benchReplicasWith(b, limitertest.Standalone, poolCostTiers(), poolCostTable(b))
	ctx := context.Background()
	run := newUser(b)
	users := make([]string, costUsers)
	for i := range users {
		users[i] = fmt.Sprintf("%s-%d", run, i)
	}
	// Client i is users[i%costUsers], of that user's plan, joining key
	// i/costUsers: each key has one acquire of every user.
	req := func(i int) limiter.AcquireRequest {
		return limiter.AcquireRequest{UserID: users[i%costUsers], Plan: poolCostPlan(i % costUsers % poolCostPriorities),
			Pools: map[string]string{poolCostPool: poolCostKey(i / costUsers % poolCostKeys)}}
	}
	// The holders: poolCostCap users of each key (each user holds one).
	for i := range poolCostKeys * poolCostCap {
		k := i / poolCostCap
		held := req(k*costUsers + i%costUsers) // users[i%costUsers]
		held.StreamID = "holder-" + poolCostKey(k)
		if res, err := replicas[0].Limiter.Acquire(ctx, held); err != nil || !res.Granted {
			b.Fatalf("holder %d of %v: %+v, %v", i, held.Pools, res, err)
		}
	}

	cost := newWaitCost(b, replicas[0], costUsers*costPerUser)
	var granted atomic.Int64
	waiting := cost.waiting(b, func(ctx context.Context, i int) {
		w := req(i)
		w.Wait = time.Minute
		if res, _ := replicas[i%2].Limiter.Acquire(ctx, w); res.Granted {
			granted.Add(1)
		}
	}, func() { poolCostQueued(b, replicas[0], int64(cost.clients/poolCostKeys)) })
	if n := granted.Load(); n > 0 {
		b.Fatalf("%d waiters granted: a membership freed up while they waited", n)
	}
	polling := cost.polling(b, func(ctx context.Context, i int) {
		if res, _ := replicas[i%2].Limiter.Acquire(ctx, req(i)); res.Granted {
			granted.Add(1)
		}
	})
	if n := granted.Load(); n > 0 {
		b.Fatalf("%d polls granted: a membership freed up", n)
	}
	cost.report(b, waiting, polling)
}

func poolCostKey(k int) string { return fmt.Sprintf("m%d", k) }

// poolCostQueued returns once each key's queue holds n tickets.
func poolCostQueued(b *testing.B, s *limitertest.Stack, n int64) {
	b.Helper()
	raw, err := s.Redis.Redis()
	if err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for k := range poolCostKeys {
		slots, err := s.Keys.PoolKey(poolCostPool, poolCostKey(k))
		if err != nil {
			b.Fatal(err)
		}
		for {
			got, err := raw.Do(context.Background(), raw.B().Zcard().Key(keys.Queue(slots)).Build()).AsInt64()
			if err == nil && got == n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("queue of %s=%s: %d tickets (%v) after a minute, want %d", poolCostPool, poolCostKey(k), got, err, n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}
