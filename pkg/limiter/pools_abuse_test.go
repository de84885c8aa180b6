package limiter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestAUserAtItsLimitTakesNoPoolPlace: a user refused by its own limit
// who keeps retrying must not keep a pool key full for everyone else. A
// pooled acquire sends the pool keys' scripts beside the user's (one round
// trip), so a refused one holds its memberships for the round trip of
// their removal; a user its own limit refused acquires its pools only
// once its slot is granted, so that its retries take no place of a key.
//
// Not parallel, nor are the tests below: their load would starve the
// tests that time a decision against its deadline.
func TestAUserAtItsLimitTakesNoPoolPlace(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.RedisCluster, limitertest.Standalone} {
		t.Run(b.String(), func(t *testing.T) {
			one := []tiers.Tier{tiers.Tier{Plan: "one", MaxConcurrentStreams: 1}.WithDefaults()}
			lim := limitertest.New(t, limitertest.Options{Backend: b, Tiers: one,
				Limiter: limiter.Options{Pools: poolTable(t, pools.Pool{Pool: "a", MaxConcurrentStreams: ptr(1)})}}).Limiter
			ctx := context.Background()
			spam, victim := newUser(t), newUser(t)
			pooled := func(user string) limiter.AcquireRequest {
				return limiter.AcquireRequest{UserID: user, Plan: "one", Pools: map[string]string{"a": "k"}}
			}
			if r, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: spam, Plan: "one"}); err != nil || !r.Granted {
				t.Fatalf("spam's one stream: %+v, %v", r, err)
			}
			// Refused by its limit once: from here on it is known at it.
			if r, err := lim.Acquire(ctx, pooled(spam)); err != nil || r.Granted || r.RefusedBy != nil {
				t.Fatalf("spam's second stream: %+v, %v; want refused by its own limit", r, err)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						if r, err := lim.Acquire(ctx, pooled(spam)); err != nil || r.Granted {
							t.Errorf("spam's retry: %+v, %v; want refused by its own limit", r, err)
							return
						}
					}
				})
			}
			refused := 0
			for range 200 {
				r, err := lim.Acquire(ctx, pooled(victim))
				if err != nil {
					t.Fatal(err)
				}
				if !r.Granted {
					refused++
					continue
				}
				if _, err := lim.Release(ctx, victim, r.StreamID); err != nil {
					t.Fatal(err)
				}
			}
			close(stop)
			wg.Wait()
			if refused > 0 {
				t.Errorf("the victim, a=k's only holder, was refused %d of 200 times while a user at its limit retried", refused)
			}
			// Below its limit again, the user joins its pools as before.
			if _, err := lim.ReleaseAll(ctx, spam, newAuditID()); err != nil {
				t.Fatal(err)
			}
			r, err := lim.Acquire(ctx, pooled(spam))
			if err != nil || !r.Granted || len(r.Pools) != 1 || r.Pools[0].Used != 1 {
				t.Errorf("spam's acquire once below its limit: %+v, %v; want granted with a=k", r, err)
			}
		})
	}
}

// TestReleaseAllLeavesEveryPool: support's release of all of a user's
// streams drops every one of their memberships, however many, within the
// decision's deadline or just after it, never left to expire. The
// releasing replica is 10ms of round trip from Redis: a round trip per
// stream would take its 1,000 streams 10 s, ten times its deadline.
func TestReleaseAllLeavesEveryPool(t *testing.T) {
	table := poolTable(t, pools.Pool{Pool: "a", MaxConcurrentStreams: ptr(100000)})
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	redis := testenv.Redis(t)
	far := testenv.StartProxy(t, redis)
	taker := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{redis}, Timeout: 10 * time.Second},
		Limiter: limiter.Options{Keys: prefix, Pools: table}}).Limiter
	releaser := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{far.Addr()}, Timeout: time.Second},
		Limiter: limiter.Options{Keys: prefix, Pools: table}}).Limiter
	ctx := context.Background()
	u := newUser(t)
	const n = 1000
	if _, err := taker.SetOverride(ctx, u, limiter.OverrideRequest{MaxConcurrentStreams: n, For: time.Hour, Actor: "t", Reason: "many streams"}); err != nil {
		t.Fatal(err)
	}
	poolKeys := []string{"ka", "kb", "kc", "kd"}
	for i := range n {
		r, err := taker.Acquire(ctx, limiter.AcquireRequest{UserID: u, Plan: "three", Pools: map[string]string{"a": poolKeys[i%len(poolKeys)]}})
		if err != nil || !r.Granted || r.Degraded {
			t.Fatalf("acquire %d: %+v, %v", i, r, err)
		}
	}
	// The releaser's scripts are loaded before the latency, as a replica
	// running for a while has them.
	if _, err := releaser.ReleaseAll(ctx, newUser(t), newAuditID()); err != nil {
		t.Fatal(err)
	}
	far.SetLatency(5 * time.Millisecond)
	ids, err := releaser.ReleaseAll(ctx, u, newAuditID())
	if err != nil || len(ids) != n {
		t.Fatalf("ReleaseAll: %d ids, %v; want %d", len(ids), err, n)
	}
	held := func() int {
		left := 0
		for _, k := range poolKeys {
			got, err := taker.PoolSlots(ctx, "a", k)
			if err != nil {
				t.Fatal(err)
			}
			left += got.Used
		}
		return left
	}
	deadline := time.Now().Add(3 * time.Second)
	for held() > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := held(); left > 0 {
		t.Errorf("%d of %d memberships still held 3s after ReleaseAll released the user's %d streams", left, n, len(ids))
	}
}

// TestAKeyCappedAtZeroIsNotWaitedFor: a pool key capped at 0 admits no
// stream however long one waits, so an acquire with wait_ms is refused
// at once, as one whose own limit is 0 is, rather than holding the user's
// slot through a wait that cannot end in a grant.
func TestAKeyCappedAtZeroIsNotWaitedFor(t *testing.T) {
	one := []tiers.Tier{tiers.Tier{Plan: "one", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()}
	lim := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Tiers: one,
		Limiter: limiter.Options{Pools: poolTable(t, pools.Pool{Pool: "a", MaxConcurrentStreams: ptr(5), Keys: map[string]int{"closed": 0}, MaxWait: 10 * time.Second})}}).Limiter
	ctx := context.Background()
	u := newUser(t)
	start := time.Now()
	r, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: u, Plan: "one", Wait: 3 * time.Second, Pools: map[string]string{"a": "closed"}})
	if took := time.Since(start); err != nil || r.Granted || r.RefusedBy == nil || r.RefusedBy.Key != "closed" || r.RefusedBy.Limit != 0 || took > time.Second || r.Waited > 0 {
		t.Errorf("acquire of a=closed (cap 0) with wait_ms 3000: %+v, %v after %v; want refused by it at once", r, err, took)
	}
	if r, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: u, Plan: "one", Pools: map[string]string{"a": "open"}}); err != nil || !r.Granted {
		t.Errorf("the user's next acquire: %+v, %v; want granted, its only slot free", r, err)
	}
}
