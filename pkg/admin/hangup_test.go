package admin_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// hangUpEnv is an admin env on a private Redis behind a proxy whose
// latency the test sets, with the pool model (gpt-4o capped at 3). Its
// per-call deadline is 2s: a call 60ms away each way meets it on a busy
// machine too, where 250ms was met by the calls but not always by the
// audit's append after them.
func hangUpEnv(t *testing.T) (*adminEnv, *testenv.Proxy) {
	t.Helper()
	srv := testenv.StartRedis(t)
	proxy := testenv.StartProxy(t, srv.Addr())
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 3}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	e := newAdminEnvOn(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{proxy.Addr()}, Timeout: 2 * time.Second}, Limiter: limiter.Options{Pools: table}}, nil)
	ctx := context.Background()
	// Load every script the calls below use.
	if _, err := e.lim.ReleaseAll(ctx, newUser(), "warm-up"); err != nil {
		t.Fatal(err)
	}
	w := newUser()
	if _, err := e.lim.SetOverride(ctx, w, limiter.OverrideRequest{MaxConcurrentStreams: 1, For: time.Minute, Actor: "ola", Reason: "warm"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.lim.RemoveOverride(ctx, w); err != nil {
		t.Fatal(err)
	}
	return e, proxy
}

// hangUp sends an operator's call whose client gives up after 40ms: the
// request reaches the admin listener, which sends the call to Redis (60ms
// away each way, well within the per-call deadline), and the operator's
// CLI (--timeout) or browser tab goes away before the answer.
func (e *adminEnv) hangUp(t *testing.T, method, path, body string) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	resp, err := (&http.Client{Timeout: 40 * time.Millisecond}).Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("%s %s answered %d within 40ms: the hang-up was not exercised", method, path, resp.StatusCode)
	}
	time.Sleep(time.Second) // the call has run in Redis, the handler has returned
}

// newest returns the newest audit record of action, waiting up to 5s for
// the call's handler to append it.
func (e *adminEnv) newest(t *testing.T, action string) httpapi.AuditRecord {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		for _, rec := range e.streamRecords(t) {
			if rec.Action == action {
				return rec
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s record in the audit stream within 5s; the log:\n%s", action, e.log.String())
		}
	}
}

// TestAReleaseAllWhoseCallerHangsUpRunsWholeAndIsAuditedAsItRan (DESIGN
// §10 P6, §16; openapi adminReleaseAll "Exact answers"): an operator's
// client that goes away while release_all is on its way to Redis changes
// neither what the call does nor what its audit record says. The call
// runs whole (the user's slots go, and their streams' pool memberships
// with them, or model=gpt-4o would stay full of streams that no longer
// exist until their TTL) and its record says ok, naming the streams
// released, not outcome_unknown.
func TestAReleaseAllWhoseCallerHangsUpRunsWholeAndIsAuditedAsItRan(t *testing.T) {
	e, proxy := hangUpEnv(t)
	ctx := context.Background()
	user := newUser()
	var held []string
	for range 2 {
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"model": "gpt-4o"}})
		if err != nil || !res.Granted {
			t.Fatalf("acquire: %+v, %v", res, err)
		}
		held = append(held, res.StreamID)
	}

	proxy.SetLatency(60 * time.Millisecond)
	e.hangUp(t, "POST", httpapi.AdminUserReleasePath(user), `{"reason":"ticket 4812: locked out after a crash"}`)
	proxy.SetLatency(0)

	slots, err := e.lim.Slots(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.newest(t, httpapi.ActionReleaseAll)
	t.Logf("user slots now: %d; audit record: outcome %q status %d released %v", slots.Used, rec.Outcome, rec.Status, rec.Released)
	if slots.Used != 0 {
		t.Errorf("the user holds %d slots after the release; want 0: the call runs whole when its caller hangs up", slots.Used)
	}
	if rec.Outcome != httpapi.OutcomeOK || !sameIDs(rec.Released, held) {
		t.Errorf("the release's audit record says outcome %q, released %v; want ok, released %v",
			rec.Outcome, rec.Released, held)
	}
	key, err := e.lim.PoolSlots(ctx, "model", "gpt-4o")
	if err != nil {
		t.Fatal(err)
	}
	if key.Used != 0 {
		t.Errorf("model=gpt-4o after the user's streams were released: %d memberships still held (of streams whose slots are gone); want 0", key.Used)
	}
}

