package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// TestAdminOverride: an operator sets a user's override (every exchange
// checked against the spec); it judges the user's acquires, shows in the
// slots listing, is audited with its reason and effect, and is removed
// the same way; a viewer may not, and is audited with what it tried.
func TestAdminOverride(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	user := newUser(t)
	path := httpapi.AdminUserOverridePath(user)
	ctx := context.Background()

	r := e.do(t, adminCall{method: "POST", path: path, token: viewerToken, body: `{"max_concurrent_streams":5,"expires_in":3600,"reason":"ticket 9"}`})
	wantError(t, r, http.StatusForbidden, httpapi.CodeForbidden)
	if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionSetOverride || rec.Actor != "vera" || rec.Reason != "ticket 9" || rec.Override != nil {
		t.Errorf("record of the viewer's attempt: got %+v, want set_override by vera with reason ticket 9 and no override", rec)
	}

	before := time.Now()
	r = e.do(t, adminCall{method: "POST", path: path, token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":86400,"reason":"ticket 9:\n5 streams   for the launch"}`})
	set := decode[httpapi.AdminOverrideResponse](t, r, http.StatusOK)
	o := set.Override
	if set.UserID != user || o.MaxConcurrentStreams != 5 || o.Actor != "ola" || o.Reason != "ticket 9: 5 streams for the launch" ||
		o.ExpiresAt.Sub(o.SetAt) != 24*time.Hour || o.TTLMs != 86_400_000 || o.SetAt.Before(before.Add(-time.Second)) || set.AuditID != r.header.Get(httpapi.HeaderAuditID) {
		t.Fatalf("set: got %+v, want 5 streams for 24h by ola, the reason collapsed, the call's audit id", set)
	}
	if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionSetOverride || rec.Outcome != httpapi.OutcomeOK || rec.Override == nil ||
		rec.Override.MaxConcurrentStreams != 5 || !rec.Override.ExpiresAt.Equal(o.ExpiresAt) || rec.Reason != o.Reason {
		t.Errorf("record of the override: got %+v, want set_override ok with 5 streams until %v", rec, o.ExpiresAt)
	}

	for i := range 5 {
		res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one", Caller: "chat-api", Label: "pod-" + string(rune('a'+i))})
		if err != nil || !res.Granted || res.Limit != 5 {
			t.Fatalf("acquire %d on plan one under the override: got %+v, %v; want granted with limit 5", i+1, res, err)
		}
	}
	listed := decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
	if listed.Used != 5 || listed.Override == nil || listed.Override.MaxConcurrentStreams != 5 || listed.Override.Actor != "ola" || listed.Override.TTLMs <= 0 {
		t.Fatalf("listing: got %+v, want 5 slots and the override", listed)
	}
	for _, s := range listed.Slots {
		if s.Caller != "chat-api" || s.Plan != "one" || !strings.HasPrefix(s.Label, "pod-") || s.StartedAt == nil || s.AgeMs == nil || *s.AgeMs < 0 {
			t.Errorf("listed slot: got %+v, want caller chat-api, plan one, a pod- label, a start and an age", s)
		}
	}

	for i, want := range []bool{true, false} {
		r := e.do(t, adminCall{method: "DELETE", path: path, token: operatorToken, body: `{"reason":"ticket 9: plan upgraded"}`})
		got := decode[httpapi.AdminOverrideRemoveResponse](t, r, http.StatusOK)
		if got.Removed != want {
			t.Errorf("removal %d: got removed %v, want %v", i+1, got.Removed, want)
		}
		if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionRemoveOverride || rec.OverrideRemoved == nil || *rec.OverrideRemoved != want || rec.Reason != "ticket 9: plan upgraded" {
			t.Errorf("record of removal %d: got %+v, want remove_override with override_removed %v", i+1, rec, want)
		}
	}
	if listed := decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK); listed.Override != nil {
		t.Errorf("listing after the removal: got override %+v, want none", listed.Override)
	}
	if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one"}); err != nil || res.Granted || res.Limit != 1 {
		t.Errorf("acquire after the removal: got %+v, %v; want denied by plan one's limit of 1", res, err)
	}

	r = e.do(t, adminCall{method: "GET", path: path, token: operatorToken})
	wantError(t, r, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
	if got := r.header.Get("Allow"); got != "POST, DELETE" {
		t.Errorf("Allow of a GET on the override: got %q, want POST, DELETE", got)
	}
}

// TestAdminOverrideBounds: every field of an override is required and
// bounded like a tier's; a refusal names the field and the bound, and
// stores nothing.
func TestAdminOverrideBounds(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	user := newUser(t)
	for _, tc := range []struct {
		name, body, want string
	}{
		{"no limit", `{"expires_in":3600,"reason":"r"}`, "max_concurrent_streams is required"},
		{"no duration", `{"max_concurrent_streams":5,"reason":"r"}`, "expires_in is required"},
		{"a negative limit", `{"max_concurrent_streams":-1,"expires_in":3600,"reason":"r"}`, "max_concurrent_streams must be 0 to 1000 (a tier's bound), got -1"},
		{"a limit over a tier's bound", `{"max_concurrent_streams":1001,"expires_in":3600,"reason":"r"}`, "got 1001"},
		{"a huge limit", `{"max_concurrent_streams":99999999999999999999,"expires_in":3600,"reason":"r"}`, `field "max_concurrent_streams" is out of range`},
		{"a fraction", `{"max_concurrent_streams":2.5,"expires_in":3600,"reason":"r"}`, `field "max_concurrent_streams" must be a whole number`},
		{"an exponent", `{"max_concurrent_streams":5,"expires_in":3.6e3,"reason":"r"}`, `field "expires_in" must be a whole number`},
		{"a string limit", `{"max_concurrent_streams":"5","expires_in":3600,"reason":"r"}`, `field "max_concurrent_streams" must be a whole number, got string`},
		{"a leading zero", `{"max_concurrent_streams":05,"expires_in":3600,"reason":"r"}`, "invalid character '5'"},
		{"under a minute", `{"max_concurrent_streams":5,"expires_in":59,"reason":"r"}`, "expires_in must be 60 to 2592000 seconds (a minute to 30 days), got 59"},
		{"over 30 days", `{"max_concurrent_streams":5,"expires_in":2592001,"reason":"r"}`, "got 2592001"},
		{"no reason", `{"max_concurrent_streams":5,"expires_in":3600}`, "reason is required: say why this user's limit is overridden"},
		{"a 501-character reason", `{"max_concurrent_streams":5,"expires_in":3600,"reason":"` + strings.Repeat("r", 501) + `"}`, "reason is 501 characters, the limit is 500"},
		{"an unknown field", `{"max_concurrent_streams":5,"expires_in":3600,"reason":"r","plan":"paid"}`, `unknown field "plan"`},
		{"a field given twice", `{"max_concurrent_streams":5,"max_concurrent_streams":50,"expires_in":3600,"reason":"r"}`, "given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserOverridePath(user), token: operatorToken, body: tc.body, invalid: true})
			if got := wantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest); !strings.Contains(got.Message, tc.want) {
				t.Errorf("message: got %q, want it to say %q", got.Message, tc.want)
			}
		})
	}
	r := e.do(t, adminCall{method: "DELETE", path: httpapi.AdminUserOverridePath(user), token: operatorToken, body: `{}`, invalid: true})
	if got := wantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest); !strings.Contains(got.Message, "reason is required: say why this user's override is removed") {
		t.Errorf("removal without a reason: got %q, want a reason asked for", got.Message)
	}
	r = e.do(t, adminCall{method: "POST", path: httpapi.AdminUserOverridePath("a b"), token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":3600,"reason":"r"}`, invalid: true})
	wantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidUserID)
	listed := decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
	if listed.Override != nil {
		t.Errorf("override after refused calls only: got %+v, want none", listed.Override)
	}
}

