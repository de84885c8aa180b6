package admin_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// newShadowEnv is an admin env whose limiter holds, beside the test
// plans, the plan trial (1 stream) in shadow mode, and the pools model
// (gpt-4o capped at 1, enforced) and provider (openai capped at 1, in
// shadow mode).
func newShadowEnv(t *testing.T) *adminEnv {
	t.Helper()
	off := false
	plans := append(limitertest.Tiers(), tiers.Tier{Plan: "trial", MaxConcurrentStreams: 1, SlotTTL: 10 * time.Second,
		HeartbeatInterval: time.Second, FailureMode: tiers.FailOpen, Enforce: &off})
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}}.WithDefaults(),
		pools.Pool{Pool: "provider", Keys: map[string]int{"openai": 1}, Enforce: &off}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	return newAdminEnvOn(t, limitertest.Options{Tiers: plans, Limiter: limiter.Options{Pools: table}}, nil)
}

// TestAdminMarksShadowMode: a plan or pool in shadow mode (enforce:
// false) refuses nothing, so its user or key holds more than its limit;
// the listings say so beside the limit ("enforce": false), and say
// "enforce": true beside a limit that refuses, so support can tell a
// shadow plan's "3 of 1" from a lockout.
func TestAdminMarksShadowMode(t *testing.T) {
	t.Parallel()
	e := newShadowEnv(t)
	ctx := context.Background()
	acquire := func(user, plan string, pools map[string]string) limiter.AcquireResult {
		t.Helper()
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: plan, Pools: pools})
		if err != nil || !res.Granted {
			t.Fatalf("acquire of %s on plan %s joining %v: got %+v, %v, want granted", user, plan, pools, res, err)
		}
		return res
	}
	listUser := func(user string) (httpapi.AdminSlotsResponse, string) {
		t.Helper()
		r := e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken})
		return apitest.Decode[httpapi.AdminSlotsResponse](t, r, http.StatusOK), string(r.Body)
	}

	// Plan trial allows 1 and refuses nothing: 3 slots, 2 of them above it.
	shadowed := newUser()
	for i := range 3 {
		if res := acquire(shadowed, "trial", nil); (res.WouldRefuse == limiter.CodeStreamLimitReached) != (i > 0) {
			t.Fatalf("acquire %d of plan trial (1, shadow mode): got would_refuse %q, want it from the 2nd on", i+1, res.WouldRefuse)
		}
	}
	got, body := listUser(shadowed)
	if got.Used != 3 || planLimits(got.PlanLimits) != "trial=1 (shadow)" {
		t.Errorf("user of plan trial: got used %d, plan_limits %s; want 3 of trial=1 (shadow)", got.Used, planLimits(got.PlanLimits))
	}
	if !strings.Contains(body, `"plan_limits":[{"plan":"trial","limit":1,"enforce":false}]`) {
		t.Errorf("answer for a user of a plan in shadow mode: got %s, want plan_limits saying enforce false", body)
	}

	enforced := newUser()
	acquire(enforced, "three", nil)
	if got, _ := listUser(enforced); planLimits(got.PlanLimits) != "three=3" {
		t.Errorf("user of plan three: got plan_limits %s, want three=3, enforced", planLimits(got.PlanLimits))
	}

	both := newUser()
	acquire(both, "three", nil)
	acquire(both, "trial", nil) // 2 held, trial allows 1: would refuse
	if got, _ := listUser(both); planLimits(got.PlanLimits) != "three=3 trial=1 (shadow)" {
		t.Errorf("user of plans three and trial: got plan_limits %s, want three=3 trial=1 (shadow)", planLimits(got.PlanLimits))
	}

	// Pool provider caps openai at 1 and refuses nothing: 2 memberships.
	for i, user := range []string{newUser(), newUser()} {
		res := acquire(user, "three", map[string]string{"provider": "openai"})
		if (res.WouldRefuse == limiter.CodePoolLimitReached) != (i > 0) {
			t.Fatalf("stream %d joining provider=openai (1, shadow mode): got would_refuse %q, want it on the 2nd", i+1, res.WouldRefuse)
		}
	}
	acquire(newUser(), "three", map[string]string{"model": "gpt-4o"})
	for _, tc := range []struct {
		pool, key   string
		used, limit int
		enforce     bool
	}{
		{"provider", "openai", 2, 1, false},
		{"model", "gpt-4o", 1, 1, true},
	} {
		r := e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath(tc.pool, tc.key), token: viewerToken})
		got := apitest.Decode[httpapi.AdminPoolKeyResponse](t, r, http.StatusOK)
		if got.Used != tc.used || got.Limit == nil || *got.Limit != tc.limit || got.Enforce == nil || *got.Enforce != tc.enforce {
			t.Errorf("pool key %s=%s: got %s, want used %d, limit %d, enforce %v", tc.pool, tc.key, r.Body, tc.used, tc.limit, tc.enforce)
		}
	}
}
