package limiter_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// Plans that change while streams hold slots and wait for them. Limits
// apply at acquire time, and a slot's TTL travels with it (DESIGN §15):
// whatever its plan says later, the slot is heartbeated by the TTL its
// record keeps, so that is the TTL an acquire answers.

// waity lets one stream wait up to 5s for the user's one slot, which lives
// 10s (a heartbeat every second).
var waity = tiers.Tier{Plan: "waity", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second}

// recordedTTL is the TTL the record of user's slot stream keeps, on s's
// Redis.
func recordedTTL(t *testing.T, s *limitertest.Stack, user, stream string) time.Duration {
	t.Helper()
	key, err := s.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	record, err := c.Do(context.Background(), c.B().Hget().Key(keys.SlotRecords(key)).Field(stream).Build()).ToString()
	if err != nil {
		t.Fatalf("the record of %s's slot %s: %v", user, stream, err)
	}
	return lua.ParseRecord(record).TTL
}

// heartbeatAsTold heartbeats user's stream n times, each the heartbeat
// interval res answered after the last, and fails when one finds the slot
// lost or expiring sooner than the next is due.
func heartbeatAsTold(t *testing.T, lim *limiter.Limiter, user, plan string, res limiter.AcquireResult, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		time.Sleep(res.Tier.HeartbeatInterval)
		hb, err := lim.Heartbeat(context.Background(), limiter.HeartbeatRequest{UserID: user, Plan: plan, StreamID: res.StreamID})
		if err != nil || !hb.Alive {
			t.Fatalf("heartbeat %d, sent every heartbeat interval the acquire answered (%v, ttl %v): %+v, %v; want alive",
				i, res.Tier.HeartbeatInterval, res.Tier.SlotTTL, hb, err)
		}
		if left := time.Until(hb.ExpiresAt); left < res.Tier.HeartbeatInterval {
			t.Fatalf("heartbeat %d: the slot expires in %v, before the next heartbeat as told (%v)", i, left, res.Tier.HeartbeatInterval)
		}
	}
}

// TestAWaitedGrantAnswersTheTTLItWasGrantedWith: a plan's slotTTL lowered
// (10s to 600ms) while an acquire waits in its user's queue. The slot is
// granted when one frees, under the plan as it is then, and recorded with
// its TTL: the answer says that TTL and its heartbeat interval, not those
// of the plan when the acquire queued, and heartbeats sent as told keep
// the slot.
func TestAWaitedGrantAnswersTheTTLItWasGrantedWith(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			lowered := waity
			lowered.SlotTTL, lowered.HeartbeatInterval = 600*time.Millisecond, 200*time.Millisecond
			s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: append([]tiers.Tier{waity}, limitertest.Tiers()...)})
			ctx := context.Background()
			user := newUser(t)
			key, err := s.Keys.UserKey(user)
			if err != nil {
				t.Fatal(err)
			}
			mustAcquireUser(t, s.Limiter, user, waity.Plan, "held")
			q := queueUser(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: waity.Plan, StreamID: "waiter"}, key)
			if err := s.Table.Replace(append([]tiers.Tier{lowered}, limitertest.Tiers()...)); err != nil {
				t.Fatal(err)
			}
			// A look for a free slot under way as the plan changed grants by
			// the plan it read, as its answer and record then say: the slot
			// frees once such a look is over.
			time.Sleep(200 * time.Millisecond)
			if _, err := s.Limiter.Release(ctx, user, "held"); err != nil {
				t.Fatal(err)
			}
			a, ok := q.answer(3 * time.Second)
			if !ok || a.err != nil || !a.res.Granted {
				t.Fatalf("the waiter, its slot freed: %+v, %v (answered: %v); want granted", a.res, a.err, ok)
			}
			res := a.res
			if res.Tier.SlotTTL != lowered.SlotTTL || res.Tier.HeartbeatInterval != lowered.HeartbeatInterval {
				t.Errorf("the grant answers ttl %v, heartbeat interval %v; want the plan's when it was granted, %v and %v",
					res.Tier.SlotTTL, res.Tier.HeartbeatInterval, lowered.SlotTTL, lowered.HeartbeatInterval)
			}
			if got := recordedTTL(t, s, user, "waiter"); got != res.Tier.SlotTTL {
				t.Errorf("the slot's record keeps ttl %v; the grant answered %v", got, res.Tier.SlotTTL)
			}
			if left := time.Until(res.ExpiresAt); left > lowered.SlotTTL {
				t.Errorf("the grant expires in %v; want within the TTL it was granted with, %v", left, lowered.SlotTTL)
			}
			heartbeatAsTold(t, s.Limiter, user, waity.Plan, res, 4)
		})
	}
}

