package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// waitTiers are the plans of the wait tests: one slot per user, waits of
// up to 5s (Open and Closed), and one slot with no waiting.
func waitTiers() []tiers.Tier {
	return []tiers.Tier{
		{Plan: "wait", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second},
		{Plan: "wait-closed", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailClosed, MaxWait: 5 * time.Second},
		{Plan: "short-wait", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 300 * time.Millisecond},
		{Plan: "no-wait", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen},
		{Plan: "wait-high", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second, HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, MaxWait: 5 * time.Second, Priority: 5},
	}
}

// replicas returns n limiters on one backend sharing one key prefix, as n
// replicas of the service share Redis; the embedded store gets one (it is
// one process's). poll is every limiter's WaitPoll.
func replicas(t *testing.T, b limitertest.Backend, n int, poll time.Duration) []*limiter.Limiter {
	t.Helper()
	var out []*limiter.Limiter
	for _, s := range replicaStacks(t, b, n, poll) {
		out = append(out, s.Limiter)
	}
	return out
}

func replicaStacks(t *testing.T, b limitertest.Backend, n int, poll time.Duration) []*limitertest.Stack {
	t.Helper()
	if b == limitertest.Embedded {
		n = 1
	}
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	var out []*limitertest.Stack
	var addrs []string
	for range n {
		s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Addrs: addrs, Timeout: 5 * time.Second}, Tiers: waitTiers(),
			Limiter: limiter.Options{Keys: prefix, WaitPoll: poll}})
		addrs = s.Redis.Addrs()
		out = append(out, s)
	}
	return out
}

// queueByHand queues a ticket for user as a server would, under limit,
// with ttl, and never refreshes it: a waiter whose server died, or has
// not looked since.
func queueByHand(t *testing.T, s *limitertest.Stack, user, stream string, limit int, ttl time.Duration) {
	t.Helper()
	key, err := s.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	got, err := lua.Wait(context.Background(), c, key, lua.WaitArgs{Limit: limit, SlotTTL: 10 * time.Second, TicketTTL: ttl, MaxQueue: 100,
		Tickets: []lua.TicketArgs{{StreamID: stream}}})
	if err != nil || got.Tickets[0].State != lua.TicketQueued {
		t.Fatalf("queueing %s by hand: %+v, %v", stream, got, err)
	}
}

// eachWaitBackend runs fn on standalone Redis, Redis Cluster and the
// embedded store.
func eachWaitBackend(t *testing.T, fn func(t *testing.T, b limitertest.Backend)) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster, limitertest.Embedded} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// waitResult is what one waiting Acquire returned.
type waitResult struct {
	res limiter.AcquireResult
	err error
	at  time.Time
}

// startWaiting runs a waiting Acquire of stream for user on lim, and
// returns once the stream holds place in the user's queue.
func startWaiting(t *testing.T, ctx context.Context, lim *limiter.Limiter, user, plan, stream string, wait time.Duration, place int) <-chan waitResult {
	t.Helper()
	done := make(chan waitResult, 1)
	go func() {
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: plan, StreamID: stream, Wait: wait})
		done <- waitResult{res, err, time.Now()}
	}()
	awaitQueue(t, lim, user, func(q []limiter.Ticket) bool { return len(q) >= place && q[place-1].StreamID == stream },
		fmt.Sprintf("%s at place %d", stream, place))
	return done
}

// awaitQueue waits up to 5s until the user's queue satisfies ok.
func awaitQueue(t *testing.T, lim *limiter.Limiter, user string, ok func([]limiter.Ticket) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := lim.Slots(context.Background(), user)
		if err == nil && ok(got.Queue) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %s: want %s, got %+v (%v)", user, what, got.Queue, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func hold(t *testing.T, lim *limiter.Limiter, user, plan, stream string) {
	t.Helper()
	res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan, StreamID: stream})
	if err != nil || !res.Granted {
		t.Fatalf("Acquire %s: %+v, %v; want granted", stream, res, err)
	}
}

func release(t *testing.T, lim *limiter.Limiter, user, stream string) {
	t.Helper()
	if res, err := lim.Release(context.Background(), user, stream); err != nil || !res.Released {
		t.Fatalf("Release %s: %+v, %v; want released", stream, res, err)
	}
}

func within(t *testing.T, ch <-chan waitResult, d time.Duration, what string) waitResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(d):
		t.Fatalf("%s: no answer within %v", what, d)
		return waitResult{}
	}
}

