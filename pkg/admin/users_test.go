package admin_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

// TestAdminSlotsPlanLimits: a user has no one limit (each acquire is
// judged by its own plan's), so the listing names the limit of each plan
// the user holds, by name; none for a user holding nothing.
func TestAdminSlotsPlanLimits(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	list := func(user string) apitest.Reply {
		return e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken})
	}

	one := newUser()
	e.hold(t, one, 2)
	if got, want := apitest.Decode[httpapi.AdminSlotsResponse](t, list(one), http.StatusOK).PlanLimits, []httpapi.AdminPlanLimit{{Plan: "three", Limit: 3}}; !slices.Equal(got, want) {
		t.Errorf("plan_limits of 2 slots of plan three: got %+v, want %+v", got, want)
	}

	// Plan one allows 1, counting every slot the user holds: its slot is
	// taken first.
	mixed := newUser()
	if res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: mixed, Plan: "one"}); err != nil || !res.Granted {
		t.Fatalf("acquire of plan one: got %+v, %v, want granted", res, err)
	}
	e.hold(t, mixed, 1)
	want := []httpapi.AdminPlanLimit{{Plan: "one", Limit: 1}, {Plan: "three", Limit: 3}}
	if got := apitest.Decode[httpapi.AdminSlotsResponse](t, list(mixed), http.StatusOK).PlanLimits; !slices.Equal(got, want) {
		t.Errorf("plan_limits of slots of plans one and three: got %+v, want %+v", got, want)
	}

	if r := list(newUser()); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"plan_limits":[]`) {
		t.Errorf("answer for a user holding nothing: got %d %s, want 200 with plan_limits []", r.Status, r.Body)
	}
}
