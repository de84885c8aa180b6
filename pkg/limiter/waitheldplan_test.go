package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestAnExtendedWaitGrantJoinsItsPoolsByTheHeldPlan: request A of stream
// s waits in its user's queue under plan w (limit 2, reached); its retry
// B under plan h (limit 3) takes s, naming the same pool key gpt-4o (cap
// 1, held by another user), and waits for it. Slots free: the wait grants
// A by extending s, answered by h's tier (the one s's record keeps), and
// A waits for gpt-4o too; B gives up, gpt-4o frees and A is granted it.
// A's pool wait and membership run by h's tier, as it is answered: with
// w's TTL shorter than h's heartbeat interval, its membership keeps h's
// TTL (it survives A's heartbeats every 1s, and gpt-4o admits no other
// stream); with w's heartbeat interval longer than h's TTL, the slot is
// kept alive while A waits (no ErrSlotLost).
func TestAnExtendedWaitGrantJoinsItsPoolsByTheHeldPlan(t *testing.T) {
	t.Parallel()
	short := func(plan string, limit int) tiers.Tier {
		return tiers.Tier{Plan: plan, MaxConcurrentStreams: limit, MaxWait: 10 * time.Second, SlotTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond}.WithDefaults()
	}
	long := func(plan string, limit int) tiers.Tier {
		return tiers.Tier{Plan: plan, MaxConcurrentStreams: limit, MaxWait: 10 * time.Second, SlotTTL: 3 * time.Second, HeartbeatInterval: time.Second}.WithDefaults()
	}
	for name, ts := range map[string][]tiers.Tier{
		"the waiter's TTL shorter than the held plan's heartbeat": {short("w", 2), long("h", 3)},
		"the waiter's heartbeat longer than the held plan's TTL":  {long("w", 2), short("h", 3)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim := replicasOf(t, limitertest.RedisCluster, 1, ts, poolTable(t,
				pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second},
			))[0].Limiter
			ctx := context.Background()
			holder := newUser(t)
			held, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: holder, Plan: "h", Pools: map[string]string{"model": "gpt-4o"}})
			if err != nil || !held.Granted {
				t.Fatalf("gpt-4o's holder: %+v, %v", held, err)
			}
			// gpt-4o's holder heartbeats by itself meanwhile.
			beatCtx, stopBeats := context.WithCancel(ctx)
			defer stopBeats()
			go func() {
				for beatCtx.Err() == nil {
					_, _ = lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: holder, Plan: "h", StreamID: held.StreamID})
					time.Sleep(100 * time.Millisecond)
				}
			}()
			user := newUser(t)
			var mine []string
			for range 2 {
				res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "w"})
				if err != nil || !res.Granted {
					t.Fatalf("the user's slots: %+v, %v", res, err)
				}
				mine = append(mine, res.StreamID)
			}
			pooled := map[string]string{"model": "gpt-4o"}
			a := retryWaiting(t, ctx, lim, limiter.AcquireRequest{UserID: user, Plan: "w", StreamID: "s", Pools: pooled})
			leave, cancel := context.WithCancel(ctx)
			defer cancel()
			b := retryWaiting(t, leave, lim, limiter.AcquireRequest{UserID: user, Plan: "h", StreamID: "s", Pools: pooled})
			for _, id := range mine {
				if _, err := lim.Release(ctx, user, id); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(500 * time.Millisecond) // A granted s (extended), waits for gpt-4o beside B
			cancel()
			gone(t, b)
			time.Sleep(3500 * time.Millisecond) // A waits alone, past the 3s its grant extended s by
			stopBeats()
			if _, err := lim.Release(ctx, holder, held.StreamID); err != nil {
				t.Fatal(err)
			}
			got, ok := a.answer(5 * time.Second)
			if !ok || got.err != nil || !got.res.Granted || len(got.res.Pools) != 1 {
				t.Fatalf("A once gpt-4o freed: %+v, %v (answered %v); want granted with gpt-4o", got.res, got.err, ok)
			}
			for i := range 3 {
				time.Sleep(got.res.Tier.HeartbeatInterval)
				if i == 0 {
					if other, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "h", Pools: pooled}); err != nil || other.Granted {
						t.Errorf("another stream's acquire of gpt-4o while A runs: %+v, %v; want refused (cap 1)", other, err)
					}
				}
				if beat, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: got.res.Tier.Plan, StreamID: "s"}); err != nil || !beat.Alive {
					t.Fatalf("A's heartbeat %d, every %v as answered: %+v, %v; want alive", i+1, got.res.Tier.HeartbeatInterval, beat, err)
				}
			}
		})
	}
}

// TestAnExtensionsPoolWaitKeepsTheRequestsBudget: stream s is held
// under plan h (maxWait 1s) by request B, which waits for gpt-4o (cap 1,
// held by another user). Request A of s under plan w (maxWait 10s) asks
// wait 10s: it extends s and waits for gpt-4o too. gpt-4o frees 2.5s
// later: A, whose budget (wait_ms capped by its plan's maxWait) is 10s,
// is granted.
func TestAnExtensionsPoolWaitKeepsTheRequestsBudget(t *testing.T) {
	t.Parallel()
	ts := []tiers.Tier{
		tiers.Tier{Plan: "w", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second}.WithDefaults(),
		tiers.Tier{Plan: "h", MaxConcurrentStreams: 3, MaxWait: time.Second}.WithDefaults(),
	}
	lim := replicasOf(t, limitertest.RedisCluster, 1, ts, poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second},
	))[0].Limiter
	ctx := context.Background()
	pooled := map[string]string{"model": "gpt-4o"}
	holder := newUser(t)
	held, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: holder, Plan: "w", Pools: pooled})
	if err != nil || !held.Granted {
		t.Fatalf("gpt-4o's holder: %+v, %v", held, err)
	}
	user := newUser(t)
	bDone := make(chan struct{})
	bWaits := make(chan struct{})
	go func() {
		defer close(bDone)
		_, _ = lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "h", StreamID: "s", Pools: pooled, Wait: time.Second,
			OnWait: func(time.Duration) { close(bWaits) }})
	}()
	<-bWaits
	time.Sleep(100 * time.Millisecond)
	type ans struct {
		res limiter.AcquireResult
		err error
	}
	aDone := make(chan ans, 1)
	start := time.Now()
	go func() {
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "w", StreamID: "s", Pools: pooled, Wait: 10 * time.Second})
		aDone <- ans{res, err}
	}()
	time.Sleep(2500 * time.Millisecond)
	if _, err := lim.Release(ctx, holder, held.StreamID); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-aDone:
		if a.err != nil || !a.res.Granted {
			t.Fatalf("A (plan w, wait 10s) after %v: granted %v, tier %s, refused by %+v, waited %v, err %v; want granted once gpt-4o freed at 2.5s",
				time.Since(start).Round(time.Millisecond), a.res.Granted, a.res.Tier.Plan, a.res.RefusedBy, a.res.Waited, a.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("A not answered")
	}
	<-bDone
}