// TestWaitingAcquiresAreServedInArrivalOrder: six acquires of one user
// queued through three limiters (replicas) get the one slot in the order
// they came, each as the one before it releases. The poll is an hour:
// only wake-ups can serve them in time.
func TestWaitingAcquiresAreServedInArrivalOrder(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lims := replicas(t, b, 3, time.Hour)
		user := newUser(t)
		hold(t, lims[0], user, "wait", "holder")
		var waiting []<-chan waitResult
		for i := range 6 {
			waiting = append(waiting, startWaiting(t, context.Background(), lims[i%len(lims)], user, "wait", fmt.Sprintf("w%d", i), 5*time.Second, i+1))
		}
		prev, prevLim := "holder", lims[0]
		for i, ch := range waiting {
			release(t, prevLim, user, prev)
			r := within(t, ch, 2*time.Second, fmt.Sprintf("w%d after %s released", i, prev))
			if r.err != nil || !r.res.Granted || r.res.Degraded || r.res.StreamID != fmt.Sprintf("w%d", i) || r.res.Waited <= 0 || r.res.Used != 1 {
				t.Fatalf("w%d: %+v, %v; want granted, counted, after a wait", i, r.res, r.err)
			}
			for _, later := range waiting[i+1:] {
				select {
				case r := <-later:
					t.Fatalf("%s answered before its turn: %+v, %v", r.res.StreamID, r.res, r.err)
				default:
				}
			}
			prev, prevLim = r.res.StreamID, lims[i%len(lims)]
		}
	})
}

// TestAUsersQueueServesAHigherPriorityPlanFirst: one user's acquires
// under two plans wait in the user's queue; the later one's plan has the
// higher priority (5), and it is served first, as in a pool key's queue
// (DESIGN §17; within one plan, arrival decides), then the earlier one.
func TestAUsersQueueServesAHigherPriorityPlanFirst(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lim := replicas(t, b, 1, time.Hour)[0]
		user := newUser(t)
		hold(t, lim, user, "wait", "holder")
		low := startWaiting(t, context.Background(), lim, user, "wait", "w-low", 5*time.Second, 1)
		high := startWaiting(t, context.Background(), lim, user, "wait-high", "w-high", 5*time.Second, 1)
		release(t, lim, user, "holder")
		if r := within(t, high, 2*time.Second, "w-high after the holder released"); r.err != nil || !r.res.Granted {
			t.Fatalf("w-high, priority 5, queued after w-low: %+v, %v; want granted first", r.res, r.err)
		}
		select {
		case r := <-low:
			t.Fatalf("w-low, priority 0, answered before w-high released: %+v, %v", r.res, r.err)
		default:
		}
		release(t, lim, user, "w-high")
		if r := within(t, low, 2*time.Second, "w-low after w-high released"); r.err != nil || !r.res.Granted {
			t.Fatalf("w-low: %+v, %v; want granted next", r.res, r.err)
		}
	})
}

// TestAWaitThatRunsOutIsADenial: the request's wait, capped by the
// plan's maxWait, runs out as a denial with the usual Retry-After, and the
// ticket leaves the queue. OnWait is told the capped wait before the wait
// starts, and is not called for an acquire granted at once.
func TestAWaitThatRunsOutIsADenial(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lim := replicas(t, b, 1, 0)[0]
		user := newUser(t)
		var told []time.Duration
		onWait := func(d time.Duration) { told = append(told, d) }
		if res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "short-wait", StreamID: "holder",
			Wait: 30 * time.Second, OnWait: onWait}); err != nil || !res.Granted || res.Waited != 0 {
			t.Fatalf("Acquire of a free slot = %+v, %v; want granted at once", res, err)
		}
		if len(told) != 0 {
			t.Fatalf("OnWait of an acquire granted at once: called with %v, want not called", told)
		}
		start := time.Now()
		// 30s asked, 300ms allowed.
		res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "short-wait", Wait: 30 * time.Second, OnWait: onWait})
		took := time.Since(start)
		if err != nil || res.Granted || res.Used != 1 || res.RetryAfter <= 0 {
			t.Fatalf("Acquire = %+v, %v; want denied with used 1 and a retry-after", res, err)
		}
		if res.Waited < 300*time.Millisecond || took > 5*time.Second {
			t.Errorf("waited %v (returned after %v), want the plan's 300ms, not the 30s asked", res.Waited, took)
		}
		if len(told) != 1 || told[0] != 300*time.Millisecond {
			t.Errorf("OnWait: called with %v, want once with the plan's 300ms", told)
		}
		awaitQueue(t, lim, user, func(q []limiter.Ticket) bool { return len(q) == 0 }, "empty")
	})
}