// TestAWaitedMembershipIsGrantedForItsStreamsTTL: a stream holds its
// user's slot (10s TTL) and waits for a place in a full pool key while its
// plan's slotTTL is lowered to 600ms. The place it is granted lives by the
// slot's TTL, which the answer gives and its heartbeats keep it by: it
// does not lapse before the first heartbeat sent as told.
func TestAWaitedMembershipIsGrantedForItsStreamsTTL(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			lowered := waity
			lowered.SlotTTL, lowered.HeartbeatInterval = 600*time.Millisecond, 200*time.Millisecond
			s := replicasOf(t, b, 1, append([]tiers.Tier{waity}, limitertest.Tiers()...), poolTable(t,
				pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 5 * time.Second}))[0]
			ctx := context.Background()
			other, user := newUser(t), newUser(t)
			gpt := map[string]string{"model": "gpt-4o"}
			if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: other, Plan: "three", StreamID: "other", Pools: gpt}); err != nil || !res.Granted {
				t.Fatalf("%s's acquire of model=gpt-4o: %+v, %v", other, res, err)
			}
			q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: waity.Plan, StreamID: "waiter", Pools: gpt}, 5*time.Second)
			if err := s.Table.Replace(append([]tiers.Tier{lowered}, limitertest.Tiers()...)); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Limiter.Release(ctx, other, "other"); err != nil {
				t.Fatal(err)
			}
			a, ok := q.answer(3 * time.Second)
			if !ok || a.err != nil || !a.res.Granted || len(a.res.Pools) != 1 {
				t.Fatalf("the waiter, the key's place freed: %+v, %v (answered: %v); want granted with model=gpt-4o", a.res, a.err, ok)
			}
			if got := recordedTTL(t, s, user, "waiter"); got != a.res.Tier.SlotTTL || got != waity.SlotTTL {
				t.Errorf("the answer's ttl %v, the slot's recorded %v; want both %v, taken before the plan changed", a.res.Tier.SlotTTL, got, waity.SlotTTL)
			}
			heartbeatAsTold(t, s.Limiter, user, waity.Plan, a.res, 2)
		})
	}
}

// TestAnExtensionAnswersTheTTLItsRecordKeeps: an acquire retried under a
// held stream's id extends the slot as it was taken, its record (TTL
// included) kept: the answer gives the plan it was taken under (in force
// or since removed), that plan's limit, the recorded TTL and a heartbeat
// interval within a third of it, and heartbeats sent as told keep it.
// The extension moves the slot by that TTL too, as it answers, not by
// its plan's now: once its holder stops, the slot goes within it.
func TestAnExtensionAnswersTheTTLItsRecordKeeps(t *testing.T) {
	ttlplan := tiers.Tier{Plan: "ttlplan", MaxConcurrentStreams: 1, SlotTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, FailureMode: tiers.FailOpen}
	raised := ttlplan
	raised.SlotTTL, raised.HeartbeatInterval = 3*time.Second, time.Second
	gold := tiers.Tier{Plan: "gold", MaxConcurrentStreams: 2, SlotTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond, FailureMode: tiers.FailOpen}
	cases := []struct {
		name     string
		taken    tiers.Tier   // the plan the slot is taken under
		then     []tiers.Tier // the plans in force when it is retried
		retry    string       // the plan the retry names
		interval time.Duration
	}{
		{"its plan's TTL raised", ttlplan, []tiers.Tier{raised}, ttlplan.Plan, ttlplan.HeartbeatInterval},
		{"its plan removed, retried under another", gold, nil, "three", gold.HeartbeatInterval},
	}
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, c := range cases {
			t.Run(b.String()+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: append([]tiers.Tier{c.taken}, limitertest.Tiers()...)})
				ctx := context.Background()
				user := newUser(t)
				mustAcquireUser(t, s.Limiter, user, c.taken.Plan, "s")
				if err := s.Table.Replace(append(c.then, limitertest.Tiers()...)); err != nil {
					t.Fatal(err)
				}
				res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: c.retry, StreamID: "s"})
				if err != nil || !res.Granted {
					t.Fatalf("the retried acquire (an extension): %+v, %v; want granted", res, err)
				}
				if res.Tier.Plan != c.taken.Plan || res.Limit != c.taken.MaxConcurrentStreams {
					t.Errorf("the extension answers plan %q, limit %d; want %q's %d, the plan the slot was taken under", res.Tier.Plan, res.Limit, c.taken.Plan, c.taken.MaxConcurrentStreams)
				}
				if res.Tier.SlotTTL != c.taken.SlotTTL || res.Tier.HeartbeatInterval != c.interval {
					t.Errorf("the extension answers ttl %v, heartbeat interval %v; want the recorded %v and %v", res.Tier.SlotTTL, res.Tier.HeartbeatInterval, c.taken.SlotTTL, c.interval)
				}
				if got := recordedTTL(t, s, user, "s"); got != c.taken.SlotTTL {
					t.Errorf("the slot's record keeps ttl %v; want %v, kept by the extension", got, c.taken.SlotTTL)
				}
				if left := time.Until(res.ExpiresAt); left > c.taken.SlotTTL+100*time.Millisecond {
					t.Errorf("the extension answers ttl %v and an expiry %v away; want it within the ttl", res.Tier.SlotTTL, left.Round(time.Millisecond))
				}
				heartbeatAsTold(t, s.Limiter, user, c.retry, res, 4)
				// The holder stops: no heartbeat, no release.
				time.Sleep(c.taken.SlotTTL + 200*time.Millisecond)
				if slots, err := s.Limiter.Slots(ctx, user); err != nil || slots.Used != 0 {
					t.Errorf("%v after the last heartbeat, a slot of ttl %v: %+v, %v; want it expired",
						c.taken.SlotTTL+200*time.Millisecond, c.taken.SlotTTL, slots, err)
				}
			})
		}
	}
}

