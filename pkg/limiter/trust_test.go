package limiter_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// held reports how many live slots user holds, through a limiter whose
// connections may still be coming back after a fault.
func held(t *testing.T, lim *limiter.Limiter, user string) int {
	t.Helper()
	var err error
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var got limiter.UserSlots
		if got, err = lim.Slots(context.Background(), user); err == nil {
			return got.Used
		}
	}
	t.Fatalf("Slots(%s): %v", user, err)
	return 0
}

// TestARetriedWaitKeepsItsSlotWhenTheFirstLeaves: two waiting acquires
// under one stream id (a client's retry) on one server; the first leaves
// in the very call that grants the ticket. The one that stays holds the
// slot: it is not released under it for the one that left.
func TestARetriedWaitKeepsItsSlotWhenTheFirstLeaves(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			waiting := &waitingCount{Observer: limiter.NopObserver}
			s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: waitTiers(),
				Limiter: limiter.Options{WaitPoll: time.Minute, Observer: waiting}}) // no poll: only this test's nudges call
			lim, user := s.Limiter, newUser(t)
			if res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "holder"}); err != nil || !res.Granted {
				t.Fatalf("holder: %+v, %v", res, err)
			}
			firstCtx, leave := context.WithCancel(context.Background())
			defer leave()
			first := startWaiting(t, firstCtx, lim, user, "wait", "retried", 5*time.Second, 1)
			second := make(chan waitResult, 1)
			go func() {
				res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "retried", Wait: 5 * time.Second})
				second <- waitResult{res, err, time.Now()}
			}()
			// Both wait in the user's loop before anything frees.
			for deadline := time.Now().Add(5 * time.Second); waiting.n.Load() < 2; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d acquires waiting after 5s, want 2", waiting.n.Load())
				}
			}
			time.Sleep(20 * time.Millisecond) // from counted to joined: a few instructions

			// The holder's slot frees with no wake-up (a lost one), and the
			// first waiter leaves: the loop's next call sees both at once.
			key, _ := s.Keys.UserKey(user)
			c, err := s.Redis.Redis()
			if err != nil {
				t.Fatal(err)
			}
			if rel, err := lua.Release(context.Background(), c, "", key, "holder"); err != nil || !rel.Released {
				t.Fatalf("releasing the holder by hand: %+v, %v", rel, err)
			}
			leave()

			got1, got2 := <-first, <-second
			if !errors.Is(got1.err, context.Canceled) {
				t.Errorf("the waiter that left: %+v, %v; want context.Canceled", got1.res, got1.err)
			}
			if got2.err != nil || !got2.res.Granted {
				t.Fatalf("the waiter that stayed: %+v, %v; want granted", got2.res, got2.err)
			}
			if n := held(t, lim, user); n != 1 {
				t.Errorf("user holds %d slots after the grant, want 1: the stayer's", n)
			}
			beat, err := lim.Heartbeat(context.Background(), limiter.HeartbeatRequest{UserID: user, Plan: "wait", StreamID: "retried"})
			if err != nil || !beat.Alive {
				t.Errorf("heartbeat of the granted stream: %+v, %v; want alive (the grant the stayer answered holds)", beat, err)
			}
		})
	}
}

// waitingCount counts the acquires waiting in users' queues.
type waitingCount struct {
	limiter.Observer
	n atomic.Int32
}

func (w *waitingCount) Waiting(_ context.Context, _ tiers.Tier, delta int) { w.n.Add(int32(delta)) }

// TestAnAcquireWhoseAnswerIsLostLeavesNoSlot: the acquire script runs but
// no answer comes back before the request's deadline (a Closed plan: an
// error, no grant). The stream id was made by the limiter, so no one else
// could release it: the limiter does, and the user's slot is free at once,
// not after a TTL. The answer still names the stream id.
func TestAnAcquireWhoseAnswerIsLostLeavesNoSlot(t *testing.T) {
	t.Parallel()
	e, proxy := lostReplies(t, 2*time.Second)
	user := newUser(t)
	proxy.DropReplies(1 << 20)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "closed"})
	if err == nil || res.Granted {
		t.Fatalf("acquire with every reply lost: %+v, %v; want an error", res, err)
	}
	if res.StreamID == "" {
		t.Errorf("the failed acquire's answer names no stream id")
	}
	proxy.DropReplies(0)
	// The release runs beside the answer, within two per-call deadlines.
	n := held(t, e.lim, user)
	for deadline := time.Now().Add(5 * time.Second); n != 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		n = held(t, e.lim, user)
	}
	if n != 0 {
		t.Errorf("user holds %d slots 5s after the unanswered acquire, want 0", n)
	}
}

