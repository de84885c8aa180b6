package limiter_test

import (
	"context"
	"fmt"
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

// shadowStack is a limiter whose plan shadow (limit 1, maxWait 5s) and
// pool model (big capped at 1) are in shadow mode, beside plan strict
// (limit 1, maxWait 5s) and pool org (acme capped at 1), which enforce.
func shadowStack(t *testing.T, b limitertest.Backend) *limiter.Limiter {
	t.Helper()
	off := false
	table := poolTable(t,
		pools.Pool{Pool: "model", Keys: map[string]int{"big": 1}, MaxWait: 5 * time.Second, Enforce: &off},
		pools.Pool{Pool: "org", Keys: map[string]int{"acme": 1}},
	)
	return limitertest.New(t, limitertest.Options{Backend: b, Tiers: []tiers.Tier{
		tiers.Tier{Plan: "shadow", MaxConcurrentStreams: 1, MaxWait: 5 * time.Second, Enforce: &off}.WithDefaults(),
		tiers.Tier{Plan: "strict", MaxConcurrentStreams: 1, MaxWait: 5 * time.Second}.WithDefaults(),
	}, Limiter: limiter.Options{Pools: table}}).Limiter
}

// A plan in shadow mode grants over its limit at once, even when asked to
// wait, and says what it would have refused; used counts every stream.
func TestAShadowPlanGrantsAndSaysWhatItWouldRefuse(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			lim := shadowStack(t, b)
			ctx := context.Background()
			user := "shadow-" + time.Now().Format("150405.000000")
			first, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "shadow"})
			if err != nil || !first.Granted || first.WouldRefuse != "" {
				t.Fatalf("the first stream: %+v, %v; want granted, nothing it would refuse", first, err)
			}
			for n := 2; n <= 3; n++ {
				start := time.Now()
				res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "shadow", Wait: 5 * time.Second})
				if err != nil || !res.Granted || res.WouldRefuse != limiter.CodeStreamLimitReached || res.Used != n || res.Limit != 1 || res.Waited != 0 {
					t.Fatalf("stream %d over a limit of 1 in shadow: %+v, %v; want granted, would_refuse stream_limit_reached, used %d of 1, not waited", n, res, err, n)
				}
				if took := time.Since(start); took > time.Second {
					t.Errorf("stream %d took %s: a shadow scope never waits", n, took)
				}
			}
			slots, err := lim.Slots(ctx, user)
			if err != nil || slots.Used != 3 {
				t.Errorf("Slots: used %d (%v); want the 3 live streams, above the limit", slots.Used, err)
			}

			strict := user + "-strict"
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: strict, Plan: "strict"}); err != nil || !res.Granted {
				t.Fatalf("strict's first: %+v, %v", res, err)
			}
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: strict, Plan: "strict"}); err != nil || res.Granted || res.WouldRefuse != "" {
				t.Errorf("strict's second: %+v, %v; want refused, the plan enforces", res, err)
			}
		})
	}
}

// A pool in shadow mode lets a stream join a full key, saying which; a
// pool that enforces still refuses.
func TestAShadowPoolGrantsAndNamesTheKey(t *testing.T) {
	lim := shadowStack(t, limitertest.RedisCluster)
	ctx := context.Background()
	run := time.Now().Format("150405.000000")
	join := func(user string, pools map[string]string) limiter.AcquireResult {
		t.Helper()
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user + run, Plan: "strict", Pools: pools, Wait: 5 * time.Second})
		if err != nil {
			t.Fatalf("%s: %v", user, err)
		}
		return res
	}
	if res := join("ana", map[string]string{"model": "big"}); !res.Granted || res.WouldRefuse != "" {
		t.Fatalf("ana on big: %+v; want granted", res)
	}
	res := join("bo", map[string]string{"model": "big", "org": "acme"})
	if !res.Granted || res.WouldRefuse != limiter.CodePoolLimitReached || res.WouldRefuseBy == nil ||
		*res.WouldRefuseBy != (limiter.PoolRefusal{Pool: "model", Key: "big", Used: 2, Limit: 1}) || res.Waited != 0 {
		t.Fatalf("bo on a full big: %+v (by %+v); want granted at once, would_refuse pool_limit_reached by model=big, 2 of 1", res, res.WouldRefuseBy)
	}
	if len(res.Pools) != 2 || !res.Pools[0].WouldRefuse && !res.Pools[1].WouldRefuse {
		t.Errorf("bo's pools %+v; want both joined, big marked", res.Pools)
	}
	if res := join("cy", map[string]string{"org": "acme"}); res.Granted || res.RefusedBy == nil || res.RefusedBy.Pool != "org" {
		t.Errorf("cy on a full acme: %+v; want refused by org=acme, which enforces", res)
	}
	key, err := lim.PoolSlots(ctx, "model", "big")
	if err != nil || key.Used != 2 {
		t.Errorf("model=big: used %d (%v); want the 2 live members, above its cap", key.Used, err)
	}
}

