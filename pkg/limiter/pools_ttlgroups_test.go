package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestTwoTTLGroupsOfAPoolKeyPollWithoutAStorm: two acquires of one plan wait
// for one full pool key on one replica, their user slots taken under two
// TTLs of the plan (10s, then 600ms). Both could be served next (places 1
// and 2 of a cap of 2): both poll. With no slot free, a second of polls
// runs the wait script at most a few times; a slot freed with no wake-up
// goes to the head within a poll or two, and the next to the other.
func TestTwoTTLGroupsOfAPoolKeyPollWithoutAStorm(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		log := newCallLog()
		plan := tiers.Tier{Plan: "w3", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, MaxWait: 8 * time.Second}.WithDefaults()
		short := plan
		short.SlotTTL, short.HeartbeatInterval = 600*time.Millisecond, 200*time.Millisecond
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
		x := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: u1, Plan: plan.Plan, StreamID: "x", Pools: gpt}, 8*time.Second)
		if err := s.Table.Replace(append([]tiers.Tier{short}, limitertest.Tiers()...)); err != nil {
			t.Fatal(err)
		}
		y := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: u2, Plan: plan.Plan, StreamID: "y", Pools: gpt}, 8*time.Second)
		time.Sleep(200 * time.Millisecond)
		log.take()
		time.Sleep(time.Second)
		got := log.take()
		t.Logf("a second, no slot free: %d polls, %d wait calls", got["wait_poll"], got["wait"])
		if got["wait"] > 4 {
			t.Errorf("a second of polls with no slot free ran the wait script %d times; want at most a few", got["wait"])
		}
		key, err := s.Keys.PoolKey("model", "gpt-4o")
		if err != nil {
			t.Fatal(err)
		}
		freeByHand(t, s, key, "o1 "+o1)
		a, ok := x.answer(time.Second)
		got = log.take()
		t.Logf("o1 freed: x answered %v (%+v, %v); %d polls, %d wait calls", ok, a.res.Granted, a.err, got["wait_poll"], got["wait"])
		if !ok || a.err != nil || !a.res.Granted {
			t.Fatalf("x (the head), a place freed with no wake-up: %+v, %v (answered %v); want granted within a second", a.res, a.err, ok)
		}
		freeByHand(t, s, key, "o2 "+o2)
		a, ok = y.answer(time.Second)
		got = log.take()
		t.Logf("o2 freed: y answered %v; %d polls, %d wait calls", ok, got["wait_poll"], got["wait"])
		if !ok || a.err != nil || !a.res.Granted {
			t.Fatalf("y, a place freed with no wake-up: %+v, %v (answered %v); want granted within a second", a.res, a.err, ok)
		}
	})
}
