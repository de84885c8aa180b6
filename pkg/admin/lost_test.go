package admin_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// TestAdminReleaseWhoseReplyIsLost: the connection to Redis drops after
// release_all ran and before its apitest.Reply came back, and the Redis client
// sends it again. The answer and its audit record must still name exactly
// what was released, or say that this is not known.
func TestAdminReleaseWhoseReplyIsLost(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	e := newAdminEnvOn(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}}}, nil)
	if _, err := e.lim.ReleaseAll(context.Background(), newUser(), "warm-up"); err != nil { // loads the script
		t.Fatal(err)
	}
	reason := `{"reason":"ticket 4812: locked out after a crash"}`

	t.Run("one apitest.Reply lost: the answer and the record name the released slots", func(t *testing.T) {
		user := newUser()
		held := e.hold(t, user, 2)
		proxy.DropReplies(1)
		r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: reason})
		res := apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK)
		if !sameIDs(res.Released, held) {
			t.Errorf("released: got %v, want %v", res.Released, held)
		}
		rec := e.streamRecords(t)[0]
		if rec.AuditID != res.AuditID || rec.Outcome != httpapi.OutcomeOK || !sameIDs(rec.Released, held) {
			t.Errorf("audit record: got id %s outcome %q released %v, want id %s outcome ok released %v", rec.AuditID, rec.Outcome, rec.Released, res.AuditID, held)
		}
	})

	t.Run("every apitest.Reply lost: 503 outcome_unknown, and the record says so", func(t *testing.T) {
		user := newUser()
		e.hold(t, user, 1)
		proxy.DropReplies(1 << 20)
		r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: reason})
		proxy.DropReplies(0)
		apitest.WantError(t, r, http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
		rec := e.streamRecords(t)[0]
		if rec.AuditID != r.Header.Get(httpapi.HeaderAuditID) || rec.Outcome != httpapi.CodeOutcomeUnknown || rec.Status != http.StatusServiceUnavailable || len(rec.Released) != 0 {
			t.Errorf("audit record: got %+v, want this call's, outcome %s, status 503, nothing named released", rec, httpapi.CodeOutcomeUnknown)
		}
	})

	// A removal sent again after a lost apitest.Reply would answer "none in
	// force" for the override the first run removed: it is never sent
	// again, and a lost apitest.Reply is answered as not known.
	t.Run("an override's removal with its apitest.Reply lost: 503 outcome_unknown, not \"none\"", func(t *testing.T) {
		if _, err := e.lim.RemoveOverride(context.Background(), newUser()); err != nil { // loads the script
			t.Fatal(err)
		}
		user := newUser()
		if _, err := e.lim.SetOverride(context.Background(), user, limiter.OverrideRequest{MaxConcurrentStreams: 5, For: time.Hour, Actor: "ola", Reason: "r"}); err != nil {
			t.Fatal(err)
		}
		proxy.DropReplies(1 << 20)
		r := e.do(t, adminCall{method: "DELETE", path: httpapi.AdminUserOverridePath(user), token: operatorToken, body: reason})
		proxy.DropReplies(0)
		apitest.WantError(t, r, http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
		rec := e.streamRecords(t)[0]
		if rec.AuditID != r.Header.Get(httpapi.HeaderAuditID) || rec.Action != httpapi.ActionRemoveOverride || rec.Outcome != httpapi.CodeOutcomeUnknown || rec.OverrideRemoved != nil {
			t.Errorf("audit record: got %+v, want this call's remove_override, outcome %s, no removed said", rec, httpapi.CodeOutcomeUnknown)
		}
		if listed, err := e.lim.Slots(context.Background(), user); err != nil || listed.Override != nil {
			t.Errorf("override after the lost apitest.Reply: got %+v, %v; want it gone (the script ran)", listed.Override, err)
		}
	})
}

