package limiter_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// reclaimLog records Reclaimed and PoolReclaimed reports; the rest of
// Observer is ignored.
type reclaimLog struct {
	mu    sync.Mutex
	plans map[string]int
	pools map[string]int
}

func (r *reclaimLog) Acquired(context.Context, tiers.Tier, limiter.AcquireResult, error) {}
func (r *reclaimLog) Heartbeated(context.Context, limiter.HeartbeatResult, error)        {}
func (r *reclaimLog) Released(context.Context, limiter.ReleaseResult, error)             {}
func (r *reclaimLog) RedisCall(context.Context, string, time.Duration, error)            {}
func (r *reclaimLog) Waiting(context.Context, tiers.Tier, int)                           {}
func (r *reclaimLog) Waited(context.Context, tiers.Tier, limiter.WaitOutcome, time.Duration) {
}
func (r *reclaimLog) Joined(context.Context, string, limiter.JoinOutcome, int, int) {}
func (r *reclaimLog) PoolReclaimed(_ context.Context, pool string, members int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pools[pool] += members
}
func (r *reclaimLog) PoolWaiting(context.Context, string, int, int) {}
func (r *reclaimLog) PoolWaited(context.Context, string, int, limiter.WaitOutcome, time.Duration) {
}
func (r *reclaimLog) Reclaimed(_ context.Context, plan string, slots int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plans[plan] += slots
}

func (r *reclaimLog) take() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.plans
	r.plans = map[string]int{}
	return got
}

func (r *reclaimLog) takePools() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.pools
	r.pools = map[string]int{}
	return got
}

// TestEveryOperationCountsExpiredSlots: a slot that expired unreleased is
// counted as reclaimed by whichever operation finds it first, so the leak
// signal does not depend on the user acquiring again.
func TestEveryOperationCountsExpiredSlots(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		log := &reclaimLog{plans: map[string]int{}, pools: map[string]int{}}
		lim := limiter.New(e.redis, e.table, limiter.Options{Keys: e.keys, Observer: log})
		ctx := context.Background()
		expire := func(user string, streams ...string) {
			for _, s := range streams {
				e.acquire(t, user, "short", s)
			}
			time.Sleep(400 * time.Millisecond) // > the 300ms TTL
		}

		user := newUser(t)
		expire(user, "a", "b")
		if _, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "short", StreamID: "a"}); err == nil {
			t.Fatal("heartbeat on an expired slot succeeded")
		}
		if got := log.take(); got["short"] != 2 {
			t.Errorf("heartbeat reclaimed %v, want 2 on plan short", got)
		}

		user = newUser(t)
		expire(user, "a")
		res, err := lim.Release(ctx, user, "a")
		if err != nil || res.Released {
			t.Errorf("release of an expired slot = %+v, %v; want released false (it was no longer held)", res, err)
		}
		if got := log.take(); got[""] != 1 {
			t.Errorf("release reclaimed %v, want 1 without a plan", got)
		}

		user = newUser(t)
		e.acquire(t, user, "three", "live") // 10s TTL
		expire(user, "old")
		ids, err := lim.ReleaseAll(ctx, user, newAuditID())
		if err != nil || len(ids) != 1 || ids[0] != "live" {
			t.Errorf("ReleaseAll = %v, %v; want only the live slot [live]", ids, err)
		}
		if got := log.take(); got[""] != 1 {
			t.Errorf("ReleaseAll reclaimed %v, want the 1 expired slot", got)
		}
	})
}