// slowLooks are limiter options under which a waiting acquire's loop
// looks again on its own only seconds later (a refresh every 10s, a poll
// every 10s): what reaches it sooner was sent to it.
var slowLooks = limiter.Options{TicketTTL: 30 * time.Second, WaitPoll: 10 * time.Second}

// promptly bounds how soon a change of the plans or pools reaches the
// acquires waiting under them: at once (docs/configuration.md, Shadow
// mode), with room for a loaded machine.
const promptly = 250 * time.Millisecond

// TestAChangedPlanReachesItsWaitersAtOnce: a user holds pa's one slot; an
// acquire of pa waits first, one of pb second, past pb's limit of 1. A
// change of pb reaches the second at once, not at its loop's next look:
// its limit raised to 3, or put in shadow mode, it is let in while the
// first still waits; removed, it is answered unknown_plan.
func TestAChangedPlanReachesItsWaitersAtOnce(t *testing.T) {
	pa := tiers.Tier{Plan: "pa", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second}
	pb := pa
	pb.Plan = "pb"
	raised, shadow := pb, pb
	raised.MaxConcurrentStreams = 3
	off := false
	shadow.Enforce = &off
	cases := []struct {
		name        string
		then        []tiers.Tier
		err         error
		wouldRefuse string
	}{
		{"pb's limit raised", []tiers.Tier{pa, raised}, nil, ""},
		{"pb put in shadow mode", []tiers.Tier{pa, shadow}, nil, limiter.CodeStreamLimitReached},
		{"pb removed", []tiers.Tier{pa}, limiter.ErrUnknownPlan, ""},
	}
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, c := range cases {
			t.Run(b.String()+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: []tiers.Tier{pa, pb}, Limiter: slowLooks})
				ctx := context.Background()
				user := newUser(t)
				key, err := s.Keys.UserKey(user)
				if err != nil {
					t.Fatal(err)
				}
				mustAcquireUser(t, s.Limiter, user, pa.Plan, "held")
				first := queueUser(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: pa.Plan, StreamID: "wa"}, key)
				second := queueUser(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: pb.Plan, StreamID: "wb"}, key)
				if listing, err := s.Limiter.Slots(ctx, user); err != nil || len(listing.Queue) != 2 || listing.Queue[1].StreamID != "wb" || listing.Queue[1].Place != 2 {
					t.Fatalf("the user's queue: %+v, %v; want wa, then wb at place 2", listing.Queue, err)
				}
				if a, ok := second.answer(100 * time.Millisecond); ok {
					t.Fatalf("wb before pb changed: %+v, %v; want it waiting", a.res, a.err)
				}
				if err := s.Table.Replace(c.then); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				a, ok := second.answer(5 * time.Second)
				took := time.Since(start)
				switch {
				case !ok:
					t.Fatalf("wb not answered within 5s of the change")
				case c.err != nil && !errors.Is(a.err, c.err):
					t.Errorf("wb: %+v, %v; want %v", a.res, a.err, c.err)
				case c.err == nil && (a.err != nil || !a.res.Granted || a.res.WouldRefuse != c.wouldRefuse):
					t.Errorf("wb: %+v, %v; want granted, would_refuse %q", a.res, a.err, c.wouldRefuse)
				}
				if took > promptly {
					t.Errorf("wb answered %v after pb changed; want within %v", took.Round(time.Millisecond), promptly)
				}
				if a, ok := first.answer(0); ok {
					t.Errorf("wa, of pa, unchanged: %+v, %v; want it still waiting", a.res, a.err)
				}
			})
		}
	}
}