// TestAdminOverrideWhoseReplyIsLost: the set_override and remove_override
// scripts run, and their replies are lost (every attempt's). The answer,
// its audit record and limiter_overrides_active's count say what Redis
// holds after: a set in force is answered and recorded as set, and
// counted; a removal is outcome_unknown (whether it or the expiry took
// the override is not known), and the override gone is no longer
// counted. The admin API's outage answers name no plan and no user's
// slots for a pool key.
func TestAdminOverrideWhoseReplyIsLost(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	two := 2
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", MaxConcurrentStreams: &two}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	e := newAdminEnvOn(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}},
		Limiter: limiter.Options{Pools: table}}, nil)
	ctx := context.Background()
	count := func() int {
		t.Helper()
		n, err := e.lim.ActiveOverrides(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Loads the scripts.
	warm := httpapi.AdminUserOverridePath(newUser())
	r := e.do(t, adminCall{method: "POST", path: warm, token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":3600,"reason":"warm"}`})
	apitest.Decode[httpapi.AdminOverrideResponse](t, r, http.StatusOK)
	r = e.do(t, adminCall{method: "DELETE", path: warm, token: operatorToken, body: `{"reason":"warm"}`})
	apitest.Decode[httpapi.AdminOverrideRemoveResponse](t, r, http.StatusOK)
	for _, path := range []string{httpapi.AdminUserOverridePath(newUser()), httpapi.AdminPoolKeyOverridePath("model", "lost-"+strings.ToLower(newUser()))} {
		before := count()

		proxy.DropReplies(1 << 20)
		r = e.do(t, adminCall{method: "POST", path: path, token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":3600,"reason":"ticket 1"}`})
		proxy.DropReplies(0)
		if r.Status != http.StatusOK {
			t.Fatalf("%s: a set whose replies were lost, in force: %d %s; want 200", path, r.Status, r.Body)
		}
		if rec := e.streamRecords(t)[0]; rec.Outcome != httpapi.OutcomeOK || rec.Override == nil || rec.Override.MaxConcurrentStreams != 5 {
			t.Errorf("%s: audit record of the set in force: outcome %q, override %+v; want ok, 5 streams", path, rec.Outcome, rec.Override)
		}
		if n := count(); n != before+1 {
			t.Errorf("%s: limiter_overrides_active after the set in force: %d; want %d", path, n, before+1)
		}

		proxy.DropReplies(1 << 20)
		r = e.do(t, adminCall{method: "DELETE", path: path, token: operatorToken, body: `{"reason":"ticket 1 done"}`})
		proxy.DropReplies(0)
		got := apitest.WantError(t, r, http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
		if strings.Contains(got.Message, "user's slots") || strings.Contains(got.Message, "plan") {
			t.Errorf("%s: the removal's answer %q names a user's slots or a plan", path, got.Message)
		}
		if rec := e.streamRecords(t)[0]; rec.Outcome != httpapi.CodeOutcomeUnknown {
			t.Errorf("%s: audit record of the removal: outcome %q; want %s", path, rec.Outcome, httpapi.CodeOutcomeUnknown)
		}
		if n := count(); n != before {
			t.Errorf("%s: limiter_overrides_active after the override went: %d; want %d", path, n, before)
		}
	}

	proxy.BlackHole()
	r = e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(newUser()), token: viewerToken})
	if got := apitest.WantError(t, r, http.StatusServiceUnavailable, httpapi.CodeUnavailable); strings.Contains(got.Message, "plan") {
		t.Errorf("an admin listing in an outage answers %q: no plan fails closed here", got.Message)
	}
}

// TestAnOverrideSetThatNeverRanIsNotAnsweredSet: an operator sets a
// user's override again (the same limit, actor and reason, for longer),
// and the set_override call is lost on its way (it never runs). The
// override read back is the earlier one, not this call's: the answer and
// its audit record say outcome_unknown, not a set, and the override
// keeps its earlier expiry.
func TestAnOverrideSetThatNeverRanIsNotAnsweredSet(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	e := newAdminEnvOn(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}}}, nil)
	path := httpapi.AdminUserOverridePath(newUser())
	r := e.do(t, adminCall{method: "POST", path: path, token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":600,"reason":"ticket 1"}`})
	first := apitest.Decode[httpapi.AdminOverrideResponse](t, r, http.StatusOK)

	proxy.DropCalls(1 << 20) // every try of the next set is lost on its way
	r = e.do(t, adminCall{method: "POST", path: path, token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":86400,"reason":"ticket 1"}`})
	proxy.DropCalls(0)
	apitest.WantError(t, r, http.StatusServiceUnavailable, httpapi.CodeOutcomeUnknown)
	if rec := e.streamRecords(t)[0]; rec.Outcome != httpapi.CodeOutcomeUnknown || rec.Override != nil {
		t.Errorf("audit record of a set that never ran: outcome %q, override %+v; want %s, none", rec.Outcome, rec.Override, httpapi.CodeOutcomeUnknown)
	}
	listed, err := e.lim.Slots(context.Background(), strings.TrimSuffix(strings.TrimPrefix(path, "/v1/admin/users/"), "/override"))
	if err != nil || listed.Override == nil || !listed.Override.ExpiresAt.Equal(first.Override.ExpiresAt) {
		t.Errorf("the override after a set that never ran: %+v, %v; want the earlier one, until %v", listed.Override, err, first.Override.ExpiresAt)
	}
}
