package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// poolWaitTiers are plans that may wait 10s: low (priority 0) and high
// (priority 5), three streams per user; brief, whose slots live 300ms
// (heartbeats every 100ms).
func poolWaitTiers() []tiers.Tier {
	return []tiers.Tier{
		tiers.Tier{Plan: "low", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second}.WithDefaults(),
		tiers.Tier{Plan: "high", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second, Priority: 5}.WithDefaults(),
		tiers.Tier{Plan: "brief", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second, SlotTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond}.WithDefaults(),
	}
}

// waitPoolReplicas returns n limiters on b sharing one prefix, with
// waitTiers and the pool model: gpt-4o capped at 1, every other key at 2,
// a wait of up to 10s.
func waitPoolReplicas(t *testing.T, b limitertest.Backend, n int) []*limitertest.Stack {
	t.Helper()
	return replicasOf(t, b, n, poolWaitTiers(), poolTable(t,
		pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second},
	))
}

// replicasOf returns n limiters on b sharing one key prefix, the tiers ts
// (nil: limitertest's) and the pools of table.
func replicasOf(t *testing.T, b limitertest.Backend, n int, ts []tiers.Tier, table *pools.Table) []*limitertest.Stack {
	t.Helper()
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	var out []*limitertest.Stack
	var addrs []string
	for range n {
		s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Addrs: addrs, Timeout: 5 * time.Second},
			Tiers: ts, Limiter: limiter.Options{Keys: prefix, Pools: table}})
		addrs = s.Redis.Addrs()
		out = append(out, s)
	}
	return out
}

// queued is an acquire waiting in the background; done receives its
// answer.
type queued struct {
	done chan acquired
}

type acquired struct {
	res limiter.AcquireResult
	err error
}

// queue starts req on lim with wait and returns once its ticket is in the
// pool key's queue (of s's keys).
func queue(t *testing.T, ctx context.Context, s *limitertest.Stack, lim *limiter.Limiter, req limiter.AcquireRequest, wait time.Duration) *queued {
	t.Helper()
	return startQueued(t, ctx, lim, req, wait, func() int64 { return queueLength(t, s, req.Pools["model"]) })
}

// startQueued starts req on lim with wait and returns once length, the
// size of the queue it joins, has grown.
func startQueued(t *testing.T, ctx context.Context, lim *limiter.Limiter, req limiter.AcquireRequest, wait time.Duration, length func() int64) *queued {
	t.Helper()
	req.Wait = wait
	q := &queued{done: make(chan acquired, 1)}
	before := length()
	go func() {
		res, err := lim.Acquire(ctx, req)
		q.done <- acquired{res, err}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for length() <= before {
		if time.Now().After(deadline) {
			t.Fatalf("%s's acquire not queued within 5s", req.UserID)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return q
}

// queueLength is how many tickets wait for model=key.
func queueLength(t *testing.T, s *limitertest.Stack, key string) int64 {
	t.Helper()
	slots, err := s.Keys.PoolKey("model", key)
	if err != nil {
		t.Fatal(err)
	}
	return zcard(t, s, keys.Queue(slots))
}

// zcard is the size of the sorted set key on s's Redis.
func zcard(t *testing.T, s *limitertest.Stack, key string) int64 {
	t.Helper()
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.Do(context.Background(), c.B().Zcard().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// answer waits up to within for q's answer; ok false when none came.
func (q *queued) answer(within time.Duration) (acquired, bool) {
	select {
	case a := <-q.done:
		return a, true
	case <-time.After(within):
		return acquired{}, false
	}
}

func mustAcquire(t *testing.T, lim *limiter.Limiter, user, plan, model string) limiter.AcquireResult {
	t.Helper()
	res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan, Pools: map[string]string{"model": model}})
	if err != nil || !res.Granted || res.Degraded {
		t.Fatalf("%s's acquire of model=%s: %+v, %v; want granted", user, model, res, err)
	}
	return res
}

// TestAFullPoolKeyServesTheHigherPriorityFirst (DESIGN §17): model=gpt-4o
// (cap 1) held; a priority-0 acquire queues, then a priority-5 one on
// another replica; the release grants the priority-5 one first, and the
// next release the other.
func TestAFullPoolKeyServesTheHigherPriorityFirst(t *testing.T) {
	t.Parallel()
	stacks := waitPoolReplicas(t, limitertest.RedisCluster, 2)
	ctx := context.Background()
	holder := newUser(t)
	held := mustAcquire(t, stacks[0].Limiter, holder, "low", "gpt-4o")
	low := queue(t, ctx, stacks[0], stacks[0].Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "gpt-4o"}}, 8*time.Second)
	time.Sleep(300 * time.Millisecond)
	highUser := newUser(t)
	high := queue(t, ctx, stacks[0], stacks[1].Limiter, limiter.AcquireRequest{UserID: highUser, Plan: "high", Pools: map[string]string{"model": "gpt-4o"}}, 8*time.Second)

	if _, err := stacks[0].Limiter.Release(ctx, holder, held.StreamID); err != nil {
		t.Fatal(err)
	}
	first, ok := high.answer(2 * time.Second)
	if !ok || first.err != nil || !first.res.Granted || first.res.Waited <= 0 || len(first.res.Pools) != 1 || first.res.Pools[0].Used != 1 {
		t.Fatalf("the priority-5 acquire after the release: %+v (answered %v); want granted, having waited", first, ok)
	}
	if a, ok := low.answer(300 * time.Millisecond); ok {
		t.Fatalf("the priority-0 acquire answered %+v while the priority-5 one holds the key; want it still waiting", a)
	}
	if _, err := stacks[1].Limiter.Release(ctx, highUser, first.res.StreamID); err != nil {
		t.Fatal(err)
	}
	if second, ok := low.answer(2 * time.Second); !ok || second.err != nil || !second.res.Granted {
		t.Fatalf("the priority-0 acquire after the next release: %+v (answered %v); want granted", second, ok)
	}
}

// TestAFullPoolKeyServesTheUserHoldingFewerFirst (DESIGN §17): model=m
// (cap 2) both held by user X; X queues a third stream, then user Y one;
// X releases one: Y is granted before X's waiter.
func TestAFullPoolKeyServesTheUserHoldingFewerFirst(t *testing.T) {
	t.Parallel()
	stacks := waitPoolReplicas(t, limitertest.RedisCluster, 3)
	ctx := context.Background()
	x, y := newUser(t), newUser(t)
	first := mustAcquire(t, stacks[0].Limiter, x, "low", "m")
	mustAcquire(t, stacks[1].Limiter, x, "low", "m")
	xWaits := queue(t, ctx, stacks[0], stacks[2].Limiter, limiter.AcquireRequest{UserID: x, Plan: "low", Pools: map[string]string{"model": "m"}}, 8*time.Second)
	time.Sleep(100 * time.Millisecond)
	yWaits := queue(t, ctx, stacks[0], stacks[1].Limiter, limiter.AcquireRequest{UserID: y, Plan: "low", Pools: map[string]string{"model": "m"}}, 8*time.Second)

	if _, err := stacks[0].Limiter.Release(ctx, x, first.StreamID); err != nil {
		t.Fatal(err)
	}
	got, ok := yWaits.answer(2 * time.Second)
	if !ok || got.err != nil || !got.res.Granted {
		t.Fatalf("Y's acquire after X released one: %+v (answered %v); want granted before X's waiter", got, ok)
	}
	if a, ok := xWaits.answer(300 * time.Millisecond); ok {
		t.Fatalf("X's waiter answered %+v while X holds 1 and Y 1 of 2; want it still waiting", a)
	}
}

// TestAPoolWaitRunsOutWithThePoolsRefusal: a waiter whose wait runs out
// is refused by the pool key it waited for, with how long it waited, and
// holds nothing after; one whose caller leaves is out of the queue at
// once.
func TestAPoolWaitRunsOutWithThePoolsRefusal(t *testing.T) {
	t.Parallel()
	s := waitPoolReplicas(t, limitertest.Standalone, 1)[0]
	ctx := context.Background()
	mustAcquire(t, s.Limiter, newUser(t), "low", "gpt-4o")
	user := newUser(t)
	res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "low", Wait: 400 * time.Millisecond, Pools: map[string]string{"model": "gpt-4o"}})
	if err != nil || res.Granted || res.RefusedBy == nil || res.RefusedBy.Pool != "model" || res.RefusedBy.Key != "gpt-4o" || res.Waited < 300*time.Millisecond || res.Waited > time.Second {
		t.Fatalf("an acquire waiting 400ms for a full key: %+v, %v; want refused by model=gpt-4o having waited its 400ms (less the steps before)", res, err)
	}
	for i := range 3 {
		if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "low"}); err != nil || res.Used != i+1 {
			t.Fatalf("the refused user's slot %d: %+v, %v; want all 3 free", i+1, res, err)
		}
	}

	leave, cancel := context.WithCancel(ctx)
	q := queue(t, leave, s, s.Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "gpt-4o"}}, 8*time.Second)
	cancel()
	a, ok := q.answer(time.Second)
	if !ok || !errors.Is(a.err, context.Canceled) {
		t.Fatalf("a waiter whose caller left: %+v (answered %v); want context.Canceled", a, ok)
	}
	deadline := time.Now().Add(time.Second)
	for queueLength(t, s, "gpt-4o") > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the ticket of a caller that left is still queued after 1s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAPoolWaiterKeepsItsUsersSlot: while an acquire waits for a pool
