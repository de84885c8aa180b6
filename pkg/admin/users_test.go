package admin_test

import (
	"context"
	"fmt"
	"net/http"
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
	if got, want := planLimits(apitest.Decode[httpapi.AdminSlotsResponse](t, list(one), http.StatusOK).PlanLimits), "three=3"; got != want {
		t.Errorf("plan_limits of 2 slots of plan three: got %s, want %s", got, want)
	}

	// Plan one allows 1, counting every slot the user holds: its slot is
	// taken first.
	mixed := newUser()
	if res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: mixed, Plan: "one"}); err != nil || !res.Granted {
		t.Fatalf("acquire of plan one: got %+v, %v, want granted", res, err)
	}
	e.hold(t, mixed, 1)
	if got, want := planLimits(apitest.Decode[httpapi.AdminSlotsResponse](t, list(mixed), http.StatusOK).PlanLimits), "one=1 three=3"; got != want {
		t.Errorf("plan_limits of slots of plans one and three: got %s, want %s", got, want)
	}

	if r := list(newUser()); r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"plan_limits":[]`) {
		t.Errorf("answer for a user holding nothing: got %d %s, want 200 with plan_limits []", r.Status, r.Body)
	}
}

// planLimits shows limits as "plan=limit" in order, with " (shadow)" after
// a plan in shadow mode and " (enforce absent)" where the field is
// missing: this server always sends it.
func planLimits(limits []httpapi.AdminPlanLimit) string {
	parts := make([]string, len(limits))
	for i, l := range limits {
		parts[i] = fmt.Sprintf("%s=%d", l.Plan, l.Limit)
		switch {
		case l.Enforce == nil:
			parts[i] += " (enforce absent)"
		case !*l.Enforce:
			parts[i] += " (shadow)"
		}
	}
	return strings.Join(parts, " ")
}