// TestAPlansNewBoundsHoldForItsWaiters: the acquires queued in a user's
// own queue are judged by their plan as it is now, not as it was when
// they queued. Switched to shadow mode (which refuses none, DESIGN §18),
// the plan grants its waiter a slot beside the holder, counted; its limit
// raised from 1 to 2, the waiter is granted at once, not refused at the
// end of its wait while the user has room; lowered from 2 to 1, a slot
// freed (1 held, the new limit) lets no waiter in, and the next does.
func TestAPlansNewBoundsHoldForItsWaiters(t *testing.T) {
	t.Parallel()
	off := false
	plan := func(limit int, enforce *bool) tiers.Tier {
		return tiers.Tier{Plan: "p", MaxConcurrentStreams: limit, MaxWait: 10 * time.Second, Enforce: enforce}.WithDefaults()
	}
	for name, c := range map[string]struct {
		from, to    tiers.Tier
		limit       int
		wouldRefuse string
	}{
		"shadow":  {plan(1, nil), plan(1, &off), 1, limiter.CodeStreamLimitReached},
		"raised":  {plan(1, nil), plan(2, nil), 2, ""},
		"lowered": {plan(2, nil), plan(1, nil), 1, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			log := newCallLog()
			s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
				Tiers: []tiers.Tier{c.from}, Limiter: limiter.Options{Observer: log, WaitPoll: 20 * time.Millisecond, TicketTTL: 1500 * time.Millisecond}})
			ctx := context.Background()
			user := newUser(t)
			key, err := s.Keys.UserKey(user)
			if err != nil {
				t.Fatal(err)
			}
			var held []string
			for i := range c.from.MaxConcurrentStreams {
				held = append(held, fmt.Sprintf("holder-%d", i))
				mustAcquireUser(t, s.Limiter, user, "p", held[i])
			}
			q := queueUser(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "p", StreamID: "waiter"}, key)
			if err := s.Table.Replace([]tiers.Tier{c.to}); err != nil {
				t.Fatal(err)
			}
			if name == "lowered" {
				// A round of the queue's loop reads the plan as it starts:
				// one that started before the change may grant by the old
				// limit once the slot below frees. A round makes at most
				// two calls (a look, then the wait), so three ended since
				// the change mean that round is over.
				rounds := func() int { return log.count("wait") + log.count("wait_poll") }
				for since, deadline := rounds(), time.Now().Add(5*time.Second); rounds() < since+3; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the waiter's loop made %d calls in 5s since the plan changed; want 3 (a refresh every 500ms)", rounds()-since)
					}
				}
				// One released: 1 held, the new limit. Then the other.
				release := func() {
					t.Helper()
					if _, err := s.Limiter.Release(ctx, user, held[len(held)-1]); err != nil {
						t.Fatal(err)
					}
					held = held[:len(held)-1]
				}
				release()
				if a, ok := q.answer(time.Second); ok {
					t.Fatalf("the waiter with 1 held under the new limit of 1: %+v; want it still waiting", a)
				}
				release()
			}
			a, ok := q.answer(3 * time.Second)
			if !ok || a.err != nil || !a.res.Granted {
				t.Fatalf("the waiter once the plan is %s: %+v (answered %v); want granted within 3s", name, a, ok)
			}
			want := len(held) + 1
			if a.res.Used != want || a.res.Limit != c.limit || a.res.WouldRefuse != c.wouldRefuse {
				t.Errorf("the waiter's grant: used %d of %d, would refuse %q; want %d of %d, would refuse %q",
					a.res.Used, a.res.Limit, a.res.WouldRefuse, want, c.limit, c.wouldRefuse)
			}
			if slots, err := s.Limiter.Slots(ctx, user); err != nil || slots.Used != want {
				t.Errorf("the user holds %+v (%v); want %d, the holders and the waiter", slots, err, want)
			}
		})
	}
}