// key longer than its plan's slot TTL (300ms), the user's slot it holds
// is kept alive, and so the grant's stream beats on afterwards.
func TestAPoolWaiterKeepsItsUsersSlot(t *testing.T) {
	t.Parallel()
	s := waitPoolReplicas(t, limitertest.Standalone, 1)[0]
	ctx := context.Background()
	holder := newUser(t)
	held := mustAcquire(t, s.Limiter, holder, "low", "gpt-4o")
	user := newUser(t)
	q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "brief", Pools: map[string]string{"model": "gpt-4o"}}, 5*time.Second)
	time.Sleep(time.Second) // three TTLs of brief
	if _, err := s.Limiter.Release(ctx, holder, held.StreamID); err != nil {
		t.Fatal(err)
	}
	a, ok := q.answer(2 * time.Second)
	if !ok || a.err != nil || !a.res.Granted {
		t.Fatalf("the waiter after the release: %+v (answered %v); want granted", a, ok)
	}
	if beat, err := s.Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "brief", StreamID: a.res.StreamID}); err != nil || !beat.Alive {
		t.Fatalf("the granted stream's heartbeat: %+v, %v; want alive (its user's slot kept while it waited)", beat, err)
	}
}

// TestAReleaseWakesTheWaiterOfEachPoolKeyItLeaves: a stream holds the
// one place of two pool keys, and each key has a waiter; its release
// leaves both keys (in one pipeline where one node serves them), and each
// waiter is granted at once, woken, not found by a poll or a refresh of
// its ticket (a minute and 20s here).
func TestAReleaseWakesTheWaiterOfEachPoolKeyItLeaves(t *testing.T) {
	eachWaitBackend(t, func(t *testing.T, b limitertest.Backend) {
		table := poolTable(t,
			pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second},
			pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second},
		)
		s := limitertest.New(t, limitertest.Options{Backend: b, Tiers: poolWaitTiers(),
			Limiter: limiter.Options{Pools: table, WaitPoll: time.Minute, TicketTTL: time.Minute}})
		ctx := context.Background()
		holder := newUser(t)
		res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: holder, Plan: "low", Pools: map[string]string{"model": "m", "org": "o"}})
		if err != nil || !res.Granted {
			t.Fatalf("the holder's acquire: %+v, %v", res, err)
		}
		var waiters []*queued
		for _, pool := range []string{"model", "org"} {
			req := limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Wait: 8 * time.Second, Pools: map[string]string{pool: map[string]string{"model": "m", "org": "o"}[pool]}}
			q := &queued{done: make(chan acquired, 1)}
			go func() {
				res, err := s.Limiter.Acquire(ctx, req)
				q.done <- acquired{res, err}
			}()
			slots, err := s.Keys.PoolKey(pool, req.Pools[pool])
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for zcard(t, s, keys.Queue(slots)) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the %s waiter not queued within 5s", pool)
				}
				time.Sleep(5 * time.Millisecond)
			}
			waiters = append(waiters, q)
		}
		if rel, err := s.Limiter.Release(ctx, holder, res.StreamID); err != nil || !rel.Released {
			t.Fatalf("the holder's release: %+v, %v", rel, err)
		}
		for i, q := range waiters {
			a, ok := q.answer(2 * time.Second)
			if !ok || a.err != nil || !a.res.Granted {
				t.Errorf("waiter %d after the release: %+v (answered %v); want granted within 2s", i+1, a, ok)
			}
		}
	})
}

// TestAReleaseDuringAPoolWaitEndsIt: a pooled acquire waiting for a full
// pool key holds its user's slot meanwhile. Released then (by its holder,
// or by support's release of all the user's slots), the stream is gone:
// when the key frees up, the waiter does not take the place for a stream
// nothing can heartbeat or release. It answers slot_lost, and the place
// goes to whoever asks next. So too when the released id has been taken
// again since, by another caller or by the same one, with no pools: that
// slot is another stream's, whose record names no membership, not the
// one the waiter holds.
func TestAReleaseDuringAPoolWaitEndsIt(t *testing.T) {
	t.Parallel()
	byHolder := func(lim *limiter.Limiter, user, streamID string) error {
		rel, err := lim.Release(context.Background(), user, streamID)
		if err == nil && !rel.Released {
			err = errors.New("not released")
		}
		return err
	}
	bySupport := func(lim *limiter.Limiter, user, streamID string) error {
		ids, err := lim.ReleaseAll(context.Background(), user, newAuditID())
		if err == nil && (len(ids) != 1 || ids[0] != streamID) {
			err = errors.New("released " + strings.Join(ids, ","))
		}
		return err
	}
	takenBy := func(caller string) func(lim *limiter.Limiter, user, streamID string) error {
		return func(lim *limiter.Limiter, user, streamID string) error {
			if err := bySupport(lim, user, streamID); err != nil {
				return err
			}
			res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: streamID, Caller: caller})
			if err == nil && !res.Granted {
				err = fmt.Errorf("the id taken again by %q: not granted", caller)
			}
			return err
		}
	}
	for _, tc := range []struct {
		name    string
		release func(lim *limiter.Limiter, user, streamID string) error
		retaken bool // the user then holds one slot: the id's new one
	}{
		{"by its holder", byHolder, false},
		{"by support", bySupport, false},
		{"by support, its id taken since by another caller", takenBy("mallory"), true},
		{"by support, its id taken since by its own caller", takenBy("alice"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := waitPoolReplicas(t, limitertest.RedisCluster, 1)[0]
			ctx := context.Background()
			holder, user := newUser(t), newUser(t)
			held := mustAcquire(t, s.Limiter, holder, "low", "gpt-4o")
			q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "waiting", Caller: "alice", Pools: map[string]string{"model": "gpt-4o"}}, 8*time.Second)
			if err := tc.release(s.Limiter, user, "waiting"); err != nil {
				t.Fatalf("the waiting stream's release: %v", err)
			}
			if _, err := s.Limiter.Release(ctx, holder, held.StreamID); err != nil {
				t.Fatal(err)
			}
			a, ok := q.answer(3 * time.Second)
			if !ok || !errors.Is(a.err, limiter.ErrSlotLost) || a.res.Granted || !strings.Contains(fmt.Sprint(a.err), "model=gpt-4o") {
				t.Fatalf("the released waiter once the key freed up: %+v (answered %v); want slot lost, naming model=gpt-4o", a, ok)
			}
			if key, err := s.Limiter.PoolSlots(ctx, "model", "gpt-4o"); err != nil || key.Used != 0 {
				t.Errorf("model=gpt-4o holds %+v (%v); want none", key, err)
			}
			want := 0
			if tc.retaken {
				want = 1
			}
			if slots, err := s.Limiter.Slots(ctx, user); err != nil || len(slots.Slots) != want {
				t.Errorf("the user holds %+v (%v); want %d slots", slots, err, want)
			}
			mustAcquire(t, s.Limiter, newUser(t), "low", "gpt-4o")
		})
	}
}

