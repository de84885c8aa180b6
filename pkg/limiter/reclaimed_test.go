package limiter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// reclaimLog records Reclaimed reports; the rest of Observer is ignored.
type reclaimLog struct {
	mu    sync.Mutex
	plans map[string]int
}

func (r *reclaimLog) Acquired(context.Context, tiers.Tier, limiter.AcquireResult, error) {}
func (r *reclaimLog) Heartbeated(context.Context, limiter.HeartbeatResult, error)        {}
func (r *reclaimLog) Released(context.Context, limiter.ReleaseResult, error)             {}
func (r *reclaimLog) RedisCall(context.Context, string, time.Duration, error)            {}
func (r *reclaimLog) Waiting(context.Context, tiers.Tier, int)                           {}
func (r *reclaimLog) Waited(context.Context, tiers.Tier, limiter.WaitOutcome, time.Duration) {
}
func (r *reclaimLog) Joined(context.Context, string, limiter.JoinOutcome, int, int) {}
func (r *reclaimLog) PoolWaiting(context.Context, string, int, int)                 {}
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

// TestEveryOperationCountsExpiredSlots: a slot that expired unreleased is
// counted as reclaimed by whichever operation finds it first, so the leak
// signal does not depend on the user acquiring again.
func TestEveryOperationCountsExpiredSlots(t *testing.T) {
	eachBackend(t, true, func(t *testing.T, e *env) {
		log := &reclaimLog{plans: map[string]int{}}
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

var _ limiter.Observer = (*reclaimLog)(nil)