// A plan switched to shadow mode lets in the user's waiter that queued
// while a support override of the user's limit (1) held it, as it lets in
// a new stream at once: shadow mode refuses nothing, overrides included.
func TestAPlanInShadowModeLetsInTheWaitersAnOverrideHeld(t *testing.T) {
	t.Parallel()
	plan := func(enforce bool) []tiers.Tier {
		return []tiers.Tier{tiers.Tier{Plan: "p", MaxConcurrentStreams: 5, MaxWait: 10 * time.Second, Enforce: &enforce}.WithDefaults()}
	}
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second}, Tiers: plan(true)})
	ctx := context.Background()
	user := newUser(t)
	if _, err := s.Limiter.SetOverride(ctx, user, limiter.OverrideRequest{MaxConcurrentStreams: 1, For: time.Hour, Actor: "test", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "p"}); err != nil || !res.Granted {
		t.Fatalf("the first stream: %+v, %v", res, err)
	}
	userKey, err := s.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	q := startQueued(t, ctx, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "p"}, 5*time.Second, func() int64 { return zcard(t, s, keys.Queue(userKey)) })
	if err := s.Table.Replace(plan(false)); err != nil {
		t.Fatal(err)
	}
	a, ok := q.answer(3 * time.Second)
	if !ok || a.err != nil || !a.res.Granted || a.res.WouldRefuse != limiter.CodeStreamLimitReached || a.res.Used != 2 || a.res.Limit != 1 {
		t.Fatalf("the waiter once the plan is in shadow mode: %+v, %v (answered %v); want granted within 3s, 2 of the override's 1, saying the limit would refuse it", a.res, a.err, ok)
	}
}

// TestAShadowScopeNeverRefusesInAnOutage: a scope in shadow mode refuses
// no one (DESIGN §18), in an outage too: one that fails Closed (set so
// ahead of turning it on) grants degraded, as Open does, where it
// refused every stream with 503 limiter_unavailable while Redis did not
// answer, and none while it did; and its held streams' heartbeats answer
// degraded, not an error.
func TestAShadowScopeNeverRefusesInAnOutage(t *testing.T) {
	proxy := testenv.StartProxy(t, testenv.Redis(t))
	off := false
	table := poolTable(t, pools.Pool{Pool: "watch", MaxConcurrentStreams: ptr(1), FailureMode: tiers.FailClosed, Enforce: &off})
	lim := limitertest.New(t, limitertest.Options{
		Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 300 * time.Millisecond},
		Tiers: []tiers.Tier{
			tiers.Tier{Plan: "open", MaxConcurrentStreams: 1}.WithDefaults(),
			tiers.Tier{Plan: "shadowclosed", MaxConcurrentStreams: 1, FailureMode: tiers.FailClosed, Enforce: &off}.WithDefaults(),
		},
		Limiter: limiter.Options{Pools: table}}).Limiter
	ctx := context.Background()
	if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "open", Pools: map[string]string{"watch": "k"}}); err != nil || !res.Granted {
		t.Fatalf("before the outage: %+v, %v", res, err)
	}
	held := newUser(t)
	if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: held, Plan: "shadowclosed", StreamID: "s"}); err != nil || !res.Granted {
		t.Fatalf("before the outage: %+v, %v", res, err)
	}
	proxy.BlackHole()

	if beat, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: held, Plan: "shadowclosed", StreamID: "s"}); err != nil || !beat.Alive || !beat.Degraded {
		t.Errorf("a heartbeat of plan shadowclosed (shadow mode, failureMode Closed) in an outage: %+v, %v; want alive, degraded", beat, err)
	}

	res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "open", Pools: map[string]string{"watch": "k"}})
	if err != nil || !res.Granted || len(res.Pools) != 1 || !res.Pools[0].Degraded {
		t.Errorf("a stream joining pool watch (shadow mode, failureMode Closed) in an outage: %+v, %v; want granted (degraded): a pool in shadow mode refuses nothing", res, err)
	}
	res, err = lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "shadowclosed"})
	if err != nil || !res.Granted || !res.Degraded {
		t.Errorf("a stream of plan shadowclosed (shadow mode, failureMode Closed) in an outage: %+v, %v; want granted (degraded): a plan in shadow mode refuses nothing", res, err)
	}
}