// TestAnOverrideRemovalWhoseCallerHangsUpRunsWholeAndIsAuditedAsItRan
// (openapi adminRemoveOverride, limiter_overrides_active "counts the
// overrides in force"): as above, for remove_override. The override goes,
// the record says it was removed, and it leaves the index that
// limiter_overrides_active counts, which would otherwise count it until
// the expiry it had (up to 30 days).
func TestAnOverrideRemovalWhoseCallerHangsUpRunsWholeAndIsAuditedAsItRan(t *testing.T) {
	e, proxy := hangUpEnv(t)
	ctx := context.Background()
	user := newUser()
	if _, err := e.lim.SetOverride(ctx, user, limiter.OverrideRequest{MaxConcurrentStreams: 5, For: 30 * 24 * time.Hour, Actor: "ola", Reason: "launch"}); err != nil {
		t.Fatal(err)
	}
	before, err := e.lim.ActiveOverrides(ctx)
	if err != nil {
		t.Fatal(err)
	}

	proxy.SetLatency(60 * time.Millisecond)
	e.hangUp(t, "DELETE", httpapi.AdminUserOverridePath(user), `{"reason":"ticket 4812: plan upgraded"}`)
	proxy.SetLatency(0)

	slots, err := e.lim.Slots(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	after, err := e.lim.ActiveOverrides(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.newest(t, httpapi.ActionRemoveOverride)
	t.Logf("override now: %+v; limiter_overrides_active %d -> %d; audit record: outcome %q removed %v", slots.Override, before, after, rec.Outcome, rec.OverrideRemoved)
	if slots.Override != nil {
		t.Errorf("the override is still in force: %+v; want removed: the call runs whole when its caller hangs up", slots.Override)
	}
	if after != before-1 {
		t.Errorf("the override is gone, but limiter_overrides_active still counts it: %d before, %d after; want %d", before, after, before-1)
	}
	if rec.Outcome != httpapi.OutcomeOK || rec.OverrideRemoved == nil || !*rec.OverrideRemoved {
		t.Errorf("the override is gone, but the audit record says outcome %q, override_removed %v; want ok, true", rec.Outcome, rec.OverrideRemoved)
	}
}

// TestAnOverrideSetWhoseCallerHangsUpRunsWholeAndIsAuditedAsItRan: as
// above, for set_override: the override is in force, its record says so,
// and limiter_overrides_active counts it.
func TestAnOverrideSetWhoseCallerHangsUpRunsWholeAndIsAuditedAsItRan(t *testing.T) {
	e, proxy := hangUpEnv(t)
	ctx := context.Background()
	user := newUser()
	before, err := e.lim.ActiveOverrides(ctx)
	if err != nil {
		t.Fatal(err)
	}
	proxy.SetLatency(60 * time.Millisecond)
	e.hangUp(t, "POST", httpapi.AdminUserOverridePath(user), `{"max_concurrent_streams":5,"expires_in":86400,"reason":"ticket 9: launch"}`)
	proxy.SetLatency(0)

	slots, err := e.lim.Slots(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	after, err := e.lim.ActiveOverrides(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec := e.newest(t, httpapi.ActionSetOverride)
	t.Logf("override now: %+v; limiter_overrides_active %d -> %d; audit record: outcome %q override %+v", slots.Override, before, after, rec.Outcome, rec.Override)
	if slots.Override == nil {
		t.Errorf("no override in force after the set; want one: the call runs whole when its caller hangs up")
	}
	if after != before+1 {
		t.Errorf("the override is in force, but limiter_overrides_active does not count it: %d before, %d after; want %d", before, after, before+1)
	}
	if rec.Outcome != httpapi.OutcomeOK || rec.Override == nil {
		t.Errorf("the override is in force, but the audit record says outcome %q, override %+v; want ok with the override", rec.Outcome, rec.Override)
	}
}

// TestTwoAuthorizationHeadersAreNoAdminToken: a call carrying two
// Authorization headers, an operator's token among them, is refused 401
// whichever comes first, saying why: which one names the caller is not
// guessed.
func TestTwoAuthorizationHeadersAreNoAdminToken(t *testing.T) {
	e := newAdminEnv(t, nil)
	for _, other := range []string{"Bearer wrong-token-0123456789abcdef", "Bearer " + operatorToken} {
		req, err := http.NewRequest("GET", e.url+httpapi.PathAdminAudit, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Add("Authorization", "Bearer "+operatorToken)
		req.Header.Add("Authorization", other)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "2 Authorization headers") {
			t.Errorf("the operator's token and %q: %d %s; want 401 saying there are two", other, resp.StatusCode, body)
		}
	}
}
