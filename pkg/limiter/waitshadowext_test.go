package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

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