// TestAWaitThatEndsLostLeavesThePlaceOfTheStreamNowUnderItsID: a wait
// answered slot_lost gives back only what is its own. Alice's request of
// s1 waits for model=gpt-4o (cap 1); then another request of s1 waits
// too: alice's again, after support released the user's slots (the id
// taken anew, with the same pool), or one naming no caller, which
// alice's stream is not foreign to. However the two are answered, a
// request of s1 granted holds gpt-4o's place: the key counts it, and
// refuses another user's stream.
func TestAWaitThatEndsLostLeavesThePlaceOfTheStreamNowUnderItsID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		replicas int
		released bool   // support releases the user's slots before the second request
		caller   string // the second request's
	}{
		{"taken anew by its caller", 1, true, "alice"},
		{"taken anew by its caller on another replica", 2, true, "alice"},
		{"joined by a request naming no caller", 1, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ss := waitPoolReplicas(t, limitertest.RedisCluster, tc.replicas)
			sa, sb := ss[0], ss[tc.replicas-1]
			ctx := context.Background()
			holder, user := newUser(t), newUser(t)
			held := mustAcquire(t, sa.Limiter, holder, "low", "gpt-4o")
			named := map[string]string{"model": "gpt-4o"}
			first := queue(t, ctx, sa, sa.Limiter, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "s1", Caller: "alice", Pools: named}, 8*time.Second)
			if tc.released {
				if ids, err := sa.Limiter.ReleaseAll(ctx, user, newAuditID()); err != nil || len(ids) != 1 {
					t.Fatalf("support's release: %v, %v", ids, err)
				}
			}
			second := make(chan acquired, 1)
			go func() {
				res, err := sb.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "s1", Caller: tc.caller, Pools: named, Wait: 8 * time.Second})
				second <- acquired{res, err}
			}()
			time.Sleep(500 * time.Millisecond) // the second request waits for gpt-4o too
			if _, err := sa.Limiter.Release(ctx, holder, held.StreamID); err != nil {
				t.Fatal(err)
			}
			a, b := answersOfS1(t, first, second)
			granted := (a.err == nil && a.res.Granted) || (b.err == nil && b.res.Granted)
			if !granted {
				t.Fatalf("neither request of s1 was granted: %v / %v; want the stream the id now names granted", a.err, b.err)
			}
			if key, err := sa.Limiter.PoolSlots(ctx, "model", "gpt-4o"); err != nil || key.Used != 1 {
				t.Errorf("model=gpt-4o holds %d (%v) with s1 granted (%v / %v); want 1: its place", key.Used, err, a.err, b.err)
			}
			if r, err := sa.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: named}); err != nil || r.Granted {
				t.Errorf("another user's stream of model=gpt-4o (cap 1) while s1 runs: %+v, %v; want refused", r, err)
			}
		})
	}
}

// TestAWaitThatEndsLostGivesBackThePlaceNoStreamHolds: alice's request
// of s1 waits for model=gpt-4o (cap 1); support releases the user's
// slots; her request again takes s1 anew, naming model=gpt-4o and another
// pool, and gives up without holding gpt-4o: refused by a full key before
// it (gate), or after sharing the first request's grant of it (zeta).
// The first request, answered slot_lost, gives back its part of gpt-4o's
// place, which no stream then holds: the key is free for the next user,
// not held full for a TTL.
func TestAWaitThatEndsLostGivesBackThePlaceNoStreamHolds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		second map[string]string
		block  string // the pool the second request gives up at
	}{
		{"the second request refused before it", map[string]string{"gate": "g", "model": "gpt-4o"}, "gate"},
		{"the second request sharing its grant, refused after it", map[string]string{"model": "gpt-4o", "zeta": "z"}, "zeta"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := replicasOf(t, limitertest.RedisCluster, 1, poolWaitTiers(), poolTable(t,
				pools.Pool{Pool: "gate", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"g": 1}, MaxWait: 10 * time.Second},
				pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second},
				pools.Pool{Pool: "zeta", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"z": 1}},
			))[0]
			ctx := context.Background()
			bob, carol, alice := newUser(t), newUser(t), newUser(t)
			held := mustAcquire(t, s.Limiter, bob, "low", "gpt-4o")
			blocked := map[string]string{"gate": "g", "zeta": "z"}
			if r, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: carol, Plan: "low", Pools: map[string]string{tc.block: blocked[tc.block]}}); err != nil || !r.Granted {
				t.Fatalf("carol's stream filling %s: %+v, %v", tc.block, r, err)
			}
			first := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: alice, Plan: "low", StreamID: "s1", Caller: "alice", Pools: map[string]string{"model": "gpt-4o"}}, 8*time.Second)
			if ids, err := s.Limiter.ReleaseAll(ctx, alice, newAuditID()); err != nil || len(ids) != 1 {
				t.Fatalf("support's release: %v, %v", ids, err)
			}
			second := make(chan acquired, 1)
			go func() {
				res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: alice, Plan: "low", StreamID: "s1", Caller: "alice", Pools: tc.second, Wait: 3 * time.Second})
				second <- acquired{res, err}
			}()
			time.Sleep(500 * time.Millisecond) // the second request waits (gate) or shares the ticket (model)
			if _, err := s.Limiter.Release(ctx, bob, held.StreamID); err != nil {
				t.Fatal(err)
			}
			a, b := answersOfS1(t, first, second)
			if !errors.Is(a.err, limiter.ErrSlotLost) || b.err != nil || b.res.Granted || b.res.RefusedBy == nil || b.res.RefusedBy.Pool != tc.block {
				t.Fatalf("the first request: %v; the second: %+v, %v; want slot lost, and refused by %s", a.err, b.res.RefusedBy, b.err, tc.block)
			}
			userHolds(t, s.Limiter, alice, 0, "neither request of s1 holds a slot")
			keyHolds(t, s.Limiter, "model", "gpt-4o", 0, "no stream holds model=gpt-4o")
			mustAcquire(t, s.Limiter, newUser(t), "low", "gpt-4o")
		})
	}
}

// answersOfS1 returns what the two requests of stream s1 answered once
// the key they wait for freed up: first's within 4s, second's within 5s.
func answersOfS1(t *testing.T, first *queued, second <-chan acquired) (a, b acquired) {
	t.Helper()
	a, ok := first.answer(4 * time.Second)
	if !ok {
		t.Fatal("the first request of s1 got no answer within 4s of the key freeing up")
	}
	select {
	case b = <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("the second request of s1 got no answer within 5s of the key freeing up")
	}
	return a, b
}

