package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/joishi/limiter/internal/apitest"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
)

// TestAdminOverride: an operator sets a user's override (every exchange
// checked against the spec); it judges the user's acquires, shows in the
// slots listing, is audited with its reason and effect, and is removed
// the same way; a viewer may not, and is audited with what it tried.
func TestAdminOverride(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	user := newUser()
	path := httpapi.AdminUserOverridePath(user)
	ctx := context.Background()

	r := e.do(t, adminCall{method: "POST", path: path, token: viewerToken, body: `{"max_concurrent_streams":5,"expires_in":3600,"reason":"ticket 9"}`})
	apitest.WantError(t, r, http.StatusForbidden, httpapi.CodeForbidden)
	if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionSetOverride || rec.Actor != "vera" || rec.Reason != "ticket 9" || rec.Override != nil {
		t.Errorf("record of the viewer's attempt: got %+v, want set_override by vera with reason ticket 9 and no override", rec)
	}

	before := time.Now()
	r = e.do(t, adminCall{method: "POST", path: path, token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":86400,"reason":"ticket 9:\n5 streams   for the launch"}`})
	set := apitest.Decode[httpapi.AdminOverrideResponse](t, r, http.StatusOK)
	o := set.Override
	if set.UserID != user || o.MaxConcurrentStreams != 5 || o.Actor != "ola" || o.Reason != "ticket 9: 5 streams for the launch" ||
		o.ExpiresAt.Sub(o.SetAt) != 24*time.Hour || o.TTLMs != 86_400_000 || o.SetAt.Before(before.Add(-time.Second)) || set.AuditID != r.Header.Get(httpapi.HeaderAuditID) {
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
	listed := apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
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
		got := apitest.Decode[httpapi.AdminOverrideRemoveResponse](t, r, http.StatusOK)
		if got.Removed != want {
			t.Errorf("removal %d: got removed %v, want %v", i+1, got.Removed, want)
		}
		if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionRemoveOverride || rec.OverrideRemoved == nil || *rec.OverrideRemoved != want || rec.Reason != "ticket 9: plan upgraded" {
			t.Errorf("record of removal %d: got %+v, want remove_override with override_removed %v", i+1, rec, want)
		}
	}
	if listed := apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK); listed.Override != nil {
		t.Errorf("listing after the removal: got override %+v, want none", listed.Override)
	}
	if res, err := e.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "one"}); err != nil || res.Granted || res.Limit != 1 {
		t.Errorf("acquire after the removal: got %+v, %v; want denied by plan one's limit of 1", res, err)
	}

	r = e.do(t, adminCall{method: "GET", path: path, token: operatorToken})
	apitest.WantError(t, r, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
	if got := r.Header.Get("Allow"); got != "POST, DELETE" {
		t.Errorf("Allow of a GET on the override: got %q, want POST, DELETE", got)
	}
}