// TestARetryThatRunsOutBesideItsStreamsOtherWaiterSaysWhenToComeBack:
// two requests of one stream (a client's retry) wait on one replica; the
// one whose wait is shorter runs out while the other waits on, and its
// denial says when to come back, as a lone waiter's does: when the held
// slot expires (10s), not 0.
func TestARetryThatRunsOutBesideItsStreamsOtherWaiterSaysWhenToComeBack(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lim := replicas(t, b, 1, 0)[0]
		ctx := context.Background()
		user := newUser(t)
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "holder"}); err != nil || !res.Granted {
			t.Fatalf("Acquire of a free slot = %+v, %v", res, err)
		}
		long := make(chan error, 1)
		go func() {
			_, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "s", Wait: 3 * time.Second})
			long <- err
		}()
		awaitQueue(t, lim, user, func(q []limiter.Ticket) bool { return len(q) == 1 }, "the first request queued")
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "s", Wait: 300 * time.Millisecond})
		if err != nil || res.Granted || res.Used != 1 {
			t.Fatalf("the retry's Acquire = %+v, %v; want denied, used 1", res, err)
		}
		if res.RetryAfter < 5*time.Second || res.RetryAfter > 10*time.Second {
			t.Errorf("the retry's denial: RetryAfter %v; want about 10s, until the held slot expires", res.RetryAfter)
		}
		if got, err := lim.Slots(ctx, user); err != nil || len(got.Queue) != 1 {
			t.Errorf("the queue after the retry ran out: %+v, %v; want the stream's ticket, for the first request", got.Queue, err)
		}
		if err := <-long; err != nil {
			t.Errorf("the first request: %v", err)
		}
	})
}

// TestNoWaitPlansAnswerAtOnce: on a plan without maxWait, an acquire that
// asks to wait is denied at once and queues nothing.
func TestNoWaitPlansAnswerAtOnce(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lim := replicas(t, b, 1, 0)[0]
		user := newUser(t)
		hold(t, lim, user, "no-wait", "holder")
		called := false
		res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "no-wait", Wait: 5 * time.Second,
			OnWait: func(time.Duration) { called = true }})
		if err != nil || res.Granted || res.Waited != 0 || called {
			t.Fatalf("Acquire = %+v, %v (OnWait called: %v); want denied without waiting", res, err, called)
		}
		got, err := lim.Slots(context.Background(), user)
		if err != nil || len(got.Queue) != 0 {
			t.Errorf("queue = %+v, %v; want empty", got.Queue, err)
		}
	})
}

// TestAWaiterThatLeavesLeavesTheQueueAtOnce: the caller's context ends
// while it waits; the acquire returns its error and the ticket is gone,
// so the next waiter moves up at once.
func TestAWaiterThatLeavesLeavesTheQueueAtOnce(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lims := replicas(t, b, 2, time.Hour)
		user := newUser(t)
		hold(t, lims[0], user, "wait", "holder")
		ctx, cancel := context.WithCancel(context.Background())
		first := startWaiting(t, ctx, lims[0], user, "wait", "first", 5*time.Second, 1)
		second := startWaiting(t, context.Background(), lims[1%len(lims)], user, "wait", "second", 5*time.Second, 2)
		cancel()
		r := within(t, first, time.Second, "the waiter that left")
		if !errors.Is(r.err, context.Canceled) || r.res.Granted {
			t.Fatalf("the waiter that left: %+v, %v; want context.Canceled", r.res, r.err)
		}
		awaitQueue(t, lims[0], user, func(q []limiter.Ticket) bool { return len(q) == 1 && q[0].StreamID == "second" }, "second alone, first")
		release(t, lims[0], user, "holder")
		if r := within(t, second, 2*time.Second, "second"); r.err != nil || !r.res.Granted {
			t.Fatalf("second: %+v, %v; want granted", r.res, r.err)
		}
	})
}

// TestAWaiterWhoseServerDiedIsSkipped: a ticket nobody refreshes (its
// server died) stops counting at its expiry, and the acquire behind it is
// served then, with no wake-up and no poll.
func TestAWaiterWhoseServerDiedIsSkipped(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		s := replicaStacks(t, b, 1, time.Hour)[0]
		user := newUser(t)
		hold(t, s.Limiter, user, "wait", "holder")
		dead := time.Now()
		queueByHand(t, s, user, "dead", 1, time.Second)
		alive := startWaiting(t, context.Background(), s.Limiter, user, "wait", "alive", 5*time.Second, 2)
		release(t, s.Limiter, user, "holder")
		r := within(t, alive, 3*time.Second, "the waiter behind the dead one")
		if r.err != nil || !r.res.Granted {
			t.Fatalf("alive: %+v, %v; want granted", r.res, r.err)
		}
		// Redis keeps expiries in whole milliseconds from its own clock: a
		// ticket queued at x.7 ms is dead at x+1000 ms, up to 1 ms before
		// a full second by this process's clock.
		if after := r.at.Sub(dead); after < time.Second-time.Millisecond || after > 2*time.Second {
			t.Errorf("alive granted %v after the dead ticket was queued, want once its 1s ran out (±1 ms, the resolution of an expiry)", after)
		}
	})
}