// twoReplicas are two limiters on b sharing one key prefix, each with
// its own table of plans (ts, the stack's Table) and of pools (ps, the
// table returned beside it), so that a test can change a plan or a pool
// (shadow mode, removed) on one of them alone; opts as given (their Keys and Pools set
// here, the Observer the i-th of observers when there is one).
func twoReplicas(t *testing.T, b limitertest.Backend, ts []tiers.Tier, ps []pools.Pool, opts limiter.Options, observers ...limiter.Observer) ([2]*limitertest.Stack, [2]*pools.Table) {
	t.Helper()
	opts.Keys = keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	var stacks [2]*limitertest.Stack
	var tables [2]*pools.Table
	var addrs []string
	for i := range stacks {
		tables[i] = poolTable(t, ps...)
		o := opts
		o.Pools = tables[i]
		if i < len(observers) {
			o.Observer = observers[i]
		}
		stacks[i] = limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Addrs: addrs, Timeout: 5 * time.Second},
			Tiers: ts, Limiter: o})
		addrs = stacks[i].Redis.Addrs()
	}
	return stacks, tables
}

// TestAWaitInShadowModeIsNotRefusedByAFullQueue: a scope in shadow mode
// refuses nothing (DESIGN §18), a full queue included. The scope (plan
// one, limit 1, or pool key model=k, cap 1) is held, and its queue holds
// its most (MaxQueue 1: a waiter on replica 0, which enforces). An
// acquire on replica 1 is refused while replica 1 enforces too; as it is
// about to wait, replica 1 puts the scope in shadow mode. Its wait's
// first call runs under shadow mode: the acquire is granted, saying what
// the scope would have refused, not answered 429 for the full queue.
func TestAWaitInShadowModeIsNotRefusedByAFullQueue(t *testing.T) {
	t.Parallel()
	off := false
	one := tiers.Tier{Plan: "one", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()
	shadowOne := one
	shadowOne.Enforce = &off
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second}.WithDefaults()
	shadowModel := model
	shadowModel.Enforce = &off
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, scope := range []string{"plan", "pool"} {
			t.Run(b.String()+"/"+scope, func(t *testing.T) {
				t.Parallel()
				stacks, tables := twoReplicas(t, b, []tiers.Tier{one}, []pools.Pool{model}, limiter.Options{MaxQueue: 1})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var req limiter.AcquireRequest
				var shadow func() error
				wantRefuse := limiter.CodeStreamLimitReached
				if scope == "plan" {
					user := newUser(t)
					mustAcquireUser(t, stacks[0].Limiter, user, "one", "held")
					key, err := stacks[0].Keys.UserKey(user)
					if err != nil {
						t.Fatal(err)
					}
					queueUser(t, ctx, stacks[0], stacks[0].Limiter, limiter.AcquireRequest{UserID: user, Plan: "one", StreamID: "w"}, key)
					req = limiter.AcquireRequest{UserID: user, Plan: "one", StreamID: "a"}
					shadow = func() error { return stacks[1].Table.Replace([]tiers.Tier{shadowOne}) }
				} else {
					mustAcquire(t, stacks[0].Limiter, newUser(t), "one", "k")
					queue(t, ctx, stacks[0], stacks[0].Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "one", Pools: map[string]string{"model": "k"}}, 10*time.Second)
					req = limiter.AcquireRequest{UserID: newUser(t), Plan: "one", Pools: map[string]string{"model": "k"}}
					shadow = func() error { return tables[1].Replace([]pools.Pool{shadowModel}) }
					wantRefuse = limiter.CodePoolLimitReached
				}
				req.Wait = 5 * time.Second
				req.OnWait = func(time.Duration) {
					if err := shadow(); err != nil {
						t.Error(err)
					}
				}
				res, err := stacks[1].Limiter.Acquire(ctx, req)
				if err != nil || !res.Granted || res.WouldRefuse != wantRefuse {
					t.Errorf("the acquire whose wait runs under shadow mode: granted %v, would refuse %q, refused by %+v, queue full %v, err %v; want granted, would refuse %s",
						res.Granted, res.WouldRefuse, res.RefusedBy, res.QueueFull, err, wantRefuse)
				}
			})
		}
	}
}