// TestAdminOverrideBounds: every field of an override is required and
// bounded like a tier's, a user's and a pool key's alike; a refusal names
// the field and the bound, and stores nothing; each bound itself is
// accepted.
func TestAdminOverrideBounds(t *testing.T) {
	t.Parallel()
	e := newPoolEnv(t, limitertest.Standalone)
	user := newUser()
	for _, scope := range []struct {
		name, path, listing, limit, noun string
		badPath, badCode                 string // a path naming an invalid scope, and its code
		most                             int    // the bound of its limit
		bound                            string // and what it is
	}{
		{name: "a user's", path: httpapi.AdminUserOverridePath(user), listing: httpapi.AdminUserSlotsPath(user), limit: "user's limit", noun: "user",
			badPath: httpapi.AdminUserOverridePath("a b"), badCode: httpapi.CodeInvalidUserID, most: tiers.MaxConcurrentStreams, bound: "a tier's bound"},
		{name: "a pool key's", path: httpapi.AdminPoolKeyOverridePath("model", llama), listing: httpapi.AdminPoolKeyPath("model", llama), limit: "pool key's cap", noun: "pool key",
			badPath: httpapi.AdminPoolKeyOverridePath("model", "a b"), badCode: httpapi.CodeInvalidPoolKey, most: pools.MaxConcurrentStreams, bound: "a pool's bound"},
	} {
		t.Run(scope.name, func(t *testing.T) {
			for _, tc := range []struct {
				name, body, want string
			}{
				{"no limit", `{"expires_in":3600,"reason":"r"}`, "max_concurrent_streams is required: the " + scope.limit + " while the override is in force"},
				{"no duration", `{"max_concurrent_streams":5,"reason":"r"}`, "expires_in is required"},
				{"a limit of -1", `{"max_concurrent_streams":-1,"expires_in":3600,"reason":"r"}`, fmt.Sprintf("max_concurrent_streams must be 0 to %d (%s), got -1", scope.most, scope.bound)},
				{"a limit one over its bound", fmt.Sprintf(`{"max_concurrent_streams":%d,"expires_in":3600,"reason":"r"}`, scope.most+1), fmt.Sprintf("got %d", scope.most+1)},
				{"a limit past 64 bits names its bound", `{"max_concurrent_streams":99999999999999999999,"expires_in":3600,"reason":"r"}`, fmt.Sprintf("max_concurrent_streams must be 0 to %d (%s), got 99999999999999999999", scope.most, scope.bound)},
				{"a negative limit past 64 bits names its bound", `{"max_concurrent_streams":-99999999999999999999,"expires_in":3600,"reason":"r"}`, fmt.Sprintf("max_concurrent_streams must be 0 to %d (%s), got -99999999999999999999", scope.most, scope.bound)},
				{"a duration past 64 bits names its bound", `{"max_concurrent_streams":5,"expires_in":99999999999999999999,"reason":"r"}`, "expires_in must be 60 to 2592000 seconds (a minute to 30 days), got 99999999999999999999"},
				{"a fraction", `{"max_concurrent_streams":2.5,"expires_in":3600,"reason":"r"}`, `field "max_concurrent_streams" must be a whole number`},
				{"an exponent", `{"max_concurrent_streams":5,"expires_in":3.6e3,"reason":"r"}`, `field "expires_in" must be a whole number`},
				{"a string limit", `{"max_concurrent_streams":"5","expires_in":3600,"reason":"r"}`, `field "max_concurrent_streams" must be a whole number, got string`},
				{"a leading zero", `{"max_concurrent_streams":05,"expires_in":3600,"reason":"r"}`, "invalid character '5'"},
				{"59 seconds, under a minute", `{"max_concurrent_streams":5,"expires_in":59,"reason":"r"}`, "expires_in must be 60 to 2592000 seconds (a minute to 30 days), got 59"},
				{"30 days and a second", `{"max_concurrent_streams":5,"expires_in":2592001,"reason":"r"}`, "got 2592001"},
				{"no reason", `{"max_concurrent_streams":5,"expires_in":3600}`, "reason is required: say why this " + scope.limit + " is overridden"},
				{"a control or format character in the reason", `{"max_concurrent_streams":5,"expires_in":3600,"reason":"a\u0000b\u200bc"}`, "reason must not contain control or format characters (found U+0000)"},
				{"a 501-character reason", `{"max_concurrent_streams":5,"expires_in":3600,"reason":"` + strings.Repeat("r", 501) + `"}`, "reason is 501 characters, the limit is 500"},
				{"an unknown field", `{"max_concurrent_streams":5,"expires_in":3600,"reason":"r","plan":"paid"}`, `unknown field "plan"`},
				{"a field given twice", `{"max_concurrent_streams":5,"max_concurrent_streams":50,"expires_in":3600,"reason":"r"}`, "given twice"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					r := e.do(t, adminCall{method: "POST", path: scope.path, token: operatorToken, body: tc.body, invalid: true})
					if got := apitest.WantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest); !strings.Contains(got.Message, tc.want) {
						t.Errorf("message: got %q, want it to say %q", got.Message, tc.want)
					}
				})
			}
			r := e.do(t, adminCall{method: "DELETE", path: scope.path, token: operatorToken, body: `{}`, invalid: true})
			if got := apitest.WantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest); !strings.Contains(got.Message, "reason is required: say why this "+scope.noun+"'s override is removed") {
				t.Errorf("removal without a reason: got %q, want a reason asked for", got.Message)
			}
			r = e.do(t, adminCall{method: "POST", path: scope.badPath, token: operatorToken, body: `{"max_concurrent_streams":5,"expires_in":3600,"reason":"r"}`, invalid: true})
			apitest.WantError(t, r, http.StatusBadRequest, scope.badCode)
			type listing struct{ Override *httpapi.AdminOverride }
			if listed := apitest.Decode[listing](t, e.do(t, adminCall{method: "GET", path: scope.listing, token: viewerToken}), http.StatusOK); listed.Override != nil {
				t.Errorf("override after refused calls only: got %+v, want none", listed.Override)
			}

			for _, edge := range []struct{ streams, seconds int }{{0, 60}, {scope.most, 2592000}} {
				body := fmt.Sprintf(`{"max_concurrent_streams":%d,"expires_in":%d,"reason":"the bounds"}`, edge.streams, edge.seconds)
				r := e.do(t, adminCall{method: "POST", path: scope.path, token: operatorToken, body: body})
				type set struct{ Override httpapi.AdminOverride }
				o := apitest.Decode[set](t, r, http.StatusOK).Override
				if o.MaxConcurrentStreams != edge.streams || o.ExpiresAt.Sub(o.SetAt) != time.Duration(edge.seconds)*time.Second {
					t.Errorf("override of %d streams for %ds: got %+v, want it in force as asked", edge.streams, edge.seconds, o)
				}
			}
		})
	}
}