// TestAChangedPoolReachesItsWaitersAtOnce: an acquire waits for a place in
// a full pool key (cap 1). A change of the pool reaches it at once, not at
// its loop's next look: the key's cap raised to 2, or the pool put in
// shadow mode, it is let in; the pool removed, it is answered so.
func TestAChangedPoolReachesItsWaitersAtOnce(t *testing.T) {
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second}.WithDefaults()
	raised, shadow := model, model
	raised.MaxConcurrentStreams = ptr(2)
	off := false
	shadow.Enforce = &off
	cases := []struct {
		name        string
		then        []pools.Pool
		err         error
		wouldRefuse string
	}{
		{"its cap raised", []pools.Pool{raised}, nil, ""},
		{"put in shadow mode", []pools.Pool{shadow}, nil, limiter.CodePoolLimitReached},
		{"removed", nil, limiter.ErrUnknownPool, ""},
	}
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, c := range cases {
			t.Run(b.String()+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				table := poolTable(t, model)
				opts := slowLooks
				opts.Pools = table
				s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: append([]tiers.Tier{waity}, limitertest.Tiers()...), Limiter: opts})
				ctx := context.Background()
				other, user := newUser(t), newUser(t)
				gpt := map[string]string{"model": "gpt-4o"}
				if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: other, Plan: "three", StreamID: "other", Pools: gpt}); err != nil || !res.Granted {
					t.Fatalf("%s's acquire of model=gpt-4o: %+v, %v", other, res, err)
				}
				q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: waity.Plan, StreamID: "waiter", Pools: gpt}, 5*time.Second)
				if a, ok := q.answer(100 * time.Millisecond); ok {
					t.Fatalf("the waiter before the pool changed: %+v, %v; want it waiting", a.res, a.err)
				}
				if err := table.Replace(c.then); err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				a, ok := q.answer(5 * time.Second)
				took := time.Since(start)
				switch {
				case !ok:
					t.Fatalf("the waiter not answered within 5s of the change")
				case c.err != nil && !errors.Is(a.err, c.err):
					t.Errorf("the waiter: %+v, %v; want %v", a.res, a.err, c.err)
				case c.err == nil && (a.err != nil || !a.res.Granted || a.res.WouldRefuse != c.wouldRefuse):
					t.Errorf("the waiter: %+v, %v; want granted, would_refuse %q", a.res, a.err, c.wouldRefuse)
				}
				if took > promptly {
					t.Errorf("the waiter answered %v after the pool changed; want within %v", took.Round(time.Millisecond), promptly)
				}
			})
		}
	}
}

// TestALoweredPlanLimitHoldsBackNoLargerPlansWaiter: a user holds 3 slots
// of plan big; an acquire of plan small (allowed 3 as it queued) waits,
// then one of big; small is lowered to 1. The slot the user frees next
// goes to the big acquire at once, on every store: the small ticket's
// record held the limit it queued with, by which the release woke it, and
// its call, at small's limit, took nothing and woke no one, so the slot
// stayed free until a held one expired (10s).
func TestALoweredPlanLimitHoldsBackNoLargerPlansWaiter(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		small := tiers.Tier{Plan: "small", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 10 * time.Second}
		big := small
		big.Plan = "big"
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
		small.MaxConcurrentStreams = 1
		if err := e.table.Replace(append(limitertest.Tiers(), small, big)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.lim.Release(ctx, user, held[0]); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		select {
		case served := <-granted:
			if took := time.Since(released); served != "w-big" || took > 2*time.Second {
				t.Errorf("the freed slot went to %s %v after the release; want w-big at once (the held slots expire in 10s)", served, took.Round(time.Millisecond))
			}
		case <-time.After(9 * time.Second):
			t.Fatal("no waiter was granted the freed slot within 9s")
		}
	})
}

// TestAWaitedPoolPlaceLivesByItsOwnStreamsTTLBesideAnothers: two acquires
// of one plan wait for one pool key on one replica, their user slots taken
// under two TTLs of the plan (10s before a change, 600ms after). The
// place granted to the 600ms stream lives by its own slot's TTL
// (docs/api.md "Judged as it is granted"), not the other waiter's 10s
// carried in the same call: when that stream never heartbeats (its client
// died), its place lapses with its slot, and the other waiter gets it
// rather than timing out.
func TestAWaitedPoolPlaceLivesByItsOwnStreamsTTLBesideAnothers(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			plan := waity
			plan.Plan, plan.MaxConcurrentStreams = "waity3", 3
			lowered := plan
			lowered.SlotTTL, lowered.HeartbeatInterval = 600*time.Millisecond, 200*time.Millisecond
			s := replicasOf(t, b, 1, append([]tiers.Tier{plan}, limitertest.Tiers()...), poolTable(t,
				pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), MaxWait: 5 * time.Second}))[0]
			ctx := context.Background()
			other, user1, user2 := newUser(t), newUser(t), newUser(t)
			gpt := map[string]string{"model": "gpt-4o"}
			for _, r := range []limiter.AcquireRequest{
				{UserID: other, Plan: "three", StreamID: "other", Pools: gpt},
				{UserID: user1, Plan: plan.Plan, StreamID: "a", Pools: gpt},
			} {
				if res, err := s.Limiter.Acquire(ctx, r); err != nil || !res.Granted {
					t.Fatalf("%s's acquire of model=gpt-4o: %+v, %v", r.UserID, res, err)
				}
			}
			q1 := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user1, Plan: plan.Plan, StreamID: "waiter1", Pools: gpt}, 5*time.Second)
			if err := s.Table.Replace(append([]tiers.Tier{lowered}, limitertest.Tiers()...)); err != nil {
				t.Fatal(err)
			}
			q2 := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user2, Plan: plan.Plan, StreamID: "waiter2", Pools: gpt}, 5*time.Second)
			if _, err := s.Limiter.Release(ctx, other, "other"); err != nil {
				t.Fatal(err)
			}
			a2, ok := q2.answer(3 * time.Second)
			if !ok || a2.err != nil || !a2.res.Granted || len(a2.res.Pools) != 1 {
				t.Fatalf("waiter2 (its user holds no place), a place freed: %+v, %v (answered: %v); want granted", a2.res, a2.err, ok)
			}
			granted := time.Now()
			if got := recordedTTL(t, s, user2, "waiter2"); got != lowered.SlotTTL || a2.res.Tier.SlotTTL != lowered.SlotTTL {
				t.Fatalf("waiter2's slot records ttl %v, answered %v; want %v", got, a2.res.Tier.SlotTTL, lowered.SlotTTL)
			}
			// The membership's expiry, as the pool key holds it.
			key, err := s.Keys.PoolKey("model", "gpt-4o")
			if err != nil {
				t.Fatal(err)
			}
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			score, err := c.Do(ctx, c.B().Zscore().Key(key).Member("waiter2 "+user2).Build()).AsFloat64()
			if err != nil {
				t.Fatalf("waiter2's membership of model=gpt-4o: %v", err)
			}
			left := time.Until(time.UnixMilli(int64(score)))
			if left > lowered.SlotTTL+200*time.Millisecond {
				t.Errorf("waiter2's place in model=gpt-4o expires in %v; want within its slot's TTL, %v (the answer's ttl_ms)", left.Round(time.Millisecond), lowered.SlotTTL)
			}
			// waiter2's client is gone: no heartbeat. Its slot lapses at 600ms;
			// its place should then go to waiter1.
			a1, ok := q1.answer(5 * time.Second)
			if !ok || a1.err != nil || !a1.res.Granted {
				t.Errorf("waiter1, waiter2 never heartbeating (its slot lapsed after %v): %+v, %v (answered: %v) %v after waiter2's grant; want granted once waiter2's place lapses",
					lowered.SlotTTL, a1.res, a1.err, ok, time.Since(granted).Round(time.Millisecond))
			}
		})
	}
}