// joinLog counts the pool steps of acquires by outcome.
type joinLog struct {
	*reclaimLog
	mu    sync.Mutex
	joins map[limiter.JoinOutcome]int
}

func newJoinLog() *joinLog {
	return &joinLog{reclaimLog: &reclaimLog{plans: map[string]int{}, pools: map[string]int{}}, joins: map[limiter.JoinOutcome]int{}}
}

func (j *joinLog) Joined(_ context.Context, _ string, o limiter.JoinOutcome, _, _ int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.joins[o]++
}

func (j *joinLog) count(o limiter.JoinOutcome) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.joins[o]
}

// TestAnExtendedPoolWaitGrantInShadowModeIsCountedOnce: request A of
// stream s waits for model=k (cap 1, held by another user) on replica 0.
// Request B of the same stream, on replica 1, whose pool is in shadow
// mode already, joins the key over its cap: would_refuse, counted once.
// Replica 0 then puts the pool in shadow mode, and A's wait is granted by
// extending B's membership. An extension adds no member and is never
// refused: as an acquire of a held stream, it answers the verdict on the
// acquire that took the membership (B's would_refuse, which its record
// keeps), and is not counted again.
func TestAnExtendedPoolWaitGrantInShadowModeIsCountedOnce(t *testing.T) {
	t.Parallel()
	off := false
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second}.WithDefaults()
	shadow := model
	shadow.Enforce = &off
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			logs := [2]*joinLog{newJoinLog(), newJoinLog()}
			stacks, tables := twoReplicas(t, b, poolWaitTiers(), []pools.Pool{model}, limiter.Options{}, logs[0], logs[1])
			if err := tables[1].Replace([]pools.Pool{shadow}); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			mustAcquire(t, stacks[0].Limiter, newUser(t), "low", "k")
			user := newUser(t)
			req := limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "s", Pools: map[string]string{"model": "k"}}
			a := queue(t, ctx, stacks[0], stacks[0].Limiter, req, 8*time.Second)
			res, err := stacks[1].Limiter.Acquire(ctx, req)
			if err != nil || !res.Granted || res.WouldRefuse != limiter.CodePoolLimitReached {
				t.Fatalf("B on the replica in shadow mode: %+v, %v; want granted, would refuse pool_limit_reached", res, err)
			}
			if err := tables[0].Replace([]pools.Pool{shadow}); err != nil {
				t.Fatal(err)
			}
			got, ok := a.answer(3 * time.Second)
			if !ok || got.err != nil || !got.res.Granted {
				t.Fatalf("A once replica 0 is in shadow mode: %+v, %v (answered %v); want granted", got.res, got.err, ok)
			}
			if key, err := stacks[0].Limiter.PoolSlots(ctx, "model", "k"); err != nil || key.Used != 2 {
				t.Fatalf("model=k: %+v, %v; want 2 members (the holder and s)", key, err)
			}
			if got.res.WouldRefuse != limiter.CodePoolLimitReached || got.res.WouldRefuseBy == nil || got.res.WouldRefuseBy.Key != "k" ||
				len(got.res.Pools) != 1 || !got.res.Pools[0].WouldRefuse {
				t.Errorf("A, granted by extending B's membership: would refuse %q by %+v, pools %+v; want B's verdict, pool_limit_reached by model=k",
					got.res.WouldRefuse, got.res.WouldRefuseBy, got.res.Pools)
			}
			if n := logs[0].count(limiter.JoinShadowRefused) + logs[1].count(limiter.JoinShadowRefused); n != 1 {
				t.Errorf("pool steps counted shadow_refused: %d (replica 0 %d, replica 1 %d); want 1, B's: one member over the cap",
					n, logs[0].count(limiter.JoinShadowRefused), logs[1].count(limiter.JoinShadowRefused))
			}
		})
	}
}