// TestAStreamThatWaitedForItsUsersSlotHoldsItsPools: an acquire that
// waits for one of its user's slots, then joins its pools, records them
// with the slot as one that did not wait: its heartbeats keep the
// memberships alive past their TTL, and its release on a replica that
// did not take it drops them.
func TestAStreamThatWaitedForItsUsersSlotHoldsItsPools(t *testing.T) {
	t.Parallel()
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)})
	tier := tiers.Tier{Plan: "one-brief", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second, SlotTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond}.WithDefaults()
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	var reps []*limiter.Limiter
	var s *limitertest.Stack
	for range 2 {
		var addrs []string
		if s != nil {
			addrs = s.Redis.Addrs()
		}
		s = limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Addrs: addrs, Timeout: 5 * time.Second},
			Tiers: []tiers.Tier{tier}, Limiter: limiter.Options{Keys: prefix, Pools: table}})
		reps = append(reps, s.Limiter)
	}
	ctx := context.Background()
	user := newUser(t)
	acquire := func(lim *limiter.Limiter, user string) limiter.AcquireResult {
		t.Helper()
		res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: tier.Plan, Pools: map[string]string{"model": "k"}})
		if err != nil {
			t.Fatalf("%s's acquire: %v", user, err)
		}
		return res
	}
	first := acquire(reps[0], user)
	userKey, err := s.Keys.UserKey(user)
	if err != nil || !first.Granted {
		t.Fatalf("the first stream: %+v, %v", first, err)
	}
	q := startQueued(t, ctx, reps[0], limiter.AcquireRequest{UserID: user, Plan: tier.Plan, StreamID: "second", Pools: map[string]string{"model": "k"}},
		5*time.Second, func() int64 { return zcard(t, s, keys.Queue(userKey)) })
	if _, err := reps[0].Release(ctx, user, first.StreamID); err != nil {
		t.Fatal(err)
	}
	if a, ok := q.answer(3 * time.Second); !ok || a.err != nil || !a.res.Granted || len(a.res.Pools) != 1 {
		t.Fatalf("the waiting stream once the first ended: %+v (answered %v); want granted with model=k", a, ok)
	}
	for i := range 8 { // past two of its TTLs, on the replica that did not take it
		time.Sleep(100 * time.Millisecond)
		if beat, err := reps[1].Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: tier.Plan, StreamID: "second"}); err != nil || !beat.Alive {
			t.Fatalf("heartbeat %d: %+v, %v", i+1, beat, err)
		}
	}
	if res := acquire(reps[1], newUser(t)); res.Granted || res.RefusedBy == nil {
		t.Errorf("another user's acquire of model=k while the stream beats: %+v; want refused by model=k", res)
	}
	if rel, err := reps[1].Release(ctx, user, "second"); err != nil || !rel.Released {
		t.Fatalf("release: %+v, %v", rel, err)
	}
	if res := acquire(reps[1], newUser(t)); !res.Granted {
		t.Errorf("another user's acquire of model=k after the release: %+v; want granted", res)
	}
}

// TestAPoolKeysNewCapHoldsForItsWaiters: tickets queue under the cap of
// their time, and a pool's cap may change while they wait (a LimitPool
// edited, a rolling deploy). Lowered from 3 to 1 while three acquires
// wait, the key grants one when its holders expire, not three; raised
// from 1 to 3 while one waits, the waiter is granted a place at once,
// not refused at the end of its wait while the key has room.
func TestAPoolKeysNewCapHoldsForItsWaiters(t *testing.T) {
	t.Parallel()
	setup := func(t *testing.T, cap int) (*limitertest.Stack, func(int)) {
		t.Helper()
		table := poolTable(t)
		setCap := func(cap int) {
			if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(cap), MaxWait: 10 * time.Second}.WithDefaults()}); err != nil {
				t.Fatal(err)
			}
		}
		setCap(cap)
		s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
			Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table}})
		return s, setCap
	}
	t.Run("lowered", func(t *testing.T) {
		t.Parallel()
		s, setCap := setup(t, 3)
		ctx := context.Background()
		for range 3 { // never beat: they expire 300ms on
			mustAcquire(t, s.Limiter, newUser(t), "brief", "k")
		}
		var waiters []*queued
		for range 3 {
			waiters = append(waiters, queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}}, 3*time.Second))
		}
		setCap(1)
		granted := 0
		for i, q := range waiters {
			a, ok := q.answer(5 * time.Second)
			if !ok || a.err != nil {
				t.Fatalf("waiter %d: %+v (answered %v)", i+1, a, ok)
			}
			if a.res.Granted {
				granted++
			}
		}
		if key, err := s.Limiter.PoolSlots(ctx, "model", "k"); err != nil || granted != 1 || key.Used != 1 {
			t.Errorf("%d of 3 waiters granted, model=k holds %+v (%v); want 1 under the cap of 1", granted, key, err)
		}
	})
	t.Run("raised", func(t *testing.T) {
		t.Parallel()
		s, setCap := setup(t, 1)
		ctx := context.Background()
		mustAcquire(t, s.Limiter, newUser(t), "low", "k")
		q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}}, 5*time.Second)
		setCap(3)
		if a, ok := q.answer(3 * time.Second); !ok || a.err != nil || !a.res.Granted || a.res.Pools[0].Limit != 3 {
			t.Errorf("the waiter once the cap is 3: %+v (answered %v); want granted within 3s, judged by 3", a, ok)
		}
	})
}

// TestAPoolInShadowModeLetsItsWaitersIn: shadow mode (enforce: false)
// refuses no acquire (DESIGN §18), and that holds for the acquires that
// queued while the pool still enforced its cap, or a support override of
// the key's: switched to shadow mode, the pool grants its waiter a place
// beside the holder, counted, and says the cap (the override's, when one
// is in force) would have refused it.
func TestAPoolInShadowModeLetsItsWaitersIn(t *testing.T) {
	t.Parallel()
	for name, capped := range map[string]struct{ cap, override int }{
		"at its cap":        {cap: 1, override: -1},
		"at a key override": {cap: 5, override: 1},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(capped.cap), MaxWait: 10 * time.Second})
			s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
				Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table}})
			ctx := context.Background()
			limit := capped.cap
			if capped.override >= 0 {
				limit = capped.override
				if _, err := s.Limiter.SetPoolOverride(ctx, "model", "k", limiter.OverrideRequest{MaxConcurrentStreams: capped.override, For: time.Hour, Actor: "test", Reason: "test"}); err != nil {
					t.Fatal(err)
				}
			}
			mustAcquire(t, s.Limiter, newUser(t), "low", "k")
			q := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}}, 5*time.Second)
			shadow := false
			if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(capped.cap), MaxWait: 10 * time.Second, Enforce: &shadow}.WithDefaults()}); err != nil {
				t.Fatal(err)
			}
			a, ok := q.answer(3 * time.Second)
			if !ok || a.err != nil || !a.res.Granted {
				t.Fatalf("the waiter once the pool is in shadow mode: %+v, %v (answered %v); want granted within 3s", a.res, a.err, ok)
			}
			if a.res.WouldRefuse != limiter.CodePoolLimitReached || a.res.WouldRefuseBy == nil || a.res.WouldRefuseBy.Key != "k" ||
				len(a.res.Pools) != 1 || !a.res.Pools[0].WouldRefuse || a.res.Pools[0].Used != 2 || a.res.Pools[0].Limit != limit {
				t.Errorf("the waiter's grant: would refuse %q by %+v, pools %+v; want pool_limit_reached by model=k, 2 of %d", a.res.WouldRefuse, a.res.WouldRefuseBy, a.res.Pools, limit)
			}
			if key, err := s.Limiter.PoolSlots(ctx, "model", "k"); err != nil || key.Used != 2 {
				t.Errorf("model=k holds %+v (%v); want 2, the holder and the waiter, counted above the cap of %d", key, err, limit)
			}
		})
	}
}

// TestARetryOfAWaitingAcquireKeepsItsSlotWhenTheFirstLeaves: an acquire
// waits for a full pool key; its caller, tired of waiting, retries with
// the same stream id (on the same replica, or another), which extends
// the user's slot and waits too; then the first request ends (its caller
// gone). When the key frees up, the retry is granted and its stream
// holds its user's slot and the membership: the first's undo leaves the
// slot the retry extended, rather than answering the retry 410.
func TestARetryOfAWaitingAcquireKeepsItsSlotWhenTheFirstLeaves(t *testing.T) {
	t.Parallel()
	for name, replica := range map[string]int{"on the same replica": 0, "on another replica": 1} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stacks := waitPoolReplicas(t, limitertest.RedisCluster, 2)
			ctx := context.Background()
			holder, user := newUser(t), newUser(t)
			held := mustAcquire(t, stacks[0].Limiter, holder, "low", "gpt-4o")
			req := limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "retried", Pools: map[string]string{"model": "gpt-4o"}}
			leave, cancel := context.WithCancel(ctx)
			defer cancel()
			first := queue(t, leave, stacks[0], stacks[0].Limiter, req, 8*time.Second)

			retry := retryWaiting(t, ctx, stacks[replica].Limiter, req)
			cancel()
			if a, ok := first.answer(2 * time.Second); !ok || !errors.Is(a.err, context.Canceled) {
				t.Fatalf("the first request, its caller gone: %+v (answered %v); want context.Canceled", a, ok)
			}
			if _, err := stacks[0].Limiter.Release(ctx, holder, held.StreamID); err != nil {
				t.Fatal(err)
			}
			a, ok := retry.answer(3 * time.Second)
			if !ok || a.err != nil || !a.res.Granted || len(a.res.Pools) != 1 {
				t.Fatalf("the retry once the key freed up: %+v, %v (answered %v); want granted with model=gpt-4o", a.res, a.err, ok)
			}
			if beat, err := stacks[1].Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "low", StreamID: "retried"}); err != nil || !beat.Alive {
				t.Fatalf("the retried stream's heartbeat: %+v, %v; want alive", beat, err)
			}
			if key, err := stacks[1].Limiter.PoolSlots(ctx, "model", "gpt-4o"); err != nil || key.Used != 1 {
				t.Errorf("model=gpt-4o holds %+v (%v); want the retried stream alone", key, err)
			}
		})
	}
}