// TestAWaiterAnsweredForARemovedScopeLeavesTheQueue: a scope (a user's
// slot, or pool key model=k, each 1) is held, and two acquires wait for
// it: the first, of plan gone, on replica 0, the second, of plan stay, on
// replica 1. Replica 0 removes the first's plan (or the pool): the first
// is answered so, and its ticket leaves the queue before it is, rather
// than stay owed the next free slot until it expires (30s here). The
// holder releases: the second is granted at once.
func TestAWaiterAnsweredForARemovedScopeLeavesTheQueue(t *testing.T) {
	t.Parallel()
	gone := tiers.Tier{Plan: "gone", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()
	stay := tiers.Tier{Plan: "stay", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second}.WithDefaults()
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, scope := range []string{"plan", "pool"} {
			t.Run(b.String()+"/"+scope, func(t *testing.T) {
				t.Parallel()
				stacks, tables := twoReplicas(t, b, []tiers.Tier{gone, stay}, []pools.Pool{model}, slowLooks)
				ctx := context.Background()
				holder := newUser(t)
				first := limiter.AcquireRequest{UserID: holder, Plan: "gone", StreamID: "first"}
				second := limiter.AcquireRequest{UserID: holder, Plan: "stay", StreamID: "second"}
				var held string
				var length func() int64
				remove := func() error { return stacks[0].Table.Replace([]tiers.Tier{stay}) }
				wantErr := limiter.ErrUnknownPlan
				if scope == "plan" {
					key, err := stacks[0].Keys.UserKey(holder)
					if err != nil {
						t.Fatal(err)
					}
					held = "held"
					mustAcquireUser(t, stacks[1].Limiter, holder, "stay", held)
					length = func() int64 { return zcard(t, stacks[0], keys.Queue(key)) }
				} else {
					held = mustAcquire(t, stacks[1].Limiter, holder, "stay", "k").StreamID
					first.UserID, first.Pools = newUser(t), map[string]string{"model": "k"}
					second.UserID, second.Pools = newUser(t), map[string]string{"model": "k"}
					length = func() int64 { return queueLength(t, stacks[0], "k") }
					remove = func() error { return tables[0].Replace(nil) }
					wantErr = limiter.ErrUnknownPool
				}
				firstWait := startQueued(t, ctx, stacks[0].Limiter, first, 10*time.Second, length)
				secondWait := startQueued(t, ctx, stacks[1].Limiter, second, 10*time.Second, length)
				if err := remove(); err != nil {
					t.Fatal(err)
				}
				if a, ok := firstWait.answer(2 * time.Second); !ok || !errors.Is(a.err, wantErr) {
					t.Fatalf("the first waiter once its %s is removed: %+v, %v (answered %v); want %v", scope, a.res, a.err, ok, wantErr)
				}
				if n := length(); n != 1 {
					t.Errorf("the queue holds %d tickets once the first waiter is answered; want 1, the second's", n)
				}
				released := time.Now()
				if _, err := stacks[1].Limiter.Release(ctx, holder, held); err != nil {
					t.Fatal(err)
				}
				a, ok := secondWait.answer(2 * time.Second)
				if !ok || a.err != nil || !a.res.Granted {
					t.Fatalf("the second waiter once the holder released: %+v, %v (answered %v); want granted at once", a.res, a.err, ok)
				}
				if took := time.Since(released); took > 2*promptly {
					t.Errorf("the second waiter granted %v after the release; want within %v", took.Round(time.Millisecond), 2*promptly)
				}
			})
		}
	}
}