// TestASetOverrideRecordsWhatItAskedFor: every set_override call's
// audit record, in the stream and the log, keeps the limit and duration
// its body asked for, refused calls included (for their role, a value out
// of bounds, a field missing, a key the pool does not cap); a value that
// is not a whole number is left out, and the detail names it.
func TestASetOverrideRecordsWhatItAskedFor(t *testing.T) {
	t.Parallel()
	e := newPoolEnv(t, limitertest.Standalone)
	user := httpapi.AdminUserOverridePath(newUser())
	n := func(v int) *int { return &v }
	s := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name, path, token, body string
		status                  int
		want                    *httpapi.AuditOverrideAsked
	}{
		{"a viewer's refused call", user, viewerToken, `{"max_concurrent_streams":5,"expires_in":3600,"reason":"ticket 9"}`,
			http.StatusForbidden, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(5), ExpiresIn: s(3600)}},
		{"a limit one over its bound", user, operatorToken, fmt.Sprintf(`{"max_concurrent_streams":%d,"expires_in":3600,"reason":"r"}`, httpapi.MaxOverrideStreams+1),
			http.StatusBadRequest, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(httpapi.MaxOverrideStreams + 1), ExpiresIn: s(3600)}},
		{"a limit of -1", user, operatorToken, `{"max_concurrent_streams":-1,"expires_in":3600,"reason":"r"}`,
			http.StatusBadRequest, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(-1), ExpiresIn: s(3600)}},
		{"59 seconds, under a minute", user, operatorToken, `{"max_concurrent_streams":5,"expires_in":59,"reason":"r"}`,
			http.StatusBadRequest, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(5), ExpiresIn: s(59)}},
		{"no reason", user, operatorToken, `{"max_concurrent_streams":5,"expires_in":3600}`,
			http.StatusBadRequest, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(5), ExpiresIn: s(3600)}},
		{"no duration", user, operatorToken, `{"max_concurrent_streams":5,"reason":"r"}`,
			http.StatusBadRequest, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(5)}},
		{"a fractional limit after the duration", user, operatorToken, `{"expires_in":3600,"max_concurrent_streams":2.5,"reason":"r"}`,
			http.StatusBadRequest, &httpapi.AuditOverrideAsked{ExpiresIn: s(3600)}},
		{"a string limit, read first", user, operatorToken, `{"max_concurrent_streams":"5","expires_in":3600,"reason":"r"}`,
			http.StatusBadRequest, nil},
		{"a key the pool does not cap", httpapi.AdminPoolKeyOverridePath("org", "globex"), operatorToken, `{"max_concurrent_streams":5,"expires_in":3600,"reason":"r"}`,
			http.StatusBadRequest, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(5), ExpiresIn: s(3600)}},
		{"an override put in force", user, operatorToken, `{"max_concurrent_streams":5,"expires_in":3600,"reason":"ticket 9"}`,
			http.StatusOK, &httpapi.AuditOverrideAsked{MaxConcurrentStreams: n(5), ExpiresIn: s(3600)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, adminCall{method: "POST", path: tc.path, token: tc.token, body: tc.body, invalid: tc.status != http.StatusOK && tc.status != http.StatusForbidden})
			if r.Status != tc.status {
				t.Fatalf("status: got %d, want %d; body %s", r.Status, tc.status, r.Body)
			}
			want, _ := json.Marshal(tc.want)
			rec := e.streamRecords(t)[0]
			if got, _ := json.Marshal(rec.Asked); rec.AuditID != r.Header.Get(httpapi.HeaderAuditID) || string(got) != string(want) {
				t.Errorf("stream record %s: got asked %s, want %s", rec.AuditID, got, want)
			}
			lines := auditLines(t, e.log)
			line := lines[len(lines)-1]
			var logged *httpapi.AuditOverrideAsked
			if asked, ok := line["asked"]; ok {
				data, _ := json.Marshal(asked)
				if err := json.Unmarshal(data, &logged); err != nil {
					t.Fatalf("log record's asked %s: %v", data, err)
				}
			}
			if got, _ := json.Marshal(logged); line["audit_id"] != rec.AuditID || string(got) != string(want) {
				t.Errorf("log record %v: got asked %s, want %s", line["audit_id"], got, want)
			}
		})
	}
	// The records read back through the API, as the spec describes them.
	r := e.do(t, adminCall{method: "GET", path: httpapi.PathAdminAudit + "?limit=20", token: viewerToken})
	if got := apitest.Decode[httpapi.AuditResponse](t, r, http.StatusOK).Records; len(got) < 10 || got[1].Asked == nil || *got[1].Asked.MaxConcurrentStreams != 5 {
		t.Errorf("audit read: got %+v, want the calls above, newest first, with what each asked for", got)
	}
}
