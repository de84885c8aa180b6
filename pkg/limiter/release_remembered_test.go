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

// rememberedReplicas are two limiters on the same Redis and keys, each
// with its Redis calls logged, with pools model and org (every key
// capped at 10).
func rememberedReplicas(t *testing.T, b limitertest.Backend) ([2]*limiter.Limiter, [2]*callLog) {
	t.Helper()
	table := poolTable(t, pools.Pool{Pool: "model", MaxConcurrentStreams: ptr(10)}, pools.Pool{Pool: "org", MaxConcurrentStreams: ptr(10)})
	prefix := keys.Schema{Prefix: "limitertest:" + keys.NewStreamID()[:12] + ":"}
	var lims [2]*limiter.Limiter
	var logs [2]*callLog
	var addrs []string
	for i := range lims {
		logs[i] = newCallLog()
		s := limitertest.New(t, limitertest.Options{Backend: b, Redis: cluster.Options{Addrs: addrs, Timeout: 5 * time.Second},
			Limiter: limiter.Options{Keys: prefix, Observer: logs[i], Pools: table}})
		addrs = s.Redis.Addrs()
		lims[i] = s.Limiter
	}
	return lims, logs
}

// TestReleaseDropsThisReplicasGrantsMembershipsBesideTheSlot: Release of
// a pooled stream that the same limiter granted on nobody's behalf sends
// both memberships beside the slot (one release call, no release_pool
// after it); released on another replica, or granted on a caller's
// behalf, the record names them and they leave after (two calls). Every
// way, the memberships are gone. The stream's memory goes with its
// release: the same stream id granted again with one pool sends that
// one only, and another user's stream of the same id, in the other
// pool, keeps its membership.
func TestReleaseDropsThisReplicasGrantsMembershipsBesideTheSlot(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			lims, logs := rememberedReplicas(t, b)
			ctx := context.Background()
			model, org := "m-"+keys.NewStreamID()[:8], "o-"+keys.NewStreamID()[:8]
			both := map[string]string{"model": model, "org": org}
			join := func(lim *limiter.Limiter, caller, user, stream string, named map[string]string) {
				t.Helper()
				res, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", StreamID: stream, Caller: caller, Pools: named})
				if err != nil || !res.Granted || len(res.Pools) != len(named) {
					t.Fatalf("acquire %s of %s joining %v: %+v, %v", stream, user, named, res, err)
				}
			}
			release := func(lim *limiter.Limiter, log *callLog, caller, user, stream string, wantPoolCalls int) {
				t.Helper()
				log.take()
				if rel, err := lim.ReleaseAs(ctx, caller, user, stream); err != nil || !rel.Released {
					t.Fatalf("release of %s by %q: %+v, %v", stream, caller, rel, err)
				}
				if ops := log.take(); ops["release"] != 1 || ops["release_pool"] != wantPoolCalls {
					t.Errorf("Redis calls of the release of %s by %q: %v; want one release, %d release_pool", stream, caller, ops, wantPoolCalls)
				}
			}
			empty := func(when string) {
				t.Helper()
				if m, o := poolUsed(t, lims[0], "model", model), poolUsed(t, lims[0], "org", org); m != 0 || o != 0 {
					t.Errorf("%s: model=%s holds %d, org=%s %d; want both 0", when, model, m, org, o)
				}
			}
			user := newUser(t)

			join(lims[0], "", user, "s-1", both)
			release(lims[0], logs[0], "", user, "s-1", 0)
			empty("released by the replica that granted it")

			join(lims[0], "", user, "s-2", both)
			release(lims[1], logs[1], "", user, "s-2", 1)
			empty("released by another replica")

			join(lims[0], "alice", user, "s-3", both)
			release(lims[0], logs[0], "alice", user, "s-3", 1)
			empty("granted and released on alice's behalf")

			// s-2's memory went with its release on the other replica's
			// watch: granted again here, with one pool, only that one is
			// sent; another user's s-2 in model keeps its membership.
			other := newUser(t)
			join(lims[1], "", other, "s-2", map[string]string{"model": model})
			join(lims[0], "", user, "s-2", map[string]string{"org": org})
			release(lims[0], logs[0], "", user, "s-2", 0)
			if m, o := poolUsed(t, lims[0], "model", model), poolUsed(t, lims[0], "org", org); m != 1 || o != 0 {
				t.Errorf("after %s's s-2 released: model %d (the other user's s-2), org %d; want 1 and 0", user, m, o)
			}
			if n := held(t, lims[0], other); n != 1 {
				t.Errorf("the other user holds %d slots, want 1", n)
			}
		})
	}
}