// TestAnOpenAcquireWhoseAnswerIsLostAndAClosedPoolRefusesLeavesNoSlot: a
// plan failing Open, a pool failing Closed; the acquire's user script
// reaches Redis, its answer comes after the deadline, and the closed pool
// answers the acquire limiter_unavailable (503). The stream id was made
// by the limiter, and no answer names it: the limiter releases it, as it
// does a Closed plan's (above), and the user's slot is free within moments,
// not after a TTL.
func TestAnOpenAcquireWhoseAnswerIsLostAndAClosedPoolRefusesLeavesNoSlot(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	slow := testenv.StartProxy(t, srv.Addr())
	ts := []tiers.Tier{tiers.Tier{Plan: "open", MaxConcurrentStreams: 3, FailureMode: tiers.FailOpen}.WithDefaults()}
	closedPool := func() *pools.Table {
		return poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(5), FailureMode: tiers.FailClosed})
	}
	stack := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{slow.Addr()}, Timeout: 500 * time.Millisecond},
		Tiers: ts, Limiter: limiter.Options{Pools: closedPool()}})
	direct := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{srv.Addr()}}, Tiers: ts,
		Limiter: limiter.Options{Keys: stack.Keys, Pools: closedPool()}}).Limiter
	ctx := context.Background()
	pooled := map[string]string{"model": "k"}
	warm := newUser(t) // the scripts loaded while the link is fast
	g, err := stack.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: warm, Plan: "open", Pools: pooled})
	if err != nil || !g.Granted || g.Degraded {
		t.Fatalf("warm-up acquire: %+v, %v", g, err)
	}
	if _, err := stack.Limiter.Release(ctx, warm, g.StreamID); err != nil {
		t.Fatal(err)
	}

	user := newUser(t)
	sent := slow.ScriptCalls()
	slow.SetLatency(750 * time.Millisecond)
	res, err := stack.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "open", Pools: pooled})
	var poolErr *limiter.PoolUnavailableError
	if !errors.As(err, &poolErr) {
		t.Fatalf("the acquire whose answer came late: %+v, %v; want a PoolUnavailableError (503)", res, err)
	}
	// The calls already in the proxy land after its delay; those sent from
	// now on (the releases) go at once, behind them.
	slow.SetLatency(0)
	for deadline := time.Now().Add(5 * time.Second); slow.ScriptCalls() == sent; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Log("the acquire's script did not reach Redis within 5s: it took no slot")
			break
		}
	}
	var got limiter.UserSlots
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got, err = direct.Slots(ctx, user); err == nil && got.Used == 0 {
			return
		}
	}
	t.Errorf("the user's slots 3s after the unanswered acquire: %d (%+v, %v); want 0: the id the limiter made is no one else's to release",
		got.Used, got.Slots, err)
}

// TestAClosedWaitWhoseGrantIsLostLeavesNoSlot: a waiting acquire on a
// Closed plan whose granting call loses its answer is refused (503), and
// the slot that call granted is released, not held for a TTL.
func TestAClosedWaitWhoseGrantIsLostLeavesNoSlot(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	s := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 500 * time.Millisecond},
		Tiers: waitTiers(), Limiter: limiter.Options{WaitPoll: 100 * time.Millisecond}})
	lim, user := s.Limiter, newUser(t)
	if res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait-closed", StreamID: "holder"}); err != nil || !res.Granted {
		t.Fatalf("holder: %+v, %v", res, err)
	}
	done := make(chan waitResult, 1)
	go func() {
		res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait-closed", Wait: 5 * time.Second})
		done <- waitResult{res, err, time.Now()}
	}()
	awaitQueue(t, lim, user, func(q []limiter.Ticket) bool { return len(q) == 1 }, "one waiter")

	// Every answer is lost from now on; the holder's slot frees behind the
	// limiter's back, so the waiter's next poll grants it the slot.
	proxy.DropReplies(1 << 20)
	direct, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	key, _ := s.Keys.UserKey(user)
	if rel, err := lua.Release(context.Background(), direct, "", key, "holder"); err != nil || !rel.Released {
		t.Fatalf("releasing the holder by hand: %+v, %v", rel, err)
	}
	got := <-done
	if got.err == nil || got.res.Granted {
		t.Fatalf("the wait whose grant was lost: %+v, %v; want an error (a Closed plan)", got.res, got.err)
	}
	proxy.DropReplies(0)
	// The release runs beside the answer, within one call's deadline.
	var n int64
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n, err = direct.Do(context.Background(), direct.B().Zcard().Key(key).Build()).AsInt64(); err == nil && n == 0 {
			return
		}
	}
	t.Errorf("user holds %d slots 2s after the lost grant (%v), want 0", n, err)
}

