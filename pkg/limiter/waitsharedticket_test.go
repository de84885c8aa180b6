package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestWaitersSharingATicketNameTheSamePools: two requests of stream s on
// one replica, under one plan (limit 1, reached), wait in their user's
// queue, one naming pool key gpt-4o (cap 1), the other none; they share
// one ticket, whose record is the first waiter's. When a slot frees, the
// one whose pools the record does not name is refused (ErrPoolsDiffer),
// as an acquire of a held stream naming other pools is: no membership
// that no heartbeat of s keeps (gpt-4o would admit another stream a TTL
// later), and no grant whose heartbeat loses s.
func TestWaitersSharingATicketNameTheSamePools(t *testing.T) {
	t.Parallel()
	for name, pooledFirst := range map[string]bool{"the pool-less request first": false, "the pooled request first": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
				Tiers: []tiers.Tier{tiers.Tier{Plan: "one", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second,
					SlotTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond}.WithDefaults()},
				Limiter: limiter.Options{Pools: poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)})}})
			lim := s.Limiter
			ctx := context.Background()
			pooled := map[string]string{"model": "gpt-4o"}
			if pooledFirst { // gpt-4o full: the pooled request is refused by it
				owner := newUser(t)
				holder, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: owner, Plan: "one", Pools: pooled})
				if err != nil || !holder.Granted {
					t.Fatalf("gpt-4o's holder: %+v, %v", holder, err)
				}
				beats, stop := context.WithCancel(ctx)
				defer stop()
				go func() { // which heartbeats meanwhile
					for beats.Err() == nil {
						_, _ = lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: owner, Plan: "one", StreamID: holder.StreamID})
						time.Sleep(100 * time.Millisecond)
					}
				}()
			}
			user := newUser(t)
			x, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one"})
			if err != nil || !x.Granted {
				t.Fatalf("the user's slot: %+v, %v", x, err)
			}
			key, err := s.Keys.UserKey(user)
			if err != nil {
				t.Fatal(err)
			}
			bare := limiter.AcquireRequest{UserID: user, Plan: "one", StreamID: "s"}
			withPool := bare
			withPool.Pools = pooled
			first, second := bare, withPool
			if pooledFirst {
				first, second = withPool, bare
			}
			q1 := startQueued(t, ctx, lim, first, 8*time.Second, func() int64 { return zcard(t, s, keys.Queue(key)) })
			time.Sleep(100 * time.Millisecond)
			q2 := retryWaiting(t, ctx, lim, second)
			time.Sleep(100 * time.Millisecond)
			if _, err := lim.Release(ctx, user, x.StreamID); err != nil {
				t.Fatal(err)
			}
			a1, ok1 := q1.answer(3 * time.Second)
			a2, ok2 := q2.answer(3 * time.Second)
			if !ok1 || !ok2 {
				t.Fatalf("answers: %+v (%v), %+v (%v)", a1, ok1, a2, ok2)
			}
			if !errors.Is(a2.err, limiter.ErrPoolsDiffer) || a2.res.Granted {
				t.Fatalf("the second waiter, its pools not those of the ticket's record: %+v, %v; want ErrPoolsDiffer", a2.res, a2.err)
			}
			bareA, pooledA := a1, a2
			if pooledFirst {
				bareA, pooledA = a2, a1
			}
			if pooledFirst {
				if a1.err != nil || a1.res.Granted || a1.res.RefusedBy == nil {
					t.Fatalf("the pooled waiter, gpt-4o full: %+v, %v; want refused by gpt-4o", a1.res, a1.err)
				}
				userHolds(t, lim, user, 0, "both refused")
				return
			}
			if !bareA.res.Granted {
				t.Fatalf("the pool-less request: %+v, %v", bareA.res, bareA.err)
			}
			// s runs, heartbeating as answered, past a TTL.
			for i := range 5 {
				time.Sleep(bareA.res.Tier.HeartbeatInterval)
				if beat, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "one", StreamID: "s"}); err != nil || !beat.Alive {
					t.Fatalf("s's heartbeat %d, the pool-less request answered granted: %+v, %v; want alive", i+1, beat, err)
				}
			}
			if pooledA.res.Granted {
				if other, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "one", Pools: pooled}); err != nil || other.Granted {
					t.Errorf("another stream's acquire of gpt-4o while s runs holding it: %+v, %v; want refused (cap 1)", other, err)
				}
			}
		})
	}
}