// TestAnAcquireThatWaitedIsJudgedByItsPoolsAsTheyAreNow: an acquire waits
// in its user's queue, naming a pool key capped at 1 that another user
// fills. While it waits, the key's cap is lifted, or its pool removed.
// Once its user's slot frees, it is judged as a new acquire of the key is
// then: granted (the key refuses no one), or refused ErrUnknownPool (its
// user's slot undone), not refused by the cap it waited under.
func TestAnAcquireThatWaitedIsJudgedByItsPoolsAsTheyAreNow(t *testing.T) {
	cases := []struct {
		name    string
		then    []pools.Pool
		wantErr error // nil: granted
	}{
		{"its key's cap lifted", []pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"other": 5}}.WithDefaults()}, nil},
		{"its pool removed", nil, limiter.ErrUnknownPool},
	}
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, c := range cases {
			t.Run(b.String()+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)})
				s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second},
					Tiers:   []tiers.Tier{tiers.Tier{Plan: "one", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()},
					Limiter: limiter.Options{Pools: table}})
				ctx := context.Background()
				named := map[string]string{"model": "k"}
				if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "one", Pools: named}); err != nil || !res.Granted {
					t.Fatalf("another user's stream filling model=k: %+v, %v", res, err)
				}
				user := newUser(t)
				own, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one"})
				if err != nil || !own.Granted {
					t.Fatalf("the user's own stream: %+v, %v", own, err)
				}
				userKey, err := s.Keys.UserKey(user)
				if err != nil {
					t.Fatal(err)
				}
				q := startQueued(t, ctx, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "one", Pools: named}, 5*time.Second,
					func() int64 { return zcard(t, s, keys.Queue(userKey)) })
				if err := table.Replace(c.then); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Limiter.Release(ctx, user, own.StreamID); err != nil {
					t.Fatal(err)
				}
				a, ok := q.answer(3 * time.Second)
				if !ok {
					t.Fatal("the waiter was not answered within 3s of its user's slot freeing")
				}
				if c.wantErr == nil && (a.err != nil || !a.res.Granted) {
					t.Errorf("the waiter: %+v, %v (refused by %+v); want granted, as a new acquire of model=k is now", a.res, a.err, a.res.RefusedBy)
				}
				if c.wantErr == nil {
					wantUncapped(t, a.res.Pools, "k")
				}
				if c.wantErr != nil && !errors.Is(a.err, c.wantErr) {
					t.Errorf("the waiter: %+v, %v (refused by %+v); want %v, as a new acquire naming pool model is now", a.res, a.err, a.res.RefusedBy, c.wantErr)
				}
				if c.wantErr != nil {
					if slots, err := s.Limiter.Slots(ctx, user); err != nil || slots.Used != 0 {
						t.Errorf("the user's slots after the waiter was refused: %+v, %v; want none, its grant undone", slots, err)
					}
				}
			})
		}
	}
}

// TestAnAcquireWaitingInAPoolKeyWhoseCapIsLiftedIsJudgedByNone: an
// acquire waits in the queue of model=k (cap 1, held by another user),
// and k's cap is lifted meanwhile. It is granted, and its grant of k says
// it was judged by no cap (Uncapped, Limit 0), not by the cap of 1 the key
// no longer has, which it would be counted above.
func TestAnAcquireWaitingInAPoolKeyWhoseCapIsLiftedIsJudgedByNone(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second})
			s := limitertest.New(t, limitertest.Options{Backend: b, Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table}})
			ctx := context.Background()
			mustAcquire(t, s.Limiter, newUser(t), "low", "k")
			res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}, Wait: 5 * time.Second,
				OnWait: func(time.Duration) {
					if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"other": 5}, MaxWait: 10 * time.Second}.WithDefaults()}); err != nil {
						t.Error(err)
					}
				}})
			if err != nil || !res.Granted || res.Waited == 0 {
				t.Fatalf("the acquire waiting in model=k as its cap is lifted: %+v, %v; want granted after a wait", res, err)
			}
			wantUncapped(t, res.Pools, "k")
		})
	}
}

// atPoolWaitEnd is an Observer that runs then once, as the first wait in
// a pool key's queue stops waiting: its outcome decided, before the
// acquire answers it.
type atPoolWaitEnd struct {
	limiter.Observer
	once sync.Once
	then func()
}

func (o *atPoolWaitEnd) PoolWaiting(ctx context.Context, pool string, priority, delta int) {
	o.Observer.PoolWaiting(ctx, pool, priority, delta)
	if delta < 0 {
		o.once.Do(o.then)
	}
}