// retryWaiting starts req again on lim, waiting up to 8s, and returns
// once it waits (for a pool key: its ticket is the first's, under the
// same member, so the queue does not grow).
func retryWaiting(t *testing.T, ctx context.Context, lim *limiter.Limiter, req limiter.AcquireRequest) *queued {
	t.Helper()
	waiting := make(chan struct{})
	retry := &queued{done: make(chan acquired, 1)}
	go func() {
		r := req
		r.Wait = 8 * time.Second
		r.OnWait = func(time.Duration) { close(waiting) }
		res, err := lim.Acquire(ctx, r)
		retry.done <- acquired{res, err}
	}()
	select {
	case <-waiting:
	case <-time.After(5 * time.Second):
		t.Fatal("the retry did not wait within 5s")
	}
	return retry
}

// TestARefusedRetryLeavesTheSlotItExtended: a retry of a granted stream
// that a pool refuses (its membership of the key is gone, as after a
// degraded grant or a failover, and another stream took the place)
// extended the stream's slot and took nothing: it leaves the slot, which
// may be a running grant's, as it found it.
func TestARefusedRetryLeavesTheSlotItExtended(t *testing.T) {
	t.Parallel()
	s := waitPoolReplicas(t, limitertest.RedisCluster, 1)[0]
	ctx := context.Background()
	user := newUser(t)
	live := mustAcquire(t, s.Limiter, user, "low", "gpt-4o")
	slots, err := s.Keys.PoolKey("model", "gpt-4o")
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Do(ctx, c.B().Zrem().Key(slots).Member(live.StreamID+" "+user).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s.Limiter, newUser(t), "low", "gpt-4o")
	res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: live.StreamID, Pools: map[string]string{"model": "gpt-4o"}})
	if err != nil || res.Granted || res.RefusedBy == nil {
		t.Fatalf("the retry: %+v, %v; want refused by model=gpt-4o", res, err)
	}
	if held, err := s.Limiter.Slots(ctx, user); err != nil || len(held.Slots) != 1 || held.Slots[0].StreamID != live.StreamID {
		t.Errorf("the user holds %+v (%v) after the refused retry; want the stream's slot, as it was", held, err)
	}
}

// TestAnAcquireThatWaitedJoinsItsPoolsAsTheyAreNow: an acquire waits in
// its user's queue, then joins its pool; the pool changed meanwhile (its
// key's cap, or its enforce), and the acquire is judged by the pool as
// it is when it joins, as a new acquire is, not as it was when it began.
func TestAnAcquireThatWaitedJoinsItsPoolsAsTheyAreNow(t *testing.T) {
	t.Parallel()
	off := false
	for name, change := range map[string]struct {
		before, after pools.Pool
		granted       bool // the waiter, once its user's slot frees
	}{
		"a cap lowered": {
			before: pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2)},
			after:  pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)},
		},
		"shadow mode ended": {
			before: pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), Enforce: &off},
			after:  pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)},
		},
		"shadow mode begun": {
			before:  pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1)},
			after:   pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), Enforce: &off},
			granted: true,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			table := poolTable(t, change.before)
			s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
				Tiers:   []tiers.Tier{tiers.Tier{Plan: "one", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second}.WithDefaults()},
				Limiter: limiter.Options{Pools: table}})
			ctx := context.Background()
			if _, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "one", Pools: map[string]string{"model": "k"}}); err != nil {
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
			q := startQueued(t, ctx, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "one", Pools: map[string]string{"model": "k"}}, 5*time.Second,
				func() int64 { return zcard(t, s, keys.Queue(userKey)) })
			if err := table.Replace([]pools.Pool{change.after.WithDefaults()}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Limiter.Release(ctx, user, own.StreamID); err != nil {
				t.Fatal(err)
			}
			a, ok := q.answer(3 * time.Second)
			if !ok || a.err != nil {
				t.Fatalf("the waiter once its user's slot freed: %+v, %v (answered %v)", a.res, a.err, ok)
			}
			if change.granted {
				if !a.res.Granted || a.res.WouldRefuse != limiter.CodePoolLimitReached || len(a.res.Pools) != 1 || a.res.Pools[0].Used != 2 {
					t.Fatalf("the waiter, its pool now in shadow mode: %+v; want granted over the cap, saying the pool would refuse it", a.res)
				}
				return
			}
			if a.res.Granted || a.res.RefusedBy == nil || a.res.RefusedBy.Limit != 1 || a.res.RefusedBy.Used != 1 {
				t.Fatalf("the waiter, the pool now enforcing 1: %+v, refused by %+v; want refused by model=k at 1 of 1", a.res, a.res.RefusedBy)
			}
			if key, err := s.Limiter.PoolSlots(ctx, "model", "k"); err != nil || key.Used != 1 {
				t.Errorf("model=k holds %+v (%v); want its one holder", key, err)
			}
		})
	}
}

// TestOneUsersWaitersDoNotShutOthersOutOfAFullQueue (DESIGN §17): one
// user's waiters fill a pool key's queue (3 here); a user of a higher
// priority holding nothing is queued in the place of the last of them,
// not refused at once, and is the first served when the key frees up.
func TestOneUsersWaitersDoNotShutOthersOutOfAFullQueue(t *testing.T) {
	t.Parallel()
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second})
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table, MaxQueue: 3}})
	ctx := context.Background()
	holder := newUser(t)
	held := mustAcquire(t, s.Limiter, holder, "low", "k")
	hog := newUser(t)
	for range 3 {
		queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: hog, Plan: "low", Pools: map[string]string{"model": "k"}}, 8*time.Second)
	}
	other := newUser(t)
	waiting := make(chan struct{})
	q := &queued{done: make(chan acquired, 1)}
	go func() {
		res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: other, Plan: "high", Pools: map[string]string{"model": "k"}, Wait: 8 * time.Second,
			OnWait: func(time.Duration) { close(waiting) }})
		q.done <- acquired{res, err}
	}()
	select {
	case <-waiting:
	case a := <-q.done:
		t.Fatalf("the priority-5 user holding nothing, behind one user's 3 waiters: %+v, %v; want it queued", a.res, a.err)
	}
	if a, ok := q.answer(300 * time.Millisecond); ok {
		t.Fatalf("the priority-5 user answered %+v, %v while the key is held; want it waiting", a.res, a.err)
	}
	if _, err := s.Limiter.Release(ctx, holder, held.StreamID); err != nil {
		t.Fatal(err)
	}
	if a, ok := q.answer(2 * time.Second); !ok || a.err != nil || !a.res.Granted {
		t.Fatalf("the priority-5 user once the key freed up: %+v, %v (answered %v); want granted first", a.res, a.err, ok)
	}
}