// TestWaitersGrantedTogetherInShadowModeAreJudgedOneByOne: a scope (plan
// p, limit 2, or pool key model=k, cap 2) is held twice, and two
// acquires wait for it on one replica. One holding goes without a
// wake-up (as one that expired does, for the next call to prune), and
// the scope is put in shadow mode: the loop's next call grants both
// waiters. The first takes the free place (2 of 2, within the limit); the
// second alone is over it (3 of 2): one would_refuse, not two, and each
// answer's used is the count as it was granted.
func TestWaitersGrantedTogetherInShadowModeAreJudgedOneByOne(t *testing.T) {
	t.Parallel()
	off := false
	p := tiers.Tier{Plan: "p", MaxConcurrentStreams: 2, MaxWait: 10 * time.Second}.WithDefaults()
	shadowP := p
	shadowP.Enforce = &off
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), MaxWait: 10 * time.Second}.WithDefaults()
	shadowModel := model
	shadowModel.Enforce = &off
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, scope := range []string{"plan", "pool"} {
			t.Run(b.String()+"/"+scope, func(t *testing.T) {
				t.Parallel()
				log := newJoinLog()
				stacks, tables := twoReplicas(t, b, []tiers.Tier{p}, []pools.Pool{model}, limiter.Options{}, log)
				s := stacks[0]
				ctx := context.Background()
				c, err := s.Redis.Redis()
				if err != nil {
					t.Fatal(err)
				}
				var waiters [2]*queued
				var free func() error
				var shadow func() error
				wantRefuse := limiter.CodeStreamLimitReached
				if scope == "plan" {
					user := newUser(t)
					mustAcquireUser(t, s.Limiter, user, "p", "x")
					mustAcquireUser(t, s.Limiter, user, "p", "y")
					key, err := s.Keys.UserKey(user)
					if err != nil {
						t.Fatal(err)
					}
					for i := range waiters {
						waiters[i] = queueUser(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "p", StreamID: fmt.Sprintf("w%d", i+1)}, key)
					}
					free = func() error { return c.Do(ctx, c.B().Zrem().Key(key).Member("y").Build()).Error() }
					shadow = func() error { return s.Table.Replace([]tiers.Tier{shadowP}) }
				} else {
					mustAcquire(t, s.Limiter, newUser(t), "p", "k")
					y := newUser(t)
					held := mustAcquire(t, s.Limiter, y, "p", "k")
					for i := range waiters {
						waiters[i] = queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "p", Pools: map[string]string{"model": "k"}}, 8*time.Second)
					}
					slots, err := s.Keys.PoolKey("model", "k")
					if err != nil {
						t.Fatal(err)
					}
					free = func() error { return c.Do(ctx, c.B().Zrem().Key(slots).Member(held.StreamID+" "+y).Build()).Error() }
					shadow = func() error { return tables[0].Replace([]pools.Pool{shadowModel}) }
					wantRefuse = limiter.CodePoolLimitReached
				}
				before := log.count(limiter.JoinShadowRefused)
				if err := free(); err != nil {
					t.Fatal(err)
				}
				if err := shadow(); err != nil {
					t.Fatal(err)
				}
				var refusing []int
				for i, w := range waiters {
					a, ok := w.answer(3 * time.Second)
					if !ok || a.err != nil || !a.res.Granted {
						t.Fatalf("waiter %d: %+v, %v (answered %v); want granted", i+1, a.res, a.err, ok)
					}
					used, limit := a.res.Used, a.res.Limit
					if scope == "pool" && len(a.res.Pools) == 1 {
						used, limit = a.res.Pools[0].Used, a.res.Pools[0].Limit
					}
					if a.res.WouldRefuse != "" {
						refusing = append(refusing, i+1)
						if a.res.WouldRefuse != wantRefuse || used != 3 || limit != 2 {
							t.Errorf("waiter %d: would refuse %q, used %d of %d; want %s, 3 of 2", i+1, a.res.WouldRefuse, used, limit, wantRefuse)
						}
					} else if used != 2 || limit != 2 {
						t.Errorf("waiter %d, not over the limit: used %d of %d; want 2 of 2, the free place", i+1, used, limit)
					}
				}
				if len(refusing) != 1 {
					t.Errorf("waiters answered would_refuse: %v; want one: the first grant filled the free place (2 of 2)", refusing)
				}
				if n := log.count(limiter.JoinShadowRefused) - before; scope == "pool" && n != 1 {
					t.Errorf("pool steps counted shadow_refused: %d; want 1", n)
				}
			})
		}
	}
}

