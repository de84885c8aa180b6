package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestARaisedPlanLimitKeepsItsWaitersTurn: the mirror of
// TestALoweredPlanLimitHoldsBackNoLargerPlansWaiter. A user holds 3 slots
// of plan big (3); an acquire of plan small (1 as it queued) waits first,
// then one of big. small is raised to 3. The user frees a slot: the first
// waiter, small's, now allowed 3 while the user holds 2, is owed it (the
// queue's order: arrival, passing over only a ticket whose own limit is
// reached), as the admin listing says. The release judges tickets by the
// limit their records hold: small's loop, finding its limit changed,
// calls at once and writes 3 into it, or the slot would go to big's
// waiter, behind it.
func TestARaisedPlanLimitKeepsItsWaitersTurn(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		small := tiers.Tier{Plan: "small", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second}
		big := small
		big.Plan, big.MaxConcurrentStreams = "big", 3
		if err := e.table.Replace(append(limitertest.Tiers(), small, big)); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		user := newUser(t)
		var held []string
		for range 3 {
			res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "big"})
			if err != nil || !res.Granted {
				t.Fatalf("holder: %+v, %v", res, err)
			}
			held = append(held, res.StreamID)
		}
		granted := make(chan string, 2)
		waitCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		for i, w := range []limiter.AcquireRequest{{UserID: user, Plan: "small", StreamID: "w-small"}, {UserID: user, Plan: "big", StreamID: "w-big"}} {
			w.Wait = 10 * time.Second
			go func() {
				if res, err := e.lim.Acquire(waitCtx, w); err == nil && res.Granted {
					granted <- res.StreamID
				}
			}()
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if s, err := e.lim.Slots(ctx, user); err == nil && len(s.Queue) > i {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s not queued after 5s", w.StreamID)
				}
			}
		}
		small.MaxConcurrentStreams = 3
		if err := e.table.Replace(append(limitertest.Tiers(), small, big)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // the loops take the change in
		if s, err := e.lim.Slots(ctx, user); err == nil {
			var order []string
			for _, q := range s.Queue {
				order = append(order, q.StreamID)
			}
			t.Logf("listing before the release (the order slots go as they free): %q", order)
		}
		if _, err := e.lim.Release(ctx, user, held[0]); err != nil {
			t.Fatal(err)
		}
		select {
		case served := <-granted:
			if served != "w-small" {
				t.Errorf("the freed slot went to %s; want w-small, first in the queue and now allowed 3 while the user holds 2", served)
			}
		case <-time.After(9 * time.Second):
			t.Fatal("no waiter was granted the freed slot within 9s")
		}
	})
}
