package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// joinedStack is one limiter whose Redis calls are logged, with pools
// model (every key capped at 10) and org (every key capped at 10).
func joinedStack(t *testing.T, b limitertest.Backend) (*limitertest.Stack, *callLog) {
	t.Helper()
	log := newCallLog()
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(10)}, pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(10)})
	s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Timeout: 5 * time.Second},
		Limiter: limiter.Options{Keys: keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}, Observer: log, Pools: table}})
	return s, log
}

// poolUsed is how many memberships pool key holds.
func poolUsed(t *testing.T, lim *limiter.Limiter, pool, key string) int {
	t.Helper()
	got, err := lim.PoolSlots(context.Background(), pool, key)
	if err != nil {
		t.Fatal(err)
	}
	return got.Used
}

// TestReleaseJoinedDropsTheMembershipsBesideTheSlot: a holder that kept
// its grant's pool keys releases the slot and both memberships in one
// round trip (the release call alone, no release_pool after it); a key
// the grant did not name but the slot's record does still leaves (after
// it, as Release drops it); a key named that the stream never joined
// keeps its members, another user's stream of the same stream id among
// them; and a degraded grant's key is not sent.
func TestReleaseJoinedDropsTheMembershipsBesideTheSlot(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			s, log := joinedStack(t, b)
			lim, ctx := s.Limiter, context.Background()
			model, org := "m-"+keys.NewStreamID()[:8], "o-"+keys.NewStreamID()[:8]
			join := func(user, stream string, named map[string]string) limiter.AcquireResult {
				t.Helper()
				res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: stream, Pools: named})
				if err != nil || !res.Granted || len(res.Pools) != len(named) {
					t.Fatalf("acquire %s of %s joining %v: %+v, %v", stream, user, named, res, err)
				}
				return res
			}

			// Both keys leave beside the slot.
			user := newUser(t)
			res := join(user, "s-1", map[string]string{"model": model, "org": org})
			log.take()
			if rel, err := lim.ReleaseJoined(ctx, user, res.StreamID, res.Pools); err != nil || !rel.Released {
				t.Fatalf("ReleaseJoined: %+v, %v", rel, err)
			}
			if ops := log.take(); ops["release"] != 1 || ops["release_pool"] != 0 {
				t.Errorf("Redis calls of ReleaseJoined: %v; want one release, no release_pool", ops)
			}
			if n, m, o := held(t, lim, user), poolUsed(t, lim, "model", model), poolUsed(t, lim, "org", org); n != 0 || m != 0 || o != 0 {
				t.Errorf("after ReleaseJoined: user holds %d, model=%s %d, org=%s %d; want all 0", n, model, m, org, o)
			}

			// The grant's keys less one: the record's other key leaves after.
			res = join(user, "s-2", map[string]string{"model": model, "org": org})
			log.take()
			if rel, err := lim.ReleaseJoined(ctx, user, res.StreamID, res.Pools[:1]); err != nil || !rel.Released {
				t.Fatalf("ReleaseJoined naming %+v: %+v, %v", res.Pools[:1], rel, err)
			}
			if ops := log.take(); ops["release"] != 1 || ops["release_pool"] != 1 {
				t.Errorf("Redis calls of ReleaseJoined naming one of two keys: %v; want one release, one release_pool", ops)
			}
			if m, o := poolUsed(t, lim, "model", model), poolUsed(t, lim, "org", org); m != 0 || o != 0 {
				t.Errorf("after ReleaseJoined naming one key: model=%s %d, org=%s %d; want both 0", model, m, org, o)
			}

			// Keys the stream never joined: their members stay, another
			// user's stream of the same id among them.
			other := newUser(t)
			theirs := join(other, "s-3", map[string]string{"model": model})
			mine := join(user, "s-3", map[string]string{"org": org})
			forged := []limiter.PoolGrant{{Pool: "model", Key: model}, {Pool: "org", Key: org}, {Pool: "model", Key: "never-" + model}}
			if rel, err := lim.ReleaseJoined(ctx, user, mine.StreamID, forged); err != nil || !rel.Released {
				t.Fatalf("ReleaseJoined naming keys not joined: %+v, %v", rel, err)
			}
			if m, o := poolUsed(t, lim, "model", model), poolUsed(t, lim, "org", org); m != 1 || o != 0 {
				t.Errorf("after a release naming model=%s it never joined: model %d, org %d; want 1 (the other user's) and 0", model, m, o)
			}
			if n := held(t, lim, other); n != 1 {
				t.Errorf("the other user holds %d slots, want 1", n)
			}

			// A degraded grant's key is not sent: its release is the slot's
			// alone.
			degraded := []limiter.PoolGrant{{Pool: "model", Key: model, Degraded: true}}
			log.take()
			if rel, err := lim.ReleaseJoined(ctx, other, theirs.StreamID, degraded); err != nil || !rel.Released {
				t.Fatalf("ReleaseJoined with a degraded key: %+v, %v", rel, err)
			}
			if ops := log.take(); ops["release"] != 1 || ops["release_pool"] != 1 {
				t.Errorf("Redis calls of ReleaseJoined with only a degraded key: %v; want one release, then the record's key in one release_pool", ops)
			}
			if m := poolUsed(t, lim, "model", model); m != 0 {
				t.Errorf("model=%s holds %d after its member's release, want 0", model, m)
			}
		})
	}
}