// TestAWaitedShadowGrantsVerdictReachesItsRetry: stream w waits for a
// scope at its limit (plan p, limit 1, held; or pool key model=k, cap 1,
// held by another user), which is put in shadow mode while it waits:
// the loop grants it over the limit, would_refuse. The slot's (or
// membership's) record keeps that verdict, as an acquire's does, so the
// same stream asked again (its first answer lost) is an extension that
// answers it too (docs/api.md#shadow-grants), not one within the limit.
func TestAWaitedShadowGrantsVerdictReachesItsRetry(t *testing.T) {
	t.Parallel()
	off := false
	p := tiers.Tier{Plan: "p", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()
	shadowP := p
	shadowP.Enforce = &off
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second}.WithDefaults()
	shadowModel := model
	shadowModel.Enforce = &off
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		for _, scope := range []string{"plan", "pool"} {
			t.Run(b.String()+"/"+scope, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				user := newUser(t)
				var lim *limiter.Limiter
				var shadow func() error
				req := limiter.AcquireRequest{UserID: user, Plan: "p", StreamID: "w"}
				wantRefuse := limiter.CodeStreamLimitReached
				if scope == "plan" {
					s := limitertest.New(t, limitertest.Options{Backend: b, Tiers: []tiers.Tier{p}})
					lim, shadow = s.Limiter, func() error { return s.Table.Replace([]tiers.Tier{shadowP}) }
					mustAcquireUser(t, lim, user, "p", "held")
				} else {
					table := poolTable(t, model)
					s := limitertest.New(t, limitertest.Options{Backend: b, Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table}})
					lim, shadow = s.Limiter, func() error { return table.Replace([]pools.Pool{shadowModel}) }
					mustAcquire(t, lim, newUser(t), "low", "k")
					req.Plan, req.Pools = "low", map[string]string{"model": "k"}
					wantRefuse = limiter.CodePoolLimitReached
				}
				waited := req
				waited.Wait = 5 * time.Second
				waited.OnWait = func(time.Duration) {
					if err := shadow(); err != nil {
						t.Error(err)
					}
				}
				res, err := lim.Acquire(ctx, waited)
				if err != nil || !res.Granted || res.WouldRefuse != wantRefuse {
					t.Fatalf("w, waiting as the scope is put in shadow mode: %+v, %v; want granted, would refuse %s", res, err, wantRefuse)
				}
				again, err := lim.Acquire(ctx, req)
				if err != nil || !again.Granted || !again.Extended || again.WouldRefuse != wantRefuse {
					t.Errorf("w asked again (its first answer lost): granted %v, extended %v, would refuse %q, pools %+v, err %v; want extended, would refuse %s, as the first answer said",
						again.Granted, again.Extended, again.WouldRefuse, again.Pools, err, wantRefuse)
				}
			})
		}
	}
}