// TestAnOutageWhileWaitingAppliesTheFailureMode: Redis stops answering
// while acquires wait: an Open plan grants them degraded, a Closed plan
// refuses them with ErrUnavailable.
func TestAnOutageWhileWaitingAppliesTheFailureMode(t *testing.T) {
	t.Parallel()
	proxy := testenv.StartProxy(t, testenv.Redis(t))
	s := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}}, Tiers: waitTiers()})
	user := newUser(t)
	hold(t, s.Limiter, user, "wait", "open-holder")
	other := newUser(t)
	hold(t, s.Limiter, other, "wait-closed", "closed-holder")
	open := startWaiting(t, context.Background(), s.Limiter, user, "wait", "open", 5*time.Second, 1)
	closed := startWaiting(t, context.Background(), s.Limiter, other, "wait-closed", "closed", 5*time.Second, 1)
	proxy.BlackHole()
	if r := within(t, open, 3*time.Second, "the Open waiter"); r.err != nil || !r.res.Granted || !r.res.Degraded || !r.res.SlotDegraded {
		t.Errorf("Open waiter during the outage: %+v, %v; want granted degraded, its own slot", r.res, r.err)
	}
	if r := within(t, closed, 3*time.Second, "the Closed waiter"); !errors.Is(r.err, limiter.ErrUnavailable) {
		t.Errorf("Closed waiter during the outage: %+v, %v; want ErrUnavailable", r.res, r.err)
	}
}

// TestAnOutageWhileWaitingAppliesThePoolsFailureModes: a waiting acquire
// of an Open plan whose wait Redis stops answering is granted degraded
// only if each pool it names lets a degraded stream in, as one that did
// not wait: a pool failing closed refuses it (its key full besides), one
// failing open grants it a degraded membership.
func TestAnOutageWhileWaitingAppliesThePoolsFailureModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []tiers.FailureMode{tiers.FailClosed, tiers.FailOpen} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			proxy := testenv.StartProxy(t, testenv.Redis(t))
			table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), FailureMode: mode})
			s := limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 250 * time.Millisecond},
				Tiers: waitTiers(), Limiter: limiter.Options{Pools: table, WaitPoll: 50 * time.Millisecond}})
			pooled := map[string]string{"model": "k"}
			if res, err := s.Limiter.Acquire(context.Background(), limiter.AcquireRequest{UserID: newUser(t), Plan: "wait", Pools: pooled}); err != nil || !res.Granted {
				t.Fatalf("another user's stream of model=k: %+v, %v", res, err)
			}
			user := newUser(t)
			hold(t, s.Limiter, user, "wait", "held")
			done := make(chan waitResult, 1)
			go func() {
				res, err := s.Limiter.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "wait", Wait: 3 * time.Second, Pools: pooled})
				done <- waitResult{res, err, time.Now()}
			}()
			awaitQueue(t, s.Limiter, user, func(q []limiter.Ticket) bool { return len(q) == 1 }, "the pooled acquire waiting")
			proxy.BlackHole()
			r := within(t, done, 5*time.Second, "the waiter")
			var closed *limiter.PoolUnavailableError
			switch {
			case mode == tiers.FailClosed && (!errors.As(r.err, &closed) || closed.Pool != "model" || r.res.Granted):
				t.Errorf("the waiter, model failing closed: %+v, %v; want refused by model (PoolUnavailableError)", r.res, r.err)
			case mode == tiers.FailOpen && (r.err != nil || !r.res.Granted || !r.res.Degraded || len(r.res.Pools) != 1 || !r.res.Pools[0].Degraded):
				t.Errorf("the waiter, model failing open: %+v, %v; want granted degraded, its membership of model=k degraded", r.res, r.err)
			}
		})
	}
}

