package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestADeferredPoolTicketLearnsItsPlace: a pool key of cap 2 is full;
// its queue holds z (a dead server's ticket, expiring after 1s), then x
// and y, two acquires of one plan on one replica (places 2 and 3: x polls,
// y does not). When z's ticket expires, the loop's call carries every
// ticket ("a slot or a ticket may have expired"), so y learns it is now
// second and polls. x then leaves, and a place frees with no wake-up (a
// lost one, as freeByHand): y, first now, should be served by its poll
// within a second, also when y's slot was taken under another TTL of the
// plan than x's (the plan's TTL changed between them): y's ticket, left
// out of that call (a call grants one TTL), goes in the next, at once,
// rather than at its refresh (10s), its place unknown and unpolled
// meanwhile while the free place waits.
func TestADeferredPoolTicketLearnsItsPlace(t *testing.T) {
	for _, changed := range []bool{false, true} {
		name := "sameTTL"
		if changed {
			name = "otherTTL"
		}
		t.Run(name, func(t *testing.T) {
			b := limitertest.Standalone
			log := newCallLog()
			plan := tiers.Tier{Plan: "w3", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, MaxWait: 8 * time.Second}.WithDefaults()
			short := plan
			if changed {
				short.SlotTTL, short.HeartbeatInterval = 600*time.Millisecond, 200*time.Millisecond
			}
			table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), MaxWait: 8 * time.Second})
			s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second},
				Tiers:   append([]tiers.Tier{plan}, limitertest.Tiers()...),
				Limiter: limiter.Options{WaitPoll: 20 * time.Millisecond, TicketTTL: 30 * time.Second, Observer: log, Pools: table}})
			ctx := context.Background()
			gpt := map[string]string{"model": "gpt-4o"}
			o1, o2, u1, u2 := newUser(t), newUser(t), newUser(t), newUser(t)
			for _, r := range []limiter.AcquireRequest{
				{UserID: o1, Plan: "three", StreamID: "o1", Pools: gpt},
				{UserID: o2, Plan: "three", StreamID: "o2", Pools: gpt},
			} {
				if res, err := s.Limiter.Acquire(ctx, r); err != nil || !res.Granted {
					t.Fatalf("%+v: %+v, %v", r, res, err)
				}
			}
			key, err := s.Keys.PoolKey("model", "gpt-4o")
			if err != nil {
				t.Fatal(err)
			}
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			// z: a ticket whose server died, expiring in 1s.
			got, err := lua.Wait(ctx, c, key, lua.WaitArgs{Limit: 2, SlotTTL: 10 * time.Second, TicketTTL: time.Second, MaxQueue: 100,
				Tickets: []lua.TicketArgs{{StreamID: "z zu", Record: lua.Record{User: "zu", Plan: plan.Plan}}}})
			if err != nil || got.Tickets[0].State != lua.TicketQueued {
				t.Fatalf("z: %+v, %v", got, err)
			}
			xCtx, leaveX := context.WithCancel(ctx)
			defer leaveX()
			queue(t, xCtx, s, s.Limiter, limiter.AcquireRequest{UserID: u1, Plan: plan.Plan, StreamID: "x", Pools: gpt}, 8*time.Second)
			if err := s.Table.Replace(append([]tiers.Tier{short}, limitertest.Tiers()...)); err != nil {
				t.Fatal(err)
			}
			y := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: u2, Plan: plan.Plan, StreamID: "y", Pools: gpt}, 8*time.Second)
			// z expires; the loop's next call finds it gone.
			time.Sleep(1500 * time.Millisecond)
			if n := queueLength(t, s, "gpt-4o"); n != 2 {
				t.Fatalf("queue length after z's expiry: %d; want 2 (x, y)", n)
			}
			leaveX()
			for deadline := time.Now().Add(3 * time.Second); queueLength(t, s, "gpt-4o") != 1; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("x did not leave the queue within 3s")
				}
			}
			time.Sleep(100 * time.Millisecond)
			freeByHand(t, s, key, "o2 "+o2)
			log.take()
			a, ok := y.answer(time.Second)
			calls := log.take()
			if !ok || a.err != nil || !a.res.Granted {
				t.Errorf("y, first in the queue, a place freed with no wake-up: answered %v (%+v, %v) within a second (%d polls, %d wait calls); want granted by its poll",
					ok, a.res.Granted, a.err, calls["wait_poll"], calls["wait"])
			}
		})
	}
}