// TestADisplacedWaiterSaysHowLongItWaited: a waiter whose place in a
// full pool key's queue went to one served before it (a higher priority)
// is refused by the key as a full queue, with how long it had waited, not
// as one that never waited.
func TestADisplacedWaiterSaysHowLongItWaited(t *testing.T) {
	t.Parallel()
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second})
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table, MaxQueue: 1}})
	ctx := context.Background()
	mustAcquire(t, s.Limiter, newUser(t), "low", "k")
	low := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}}, 9*time.Second)
	time.Sleep(200 * time.Millisecond)
	high := newUser(t)
	go func() {
		_, _ = s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: high, Plan: "high", Pools: map[string]string{"model": "k"}, Wait: 9 * time.Second})
	}()
	a, ok := low.answer(8 * time.Second)
	if !ok || a.err != nil || a.res.Granted || !a.res.QueueFull || a.res.RefusedBy == nil || a.res.Waited < 200*time.Millisecond {
		t.Fatalf("the displaced waiter: %+v, %v (answered %v); want refused by model=k as a full queue, having waited", a.res, a.err, ok)
	}
}

// poolWaitLog records PoolWaited reports; the rest of Observer is
// ignored.
type poolWaitLog struct {
	*reclaimLog
	mu     sync.Mutex
	waited map[limiter.WaitOutcome][]time.Duration
}

func (l *poolWaitLog) PoolWaited(_ context.Context, _ string, _ int, outcome limiter.WaitOutcome, waited time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waited[outcome] = append(l.waited[outcome], waited)
}

func (l *poolWaitLog) of(outcome limiter.WaitOutcome) []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.waited[outcome])
}

// TestAWaiterDisplacedInItsOwnLoopSaysHowLongItWaited: the waiter that
// loses its place may be refreshed by the very call of its replica's loop
// that queues the one taking it (the same plan, the same replica). hog's
// two waiters fill a queue of 2; 700ms on another user of hog's plan,
// holding nothing, takes the place of hog's second. That one is refused
// as a full queue with how long it waited, and PoolWaited records as
// much.
func TestAWaiterDisplacedInItsOwnLoopSaysHowLongItWaited(t *testing.T) {
	t.Parallel()
	log := &poolWaitLog{reclaimLog: &reclaimLog{plans: map[string]int{}, pools: map[string]int{}}, waited: map[limiter.WaitOutcome][]time.Duration{}}
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second})
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table, MaxQueue: 2, Observer: log}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mustAcquire(t, s.Limiter, newUser(t), "low", "k")
	hog := newUser(t)
	queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: hog, Plan: "low", Pools: map[string]string{"model": "k"}}, 9*time.Second)
	second := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: hog, Plan: "low", Pools: map[string]string{"model": "k"}}, 9*time.Second)
	start := time.Now()
	time.Sleep(700 * time.Millisecond)
	go func() {
		_, _ = s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "k"}, Wait: 9 * time.Second})
	}()
	a, ok := second.answer(8 * time.Second)
	if !ok || a.err != nil || a.res.Granted || !a.res.QueueFull || a.res.RefusedBy == nil {
		t.Fatalf("hog's second: %+v, %v (answered %v); want refused by model=k as a full queue", a.res, a.err, ok)
	}
	waited := time.Since(start)
	if a.res.Waited < 700*time.Millisecond {
		t.Errorf("the displaced waiter says it waited %v; it waited %v or more", a.res.Waited, waited.Round(time.Millisecond))
	}
	if got := log.of(limiter.WaitFull); len(got) != 1 || got[0] < 700*time.Millisecond {
		t.Errorf("PoolWaited recorded full queues that waited %v; want one of 700ms or more", got)
	}
}

// TestAFullQueueRefusesTheWaiterServedLast (DESIGN §17, docs/pools.md:
// a key's queue holds the waiters served first). model=k (cap 1) is held
// by v; the queue holds at most 2: v's second acquire l waits (plan
// low), then u's x (plan low), then u's n (plan high, priority 5). Served
// in order: n, then l (v holds 1, as u does once n is served; each
// waits for 1; l came first), then x. x is refused, and l waits on.
func TestAFullQueueRefusesTheWaiterServedLast(t *testing.T) {
	t.Parallel()
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second})
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers: poolWaitTiers(), Limiter: limiter.Options{Pools: table, MaxQueue: 2}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v, u := newUser(t), newUser(t)
	mustAcquire(t, s.Limiter, v, "low", "k")
	l := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: v, Plan: "low", Pools: map[string]string{"model": "k"}}, 9*time.Second)
	x := queue(t, ctx, s, s.Limiter, limiter.AcquireRequest{UserID: u, Plan: "low", Pools: map[string]string{"model": "k"}}, 9*time.Second)
	go func() {
		_, _ = s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: u, Plan: "high", Pools: map[string]string{"model": "k"}, Wait: 9 * time.Second})
	}()
	if a, ok := x.answer(5 * time.Second); !ok || a.err != nil || !a.res.QueueFull {
		t.Fatalf("u's x, served last: %+v, %v (answered %v); want refused as a full queue", a.res, a.err, ok)
	}
	if a, ok := l.answer(time.Second); ok {
		t.Errorf("v's l, served second: answered %+v, %v (queue full: %v); want it still waiting", a.res, a.err, a.res.QueueFull)
	}
}

// sharingRetries are the cases of a request and its retry sharing a
// grant: the retry on the same replica or another (replica), and staying
// or leaving too (bothLeave).
var sharingRetries = map[string]struct {
	replica   int
	bothLeave bool
}{
	"on the same replica":               {0, false},
	"on another replica":                {1, false},
	"on the same replica, both leaving": {0, true},
	"on another replica, both leaving":  {1, true},
}

// TestARetrySharingAUserQueueWaitKeepsItsSlot: an acquire waits in its
// user's queue (the user holds its 3), its retry (same stream id, on the
// same replica or another) waits too; a slot frees, the wait grants it
// to both, and both then wait for a full pool key; the first request
// leaves. The retry is granted once the key frees up: the first leaves
// its share of the slot the retry shares. When the retry leaves too, the
// slot goes with it: the user holds its other 2.
func TestARetrySharingAUserQueueWaitKeepsItsSlot(t *testing.T) {
	t.Parallel()
	for name, c := range sharingRetries {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stacks := waitPoolReplicas(t, limitertest.RedisCluster, 2)
			ctx := context.Background()
			user := newUser(t)
			mine := holdSlots(t, stacks[0].Limiter, user, "low", 3)
			holder := newUser(t)
			held := mustAcquire(t, stacks[0].Limiter, holder, "low", "gpt-4o")
			req := limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "retried", Pools: map[string]string{"model": "gpt-4o"}}
			leave, cancel := context.WithCancel(ctx)
			defer cancel()
			stay := ctx
			if c.bothLeave {
				stay = leave
			}
			first := retryWaiting(t, leave, stacks[0].Limiter, req)
			retry := retryWaiting(t, stay, stacks[c.replica].Limiter, req)
			if _, err := stacks[0].Limiter.Release(ctx, user, mine[0]); err != nil {
				t.Fatal(err)
			}
			eventually(t, "a request waiting for gpt-4o", func() (bool, string) {
				return queueLength(t, stacks[0], "gpt-4o") > 0, "none waits for it"
			})
			time.Sleep(300 * time.Millisecond) // both wait for gpt-4o
			cancel()
			leaving := []*queued{first}
			if c.bothLeave {
				leaving = append(leaving, retry)
			}
			gone(t, leaving...)
			if c.bothLeave {
				userHolds(t, stacks[1].Limiter, user, 2, "both requests gone")
				return
			}
			if _, err := stacks[0].Limiter.Release(ctx, holder, held.StreamID); err != nil {
				t.Fatal(err)
			}
			if b, ok := retry.answer(3 * time.Second); !ok || b.err != nil || !b.res.Granted {
				t.Fatalf("the retry once the key freed up: %+v, %v (answered %v); want granted", b.res, b.err, ok)
			}
			if beat, err := stacks[1].Limiter.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "low", StreamID: "retried"}); err != nil || !beat.Alive {
				t.Errorf("the retried stream's heartbeat: %+v, %v; want alive", beat, err)
			}
		})
	}
}