// TestAnotherCallersWaitForAStreamIDIsRefusedOnTheSameServer: a waiting
// acquire's place in the queue is its caller's alone (DESIGN §19). chat
// waits for stream w; ops's acquire of w waiting on the same server is
// refused ErrNotSlotHolder at once, as another server's script refuses
// it, rather than granted the slot chat's ticket gets (its record naming
// chat: ops could neither beat nor release it). chat's own retry of the
// acquire waits beside the first and shares its slot.
func TestAnotherCallersWaitForAStreamIDIsRefusedOnTheSameServer(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		lim := replicas(t, b, 1, time.Hour)[0]
		ctx := context.Background()
		user := newUser(t)
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "h", Caller: "chat"}); err != nil || !res.Granted {
			t.Fatalf("chat's h: %+v, %v", res, err)
		}
		waitAs := func(caller string) <-chan waitResult {
			done := make(chan waitResult, 1)
			go func() {
				res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "w", Caller: caller, Wait: 5 * time.Second})
				done <- waitResult{res, err, time.Now()}
			}()
			return done
		}
		chat := waitAs("chat")
		awaitQueue(t, lim, user, func(q []limiter.Ticket) bool { return len(q) == 1 && q[0].StreamID == "w" }, "chat's w queued")
		ops := waitAs("ops")
		if r := within(t, ops, 2*time.Second, "ops's acquire of chat's waiting w"); !errors.Is(r.err, limiter.ErrNotSlotHolder) || r.res.Granted {
			t.Fatalf("ops's acquire of chat's waiting w: %+v, %v; want ErrNotSlotHolder", r.res, r.err)
		}
		retry := waitAs("chat")
		time.Sleep(100 * time.Millisecond) // the retry joins the wait
		if res, err := lim.ReleaseAs(ctx, "chat", user, "h"); err != nil || !res.Released {
			t.Fatalf("chat's release of h: %+v, %v", res, err)
		}
		for _, ch := range []<-chan waitResult{chat, retry} {
			if r := within(t, ch, 2*time.Second, "chat's w"); r.err != nil || !r.res.Granted {
				t.Fatalf("chat's w: %+v, %v; want granted", r.res, r.err)
			}
		}
		slots, err := lim.Slots(ctx, user)
		if err != nil || slots.Used != 1 || slots.Slots[0].StreamID != "w" || slots.Slots[0].Caller != "chat" {
			t.Fatalf("slots: %+v, %v; want w alone, chat's", slots, err)
		}
	})
}

// TestANamedCallerWaitingBehindAnOpenRequestIsRefusedAnotherCallersStream:
// chat waits for stream w on one replica; on another, an open request
// (no caller: nobody's) waits for w, then ops. The call there sends one
// ticket for w, now with ops's record, which chat's ticket refuses: ops
// is answered ErrNotSlotHolder, as when it waits alone, rather than
// riding the open request's record into chat's stream. The open request
// is not refused: it shares w with chat once the slot frees.
func TestANamedCallerWaitingBehindAnOpenRequestIsRefusedAnotherCallersStream(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			lims := replicas(t, b, 2, time.Hour)
			ctx := context.Background()
			user := newUser(t)
			hold(t, lims[0], user, "wait", "h")
			waitAs := func(lim *limiter.Limiter, caller string) <-chan waitResult {
				done := make(chan waitResult, 1)
				go func() {
					res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "wait", StreamID: "w", Caller: caller, Wait: 4 * time.Second})
					done <- waitResult{res, err, time.Now()}
				}()
				return done
			}
			chat := waitAs(lims[1], "chat")
			awaitQueue(t, lims[0], user, func(q []limiter.Ticket) bool { return len(q) == 1 && q[0].StreamID == "w" }, "chat's w queued")
			open := waitAs(lims[0], "")
			time.Sleep(200 * time.Millisecond) // the open request's wait joins the loop
			ops := waitAs(lims[0], "ops")
			if r := within(t, ops, 3*time.Second, "ops's wait for chat's w"); !errors.Is(r.err, limiter.ErrNotSlotHolder) || r.res.Granted {
				t.Fatalf("ops's wait for chat's waiting w: %+v, %v; want ErrNotSlotHolder", r.res, r.err)
			}
			release(t, lims[0], user, "h")
			for _, ch := range []<-chan waitResult{chat, open} {
				if r := within(t, ch, 3*time.Second, "w's waiters"); r.err != nil || !r.res.Granted {
					t.Fatalf("w's waiter: %+v, %v; want granted", r.res, r.err)
				}
			}
			if slots, err := lims[0].Slots(ctx, user); err != nil || slots.Used != 1 || slots.Slots[0].StreamID != "w" {
				t.Fatalf("slots: %+v, %v; want w alone", slots, err)
			}
		})
	}
}