// TestAPoolWaitThatRunsOutAsItsKeysCapChangesIsJudgedByTheCapInForce: an
// acquire's wait in the queue of model=k, full, runs out, and k's cap
// changes between the end of the wait and the acquire's answer. Lowered,
// the refusal names the cap in force as it answers, not the one the
// acquire queued under. Lifted, no cap refuses it, as none refuses a new
// acquire: it is granted k judged by none, not refused by the cap k no
// longer has.
func TestAPoolWaitThatRunsOutAsItsKeysCapChangesIsJudgedByTheCapInForce(t *testing.T) {
	cases := []struct {
		name      string
		cap, then int // the key's cap as the acquire queues, and as its wait ends (0: lifted)
	}{
		{"its cap lowered", 2, 1},
		{"its cap lifted", 1, 0},
	}
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, c := range cases {
			t.Run(b.String()+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				table := poolTable(t, pools.Pool{Pool: "model", Keys: map[string]int{"k": c.cap}, MaxWait: 10 * time.Second})
				then := pools.Pool{Pool: "model", Keys: map[string]int{"other": 5}, MaxWait: 10 * time.Second}
				if c.then > 0 {
					then.Keys["k"] = c.then
				}
				observer := &atPoolWaitEnd{Observer: limiter.NopObserver, then: func() {
					if err := table.Replace([]pools.Pool{then.WithDefaults()}); err != nil {
						t.Error(err)
					}
				}}
				s := limitertest.New(t, limitertest.Options{Backend: b, Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table, Observer: observer}})
				ctx := context.Background()
				for range c.cap {
					mustAcquire(t, s.Limiter, newUser(t), "low", "k")
				}
				res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}, Wait: 300 * time.Millisecond})
				switch {
				case err != nil:
					t.Fatalf("the waiter: %+v, %v", res, err)
				case c.then == 0:
					if !res.Granted {
						t.Fatalf("the waiter: refused by %+v; want granted, k's cap lifted as its wait ran out", res.RefusedBy)
					}
					wantUncapped(t, res.Pools, "k")
				case res.Granted || res.RefusedBy == nil || res.RefusedBy.Limit != c.then || res.RefusedBy.Used != c.cap:
					t.Errorf("the waiter: %+v, refused by %+v; want refused by model=k holding %d of the cap in force, %d", res, res.RefusedBy, c.cap, c.then)
				}
			})
		}
	}
}

// poolWaitEnds is an atPoolWaitEnd that records how pool waits ended.
type poolWaitEnds struct {
	atPoolWaitEnd
	mu    sync.Mutex
	ended []limiter.WaitOutcome
}

func (o *poolWaitEnds) PoolWaited(ctx context.Context, pool string, priority int, outcome limiter.WaitOutcome, took time.Duration) {
	o.atPoolWaitEnd.PoolWaited(ctx, pool, priority, outcome, took)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = append(o.ended, outcome)
}

// TestAPoolWaitThatRunsOutAsItsKeysCapIsLiftedIsCountedGranted: the wait
// of TestAPoolWaitThatRunsOutAsItsKeysCapChangesIsJudgedByTheCapInForce
// whose key's cap is lifted as it runs out, its acquire then granted, is
// counted granted in the pool wait metrics, not timeout (which counts a
// 429); one whose cap is lowered, refused, is counted timeout.
func TestAPoolWaitThatRunsOutAsItsKeysCapIsLiftedIsCountedGranted(t *testing.T) {
	for _, c := range []struct {
		name string
		then int // the key's cap as the wait ends (0: lifted)
		want limiter.WaitOutcome
	}{
		{"its cap lifted", 0, limiter.WaitGranted},
		{"its cap lowered", 1, limiter.WaitTimeout},
	} {
		t.Run(c.name, func(t *testing.T) {
			table := poolTable(t, pools.Pool{Pool: "model", Keys: map[string]int{"k": 2}, MaxWait: 10 * time.Second})
			then := pools.Pool{Pool: "model", Keys: map[string]int{"other": 5}, MaxWait: 10 * time.Second}
			if c.then > 0 {
				then.Keys["k"] = c.then
			}
			log := &poolWaitEnds{atPoolWaitEnd: atPoolWaitEnd{Observer: limiter.NopObserver, then: func() {
				if err := table.Replace([]pools.Pool{then.WithDefaults()}); err != nil {
					t.Error(err)
				}
			}}}
			s := limitertest.New(t, limitertest.Options{Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table, Observer: log}})
			for range 2 {
				mustAcquire(t, s.Limiter, newUser(t), "low", "k")
			}
			res, err := s.Limiter.Acquire(context.Background(), limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}, Wait: 300 * time.Millisecond})
			if err != nil || res.Granted != (c.then == 0) {
				t.Fatalf("the waiter: %+v, %v; want granted only with the cap lifted", res, err)
			}
			log.mu.Lock()
			defer log.mu.Unlock()
			if !slices.Equal(log.ended, []limiter.WaitOutcome{c.want}) {
				t.Errorf("pool waits ended %v, want [%s]", log.ended, c.want)
			}
		})
	}
}