// TestAPIAcquireLabel: a label is kept with the slot and a 429 under an
// override says so; a label the page could not show is 400
// invalid_label, naming the bound, before any slot.
func TestAPIAcquireLabel(t *testing.T) {
	t.Parallel()
	s := limitertest.New(t, limitertest.Options{})
	a := newAPIOf(t, server.New(s.Limiter, server.Options{}))
	user := newUser(t)
	decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "one", Label: "meta-llama/Llama-3.1-8B"}), http.StatusOK)
	for _, label := range []string{strings.Repeat("l", 129), "two words", "a\u202eb"} {
		r := a.call(t, http.MethodPost, httpapi.PathAcquire, mustJSON(t, httpapi.AcquireRequest{UserID: user, Plan: "three", Label: label}), true)
		if e := wantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidLabel); len(label) > 128 && !strings.Contains(e.Message, "the limit is 128") {
			t.Errorf("a %d-byte label: message %q, want the limit named", len(label), e.Message)
		}
	}
	listed, err := s.Limiter.Slots(context.Background(), user)
	if err != nil || len(listed.Slots) != 1 || listed.Slots[0].Label != "meta-llama/Llama-3.1-8B" {
		t.Fatalf("slots: got %+v, %v; want the one labelled slot", listed, err)
	}

	if _, err := s.Limiter.SetOverride(context.Background(), user, limiter.OverrideRequest{MaxConcurrentStreams: 1, For: time.Hour, Actor: "ola", Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "three"})
	e := wantError(t, r, http.StatusTooManyRequests, httpapi.CodeStreamLimitReached)
	checkLimitReached(t, r, e, 1, 1)
	if !strings.Contains(e.Message, `a support override of plan "three"`) {
		t.Errorf("429 under an override: message %q, want it to say a support override set the limit", e.Message)
	}
}