// TestAPlanThatNeverWaitsTakesNoSlotOwedToAWaiter: a plan with a larger
// limit and no maxWait reads the queue too, so it does not take the slot
// a waiter of another plan is owed; once the waiter is served, it may.
//
// The waiter's ticket is queued as its server would queue it, and that
// server looks again only when the test says: a waiting Acquire's own
// server looks once its wake-up channel is subscribed, whenever that is,
// and would take the freed slot before the test could ask.
func TestAPlanThatNeverWaitsTakesNoSlotOwedToAWaiter(t *testing.T) {
	t.Parallel()
	ts := append(waitTiers(),
		tiers.Tier{Plan: "two-wait", MaxConcurrentStreams: 2, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second},
		tiers.Tier{Plan: "three-no-wait", MaxConcurrentStreams: 3, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen})
	s := limitertest.New(t, limitertest.Options{Tiers: ts, Limiter: limiter.Options{WaitPoll: time.Minute}})
	lim, user := s.Limiter, newUser(t)
	for _, id := range []string{"a", "b"} {
		if res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "two-wait", StreamID: id}); err != nil || !res.Granted {
			t.Fatalf("%s: %+v, %v", id, res, err)
		}
	}
	queueByHand(t, s, user, "w", 2, time.Minute)
	// a frees, and nobody wakes w: w is owed the slot, not yet granted.
	key, _ := s.Keys.UserKey(user)
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lua.Release(context.Background(), c, "", key, "a"); err != nil {
		t.Fatal(err)
	}
	res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three-no-wait", StreamID: "x"})
	if err != nil || res.Granted {
		t.Fatalf("acquire of a plan that never waits, with w owed the freed slot: %+v, %v; want denied", res, err)
	}
	// w's server looks: w is granted the slot it was owed.
	got, err := lua.Wait(context.Background(), c, key, lua.WaitArgs{Limit: 2, SlotTTL: 10 * time.Second, TicketTTL: time.Minute, MaxQueue: 100,
		Tickets: []lua.TicketArgs{{StreamID: "w"}}})
	if err != nil || got.Tickets[0].State != lua.TicketGranted {
		t.Fatalf("w's look: %+v, %v; want granted", got, err)
	}
	if res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three-no-wait", StreamID: "x"}); err != nil || !res.Granted {
		t.Fatalf("acquire of the plan of 3 once w holds its slot: %+v, %v; want granted", res, err)
	}
}

// TestAWaitingAcquiresStreamIDIsNotAnotherCallersToTake: alice's acquire
// (plan two-wait, limit 2) waits for stream w of a user holding 2 slots.
// mallory's acquire of w, plan five (limit 5, room for one more, and
// alice's ticket owed nothing under its own limit), is ErrNotSlotHolder,
// saying the id waits in the queue under another caller, and takes
// nothing. Once a slot frees, alice's acquire is granted w.
func TestAWaitingAcquiresStreamIDIsNotAnotherCallersToTake(t *testing.T) {
	ts := append(waitTiers(),
		tiers.Tier{Plan: "two-wait", MaxConcurrentStreams: 2, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second},
		tiers.Tier{Plan: "five", MaxConcurrentStreams: 5, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen})
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lim := limitertest.New(t, limitertest.Options{Backend: b, Tiers: ts, Limiter: limiter.Options{WaitPoll: time.Hour}}).Limiter
		ctx, user := context.Background(), newUser(t)
		for _, id := range []string{"a", "b"} {
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "two-wait", StreamID: id, Caller: "alice"}); err != nil || !res.Granted {
				t.Fatalf("alice's %s: %+v, %v", id, res, err)
			}
		}
		done := make(chan waitResult, 1)
		go func() {
			res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "two-wait", StreamID: "w", Caller: "alice", Wait: 5 * time.Second})
			done <- waitResult{res, err, time.Now()}
		}()
		awaitQueue(t, lim, user, func(q []limiter.Ticket) bool { return len(q) == 1 && q[0].StreamID == "w" }, "w waiting")

		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "five", StreamID: "w", Caller: "mallory"})
		if !errors.Is(err, limiter.ErrNotSlotHolder) || res.Granted {
			t.Fatalf("mallory's acquire of alice's waiting stream id: %+v, %v; want ErrNotSlotHolder", res, err)
		}
		if want := `stream "w" of user "` + user + `" waits in the queue under another caller`; !strings.Contains(err.Error(), want) {
			t.Errorf("mallory's refusal says %q; want it to say %q", err, want)
		}
		if n := held(t, lim, user); n != 2 {
			t.Errorf("user holds %d slots after mallory's acquire; want 2, alice's", n)
		}
		if res, err := lim.ReleaseAs(ctx, "alice", user, "a"); err != nil || !res.Released {
			t.Fatalf("alice's release of a: %+v, %v", res, err)
		}
		r := within(t, done, 3*time.Second, "alice's wait once a is released")
		if r.err != nil || !r.res.Granted || r.res.StreamID != "w" {
			t.Fatalf("alice's waiting acquire: %+v, %v; want granted w", r.res, r.err)
		}
	})
}