// wantUncapped checks that grants hold one grant, of model=key, judged by
// no cap.
func wantUncapped(t *testing.T, grants []limiter.PoolGrant, key string) {
	t.Helper()
	if len(grants) != 1 || grants[0].Key != key || !grants[0].Uncapped || grants[0].Limit != 0 || grants[0].WouldRefuse {
		t.Errorf("the grants of the acquire: %+v; want model=%s's alone, Uncapped with Limit 0: its cap was lifted, it was judged by none", grants, key)
	}
}

// TestAPoolPlaceGrantedAsAnotherPoolIsRemovedIsGivenBack: an acquire
// naming model=k (full: it waits for a place) and org=o; org is removed
// while it waits, and model=k's place is granted to it. The acquire is
// refused unknown_pool, as a new one naming org is, and gives back every
// place it was granted: model=k's too, not left to hold the key's only
// place for a TTL.
func TestAPoolPlaceGrantedAsAnotherPoolIsRemovedIsGivenBack(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second}
			table := poolTable(t, model, pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(5)})
			s := limitertest.New(t, limitertest.Options{Backend: b, Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table}})
			ctx := context.Background()
			holder := newUser(t)
			held := mustAcquire(t, s.Limiter, holder, "low", "k")
			user := newUser(t)
			res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "low", Pools: map[string]string{"model": "k", "org": "o"}, Wait: 5 * time.Second,
				OnWait: func(time.Duration) {
					if err := table.Replace([]pools.Pool{model.WithDefaults()}); err != nil {
						t.Error(err)
					}
					if _, err := s.Limiter.ReleaseJoined(ctx, holder, held.StreamID, held.Pools); err != nil {
						t.Error(err)
					}
				}})
			if !errors.Is(err, limiter.ErrUnknownPool) {
				t.Fatalf("the acquire whose pool org was removed as it waited: %+v, %v; want ErrUnknownPool", res, err)
			}
			slots, err := s.Keys.PoolKey("model", "k")
			if err != nil {
				t.Fatal(err)
			}
			if n := zcard(t, s, slots); n != 0 {
				t.Errorf("model=k holds %d places after the refused acquire; want 0 (its place given back)", n)
			}
			if us, err := s.Limiter.Slots(ctx, user); err != nil || us.Used != 0 {
				t.Errorf("the user's slots after the refusal: %+v, %v; want none", us, err)
			}
		})
	}
}

// TestAnOverrideOfAKeyNoLongerCappedRefusesNoWaitedAcquire: model=k is capped
// at 1, filled by another user, and support overrides its cap to 0. While
// an acquire naming model=k waits in its user's queue, k's cap is lifted
// (the pool no longer lists it, no default). A new acquire of model=k is
// granted (k is joined by nothing); the waited one, "joined as a new
// acquire would now", is granted too, not refused by the override of a
// key no longer capped.
func TestAnOverrideOfAKeyNoLongerCappedRefusesNoWaitedAcquire(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			anOverrideOfAKeyNoLongerCappedRefusesNoWaitedAcquire(t, b)
		})
	}
}

func anOverrideOfAKeyNoLongerCappedRefusesNoWaitedAcquire(t *testing.T, b limitertest.Backend) {
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)})
	s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers:   []tiers.Tier{tiers.Tier{Plan: "one", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()},
		Limiter: limiter.Options{Pools: table}})
	ctx := context.Background()
	named := map[string]string{"model": "k"}
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "one", Pools: named}); err != nil || !res.Granted {
		t.Fatalf("another user's stream filling model=k: %+v, %v", res, err)
	}
	if _, err := s.Limiter.SetPoolOverride(ctx, "model", "k", limiter.OverrideRequest{MaxConcurrentStreams: 0, For: time.Hour, Actor: "t", Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	user := newUser(t)
	own, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one"})
	if err != nil || !own.Granted {
		t.Fatalf("the user's own stream: %+v, %v", own, err)
	}
	userKey, err := s.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	q := startQueued(t, ctx, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "one", Pools: named}, 5*time.Second,
		func() int64 { return zcard(t, s, keys.Queue(userKey)) })
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"other": 5}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "one", Pools: named}); err != nil || !res.Granted {
		t.Fatalf("a new acquire of model=k, its cap lifted: %+v, %v; want granted", res, err)
	}
	if _, err := s.Limiter.Release(ctx, user, own.StreamID); err != nil {
		t.Fatal(err)
	}
	a, ok := q.answer(3 * time.Second)
	if !ok {
		t.Fatal("the waiter was not answered within 3s of its user's slot freeing")
	}
	if a.err != nil || !a.res.Granted {
		t.Errorf("the waiter: %+v, %v (refused by %+v); want granted, as a new acquire of model=k is now", a.res, a.err, a.res.RefusedBy)
	}
}