// TestARetrySharingAPoolWaitKeepsTheMembershipItGranted: an acquire and
// its retry (same stream id, on the same replica or another) both wait
// for model=gpt-4o (cap 1), are both granted it as a place frees, and
// both wait for org=acme (cap 1); the first leaves. Its undo leaves its
// share of the gpt-4o membership the retry shares: once acme frees up,
// the retry holds both, and gpt-4o admits no one else (its cap of 1
// holds). When the retry leaves too, the membership goes with it, as
// does the user's slot: gpt-4o admits another stream at once.
func TestARetrySharingAPoolWaitKeepsTheMembershipItGranted(t *testing.T) {
	t.Parallel()
	for name, c := range sharingRetries {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stacks := replicasOf(t, limitertest.RedisCluster, 2, poolWaitTiers(), poolTable(t,
				pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(2), Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second},
				pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second},
			))
			ctx := context.Background()
			u1, u2 := newUser(t), newUser(t)
			h1 := mustAcquire(t, stacks[0].Limiter, u1, "low", "gpt-4o")
			h2, err := stacks[0].Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: u2, Plan: "low", Pools: map[string]string{"org": "acme"}})
			if err != nil || !h2.Granted {
				t.Fatalf("acme's holder: %+v, %v", h2, err)
			}
			user := newUser(t)
			req := limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "retried", Pools: map[string]string{"model": "gpt-4o", "org": "acme"}}
			leave, cancel := context.WithCancel(ctx)
			defer cancel()
			stay := ctx
			if c.bothLeave {
				stay = leave
			}
			first := queue(t, leave, stacks[0], stacks[0].Limiter, req, 8*time.Second)
			retry := retryWaiting(t, stay, stacks[c.replica].Limiter, req)
			if _, err := stacks[0].Limiter.Release(ctx, u1, h1.StreamID); err != nil {
				t.Fatal(err)
			}
			keyHolds(t, stacks[0].Limiter, "model", "gpt-4o", 1, "gpt-4o granted to the waiting requests")
			time.Sleep(300 * time.Millisecond) // both granted gpt-4o, both wait for acme
			cancel()
			leaving := []*queued{first}
			if c.bothLeave {
				leaving = append(leaving, retry)
			}
			gone(t, leaving...)
			if c.bothLeave {
				keyHolds(t, stacks[1].Limiter, "model", "gpt-4o", 0, "both requests gone")
				userHolds(t, stacks[1].Limiter, user, 0, "both requests gone")
				if other, err := stacks[1].Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "gpt-4o"}}); err != nil || !other.Granted {
					t.Errorf("another stream's acquire of gpt-4o once both left: %+v, %v; want granted", other, err)
				}
				return
			}
			if _, err := stacks[0].Limiter.Release(ctx, u2, h2.StreamID); err != nil {
				t.Fatal(err)
			}
			b, ok := retry.answer(3 * time.Second)
			if !ok || b.err != nil || !b.res.Granted || len(b.res.Pools) != 2 {
				t.Fatalf("the retry once acme freed up: %+v, %v (answered %v); want granted, holding both keys", b.res, b.err, ok)
			}
			if key, err := stacks[0].Limiter.PoolSlots(ctx, "model", "gpt-4o"); err != nil || key.Used != 1 {
				t.Errorf("model=gpt-4o holds %+v (%v); want the retried stream, 1 of 1", key, err)
			}
			if other, err := stacks[0].Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "low", Pools: map[string]string{"model": "gpt-4o"}}); err != nil || other.Granted {
				t.Errorf("another stream's acquire of gpt-4o: %+v, %v; want refused, the key at its cap of 1", other, err)
			}
		})
	}
}

// gone fails t unless each of qs, its caller gone, answers
// context.Canceled within 2s.
func gone(t *testing.T, qs ...*queued) {
	t.Helper()
	for i, q := range qs {
		if a, ok := q.answer(2 * time.Second); !ok || !errors.Is(a.err, context.Canceled) {
			t.Fatalf("request %d, its caller gone: %+v, %v (answered %v); want context.Canceled", i, a.res, a.err, ok)
		}
	}
}

// eventually fails t unless ok holds within 2s (an undo beside the
// answer has 50ms past the decision's end; a loaded machine more).
func eventually(t *testing.T, what string, ok func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for {
		held, got := ok()
		if held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, got)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// userHolds fails t unless user holds n slots within 2s.
func userHolds(t *testing.T, lim *limiter.Limiter, user string, n int, why string) {
	t.Helper()
	eventually(t, why, func() (bool, string) {
		held, err := lim.Slots(context.Background(), user)
		return err == nil && held.Used == n, fmt.Sprintf("the user holds %+v (%v); want %d slots", held, err, n)
	})
}

// keyHolds fails t unless pool key model=key holds n members within 2s.
func keyHolds(t *testing.T, lim *limiter.Limiter, pool, key string, n int, why string) {
	t.Helper()
	eventually(t, why, func() (bool, string) {
		got, err := lim.PoolSlots(context.Background(), pool, key)
		return err == nil && got.Used == n, fmt.Sprintf("%s=%s holds %+v (%v); want %d", pool, key, got, err, n)
	})
}

// TestAnAcquireAndItsRetryThatBothLeaveFreeTheSlot: an acquire waits for
// a full pool key, holding its user's slot; its retry (same stream id, on
// the same replica or another) extends that slot and waits too; then
// both callers go, the first before the retry or after it. The user's
// slot goes with the last: the user holds nothing, rather than a slot
// nobody holds until its TTL.
func TestAnAcquireAndItsRetryThatBothLeaveFreeTheSlot(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct{ replica, firstLeaves int }{
		"on the same replica, the first leaving first": {0, 0},
		"on the same replica, the retry leaving first": {0, 1},
		"on another replica, the first leaving first":  {1, 0},
		"on another replica, the retry leaving first":  {1, 1},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stacks := waitPoolReplicas(t, limitertest.RedisCluster, 2)
			ctx := context.Background()
			mustAcquire(t, stacks[0].Limiter, newUser(t), "low", "gpt-4o")
			user := newUser(t)
			req := limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "retried", Pools: map[string]string{"model": "gpt-4o"}}
			leaveFirst, cancelFirst := context.WithCancel(ctx)
			defer cancelFirst()
			leaveRetry, cancelRetry := context.WithCancel(ctx)
			defer cancelRetry()
			requests := []*queued{queue(t, leaveFirst, stacks[0], stacks[0].Limiter, req, 8*time.Second), nil}
			requests[1] = retryWaiting(t, leaveRetry, stacks[c.replica].Limiter, req)
			cancels := []context.CancelFunc{cancelFirst, cancelRetry}
			for _, i := range []int{c.firstLeaves, 1 - c.firstLeaves} {
				cancels[i]()
				gone(t, requests[i])
			}
			userHolds(t, stacks[1].Limiter, user, 0, "both requests gone")
			keyHolds(t, stacks[1].Limiter, "model", "gpt-4o", 1, "both requests gone")
		})
	}
}

// TestARetryRefusedForOtherPoolsLeavesItsShare: an acquire waits for a
// full pool key holding its user's slot; its retry names other pools (a
// client retrying without the pool, say), extends the slot and is refused
// (ErrPoolsDiffer), leaving its share; when the first gives up too, the
// user holds nothing.
func TestARetryRefusedForOtherPoolsLeavesItsShare(t *testing.T) {
	t.Parallel()
	s := waitPoolReplicas(t, limitertest.RedisCluster, 1)[0]
	ctx := context.Background()
	mustAcquire(t, s.Limiter, newUser(t), "low", "gpt-4o")
	user := newUser(t)
	req := limiter.AcquireRequest{UserID: user, Plan: "low", StreamID: "retried", Pools: map[string]string{"model": "gpt-4o"}}
	leave, cancel := context.WithCancel(ctx)
	defer cancel()
	first := queue(t, leave, s, s.Limiter, req, 8*time.Second)
	retry := req
	retry.Pools = nil
	if res, err := s.Limiter.Acquire(ctx, retry); !errors.Is(err, limiter.ErrPoolsDiffer) {
		t.Fatalf("the retry naming no pool: %+v, %v; want ErrPoolsDiffer", res, err)
	}
	userHolds(t, s.Limiter, user, 1, "the first still waiting")
	cancel()
	if a, ok := first.answer(2 * time.Second); !ok || !errors.Is(a.err, context.Canceled) {
		t.Fatalf("the first request, its caller gone: %+v, %v (answered %v)", a.res, a.err, ok)
	}
	userHolds(t, s.Limiter, user, 0, "both requests gone")
}