// TestPoolMembershipsThatExpireAreCountedByPool: a pool key's membership
// that expired instead of being left (its holder crashed) is counted by
// pool, not as a slot of the plan of whoever found it, when an acquire
// joining the key or a heartbeat of another member finds it.
func TestPoolMembershipsThatExpireAreCountedByPool(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		log := &reclaimLog{plans: map[string]int{}, pools: map[string]int{}}
		lim := limiter.New(e.redis, e.table, limiter.Options{Keys: e.keys, Observer: log,
			Pools: poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(5)})})
		ctx := context.Background()
		key := "k-" + newUser(t)
		crash := func(n int) {
			t.Helper()
			for range n {
				if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "short", Pools: map[string]string{"model": key}}); err != nil || !res.Granted {
					t.Fatalf("acquire: %+v, %v", res, err)
				}
			}
		}
		crash(2)
		time.Sleep(400 * time.Millisecond) // > the 300ms TTL
		liveUser := newUser(t)
		live, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: liveUser, Plan: "three", Pools: map[string]string{"model": key}})
		if err != nil || !live.Granted {
			t.Fatalf("acquire: %+v, %v", live, err)
		}
		if got, plans := log.takePools(), log.take(); got["model"] != 2 || len(plans) != 0 {
			t.Errorf("an acquire found 2 expired members of model=%s: pools %v, plans %v; want model 2 and no plan", key, got, plans)
		}
		crash(1)
		time.Sleep(400 * time.Millisecond)
		if res, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: liveUser, Plan: "three", StreamID: live.StreamID}); err != nil || !res.Alive {
			t.Fatalf("the live stream's heartbeat: %+v, %v", res, err)
		}
		if got, plans := log.takePools(), log.take(); got["model"] != 1 || len(plans) != 0 {
			t.Errorf("a heartbeat found 1 expired member of model=%s: pools %v, plans %v; want model 1 and no plan", key, got, plans)
		}
		crash(1)
		time.Sleep(400 * time.Millisecond)
		if rel, err := lim.Release(ctx, liveUser, live.StreamID); err != nil || !rel.Released {
			t.Fatalf("the live stream's release: %+v, %v", rel, err)
		}
		if got, plans := log.takePools(), log.take(); got["model"] != 1 || len(plans) != 0 {
			t.Errorf("a release found 1 expired member of model=%s: pools %v, plans %v; want model 1 and no plan", key, got, plans)
		}
	})
}

// TestAStreamLostAtOnePoolStillCountsWhatItsBeatOfAnotherFound: stream S
// holds memberships of a=ka and b=kb; its membership of a=ka is removed
// (support, a failover), and a crashed stream's membership of b=kb has
// expired. S's heartbeat answers slot_lost naming a=ka; its beat of b=kb
// removed the expired membership, which is counted all the same: nothing
// later can count it.
func TestAStreamLostAtOnePoolStillCountsWhatItsBeatOfAnotherFound(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		log := &reclaimLog{plans: map[string]int{}, pools: map[string]int{}}
		lim := limiter.New(e.redis, e.table, limiter.Options{Keys: e.keys, Observer: log,
			Pools: poolTable(t, pools.Pool{Pool: "a", MaxConcurrentStreams: ptr(5)}, pools.Pool{Pool: "b", MaxConcurrentStreams: ptr(5)})})
		ctx := context.Background()
		ka, kb, user := "ka-"+newUser(t), "kb-"+newUser(t), newUser(t)
		s, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"a": ka, "b": kb}})
		if err != nil || !s.Granted || len(s.Pools) != 2 {
			t.Fatalf("acquire: %+v, %v", s, err)
		}
		if res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: newUser(t), Plan: "short", Pools: map[string]string{"b": kb}}); err != nil || !res.Granted {
			t.Fatalf("the crashed stream's acquire: %+v, %v", res, err)
		}
		time.Sleep(400 * time.Millisecond) // > the 300ms TTL
		slots, err := e.keys.PoolKey("a", ka)
		if err != nil {
			t.Fatal(err)
		}
		c := e.raw(t)
		if err := c.Do(ctx, c.B().Zrem().Key(slots).Member(s.StreamID+" "+user).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		log.takePools()
		if _, err := lim.Heartbeat(ctx, limiter.HeartbeatRequest{UserID: user, Plan: "three", StreamID: s.StreamID}); !errors.Is(err, limiter.ErrSlotLost) {
			t.Fatalf("the heartbeat of S, its membership of a=%s gone: %v; want ErrSlotLost", ka, err)
		}
		if got := log.takePools(); got["b"] != 1 {
			t.Errorf("S's beat of b=%s removed the crashed stream's expired membership: pools reclaimed %v; want b 1", kb, got)
		}
	})
}

var _ limiter.Observer = (*reclaimLog)(nil)