// TestAWaitGrantOfAHeldStreamIsAnsweredAsAnExtension: a request of stream
// s waits in its user's queue under plan small (limit 2, reached); its
// retry under plan big (limit 3: the small ticket, at its own limit, is
// owed nothing) takes s. When slots free, the wait grants the first by
// extending s, and answers it as an acquire of a held stream is answered:
// naming other pools than s holds, it is refused (ErrPoolsDiffer) and
// joins none, s held by the retry still; naming the same, it is answered
// by big's tier (s's TTL and heartbeat), not small's.
func TestAWaitGrantOfAHeldStreamIsAnsweredAsAnExtension(t *testing.T) {
	t.Parallel()
	for name, pooled := range map[string]bool{"naming a pool the stream does not hold": true, "naming the same": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ts := []tiers.Tier{
				tiers.Tier{Plan: "small", MaxConcurrentStreams: 2, MaxWait: 10 * time.Second, SlotTTL: 3 * time.Second, HeartbeatInterval: time.Second}.WithDefaults(),
				tiers.Tier{Plan: "big", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second, SlotTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond}.WithDefaults(),
			}
			lim := replicasOf(t, limitertest.RedisCluster, 1, ts, poolTable(t,
				pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(1), MaxWait: 10 * time.Second},
			))[0].Limiter
			ctx := context.Background()
			user := newUser(t)
			mine := holdSlots(t, lim, user, "small", 2)
			req := limiter.AcquireRequest{UserID: user, Plan: "small", StreamID: "s"}
			if pooled {
				req.Pools = map[string]string{"model": "gpt-4o"}
			}
			first := retryWaiting(t, ctx, lim, req)
			if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "big", StreamID: "s"}); err != nil || !res.Granted {
				t.Fatalf("the retry under big, naming no pool: %+v, %v; want granted", res, err)
			}
			for _, id := range mine {
				if _, err := lim.Release(ctx, user, id); err != nil {
					t.Fatal(err)
				}
			}
			a, ok := first.answer(3 * time.Second)
			if pooled {
				if !ok || !errors.Is(a.err, limiter.ErrPoolsDiffer) || a.res.Granted {
					t.Fatalf("the first, naming gpt-4o, once slots freed: %+v, %v (answered %v); want ErrPoolsDiffer", a.res, a.err, ok)
				}
				keyHolds(t, lim, "model", "gpt-4o", 0, "the first refused")
				userHolds(t, lim, user, 1, "the retry holding s")
				return
			}
			if !ok || a.err != nil || !a.res.Granted || a.res.Tier.Plan != "big" || a.res.Limit != 3 {
				t.Fatalf("the first once slots freed: %+v, %v (answered %v); want granted by big's tier, s's", a.res, a.err, ok)
			}
			for i := range 4 {
				time.Sleep(a.res.Tier.HeartbeatInterval)
				if _, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: a.res.Tier.Plan, StreamID: "s"}); err != nil {
					t.Fatalf("heartbeat %d, every %v as answered: %v", i+1, a.res.Tier.HeartbeatInterval, err)
				}
			}
		})
	}
}

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
			mine := holdSlots(t, lim, user, "w", 2)
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

// TestAnExtendedWaitGrantInShadowModeRefusesNothing: request A of stream
// s waits under plan p (limit 1, reached); its retry under plan big
// (limit 3) takes s. p then goes to shadow mode, and A's wait is granted
// by extending s. An extension adds no slot: like an acquire of a held
// stream, the grant says no would-refuse, and is answered by big's limit
// (2 of 3).
func TestAnExtendedWaitGrantInShadowModeRefusesNothing(t *testing.T) {
	t.Parallel()
	off := false
	p := func(enforce *bool) tiers.Tier {
		return tiers.Tier{Plan: "p", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second, Enforce: enforce}.WithDefaults()
	}
	big := tiers.Tier{Plan: "big", MaxConcurrentStreams: 3, MaxWait: 10 * time.Second}.WithDefaults()
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers: []tiers.Tier{p(nil), big}})
	ctx := context.Background()
	user := newUser(t)
	mustAcquireUser(t, s.Limiter, user, "p", "x")
	key, err := s.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	a := startQueued(t, ctx, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "p", StreamID: "s"}, 8*time.Second,
		func() int64 { return zcard(t, s, keys.Queue(key)) })
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "big", StreamID: "s"}); err != nil || !res.Granted {
		t.Fatalf("the retry under big: %+v, %v", res, err)
	}
	if err := s.Table.Replace([]tiers.Tier{p(&off), big}); err != nil {
		t.Fatal(err)
	}
	got, ok := a.answer(3 * time.Second)
	if !ok || got.err != nil || !got.res.Granted {
		t.Fatalf("A once p is in shadow mode: %+v, %v (answered %v); want granted", got.res, got.err, ok)
	}
	if got.res.WouldRefuse != "" {
		t.Errorf("A, granted by extending s: used %d of %d (tier %s), would refuse %q; want no WouldRefuse, as an acquire of a held stream answers",
			got.res.Used, got.res.Limit, got.res.Tier.Plan, got.res.WouldRefuse)
	}
}

// TestAnExtendedWaitGrantAnswersTheVerdictOfTheAcquireThatTookTheStream:
// request A of stream s waits under plan p (limit 1, reached); its retry
// under plan loose (limit 1, shadow mode) takes s over loose's limit:
// would_refuse. p then goes to shadow mode, and A's wait is granted by
// extending s: as an acquire of a held stream does, it answers the
// verdict on the acquire that took s, which the slot's record keeps.
func TestAnExtendedWaitGrantAnswersTheVerdictOfTheAcquireThatTookTheStream(t *testing.T) {
	t.Parallel()
	off := false
	p := func(enforce *bool) tiers.Tier {
		return tiers.Tier{Plan: "p", MaxConcurrentStreams: 1, MaxWait: 10 * time.Second, Enforce: enforce}.WithDefaults()
	}
	loose := tiers.Tier{Plan: "loose", MaxConcurrentStreams: 1, Enforce: &off}.WithDefaults()
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.RedisCluster, Redis: cluster.Options{Timeout: 5 * time.Second},
		Tiers: []tiers.Tier{p(nil), loose}})
	ctx := context.Background()
	user := newUser(t)
	mustAcquireUser(t, s.Limiter, user, "p", "x")
	key, err := s.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	a := startQueued(t, ctx, s.Limiter, limiter.AcquireRequest{UserID: user, Plan: "p", StreamID: "s"}, 8*time.Second,
		func() int64 { return zcard(t, s, keys.Queue(key)) })
	if res, err := s.Limiter.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "loose", StreamID: "s"}); err != nil || !res.Granted ||
		res.WouldRefuse != limiter.CodeStreamLimitReached {
		t.Fatalf("the retry under loose: %+v, %v; want granted over its limit, would refuse stream_limit_reached", res, err)
	}
	if err := s.Table.Replace([]tiers.Tier{p(&off), loose}); err != nil {
		t.Fatal(err)
	}
	got, ok := a.answer(3 * time.Second)
	if !ok || got.err != nil || !got.res.Granted {
		t.Fatalf("A once p is in shadow mode: %+v, %v (answered %v); want granted", got.res, got.err, ok)
	}
	if !got.res.Extended || got.res.WouldRefuse != limiter.CodeStreamLimitReached {
		t.Errorf("A, granted by extending s: extended %v, used %d of %d, would refuse %q; want the retry's verdict, stream_limit_reached",
			got.res.Extended, got.res.Used, got.res.Limit, got.res.WouldRefuse)
	}
}

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

// holdSlots takes n slots of plan for user on lim, and returns their
// stream ids.
func holdSlots(t *testing.T, lim *limiter.Limiter, user, plan string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		res, err := lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: plan})
		if err != nil || !res.Granted {
			t.Fatalf("the user's slots: %+v, %v", res, err)
		}
		out = append(out, res.StreamID)
	}
	return out
}
