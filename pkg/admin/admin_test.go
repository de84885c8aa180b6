package admin_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/admin"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

const (
	viewerToken   = "viewer-token-0123456789abcdef"
	operatorToken = "operator-token-0123456789abcdef"
	adminTokens   = "# support\nvera viewer " + viewerToken + "\nola operator " + operatorToken + "\n"
)

// auditLines returns the "admin audit" records of a JSON log.
func auditLines(t *testing.T, log *testenv.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		if m["msg"] == "admin audit" {
			out = append(out, m)
		}
	}
	return out
}

// adminEnv is an in-process API with the admin routes, on real Redis, with
// its own key prefix (so its own audit stream).
type adminEnv struct {
	url    string
	client *http.Client // validates every exchange against api/openapi.yaml
	lim    *limiter.Limiter
	redis  *cluster.Client
	keys   keys.Schema
	log    *testenv.Buffer
	admin  *admin.Admin
	tiers  *tiers.Table // the plans the limiter enforces
}

func newAdminEnv(t *testing.T, handler func(io.Writer) slog.Handler) *adminEnv {
	t.Helper()
	return newAdminEnvOn(t, limitertest.Options{}, handler)
}

// newAdminEnvOn is newAdminEnv on the stack opts describe.
func newAdminEnvOn(t *testing.T, opts limitertest.Options, handler func(io.Writer) slog.Handler) *adminEnv {
	t.Helper()
	s := limitertest.New(t, opts)
	lim, redis, keys := s.Limiter, s.Redis, s.Keys

	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(adminTokens), 0o600); err != nil {
		t.Fatal(err)
	}
	sink := &testenv.Buffer{}
	if handler == nil {
		handler = func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }
	}
	a, err := admin.New(lim, admin.Options{TokensFile: tokens, AuditMaxLen: 100, Logger: slog.New(handler(sink))})
	if err != nil {
		t.Fatal(err)
	}
	admin.SetAnonymousAuditLogEvery(a, 0) // log every refused anonymous call
	srv := httptest.NewServer(server.New(lim, server.Options{Admin: a}).AdminHandler())
	t.Cleanup(srv.Close)
	return &adminEnv{
		url:    srv.URL,
		client: &http.Client{Transport: apitest.ValidatingAdminTransport(t, srv.Client().Transport), Timeout: 10 * time.Second},
		lim:    lim, redis: redis, keys: keys, log: sink, admin: a, tiers: s.Table,
	}
}

// newUser returns a user id no other test uses.
func newUser() string { return "u-" + rand.Text() }

// adminCall is one request of a test.
type adminCall struct {
	method, path, token, body string
	authScheme                string // default "Bearer"
	contentType               string // of a body; default application/json
	invalid                   bool   // deliberately outside the spec
}

func (e *adminEnv) do(t *testing.T, c adminCall) apitest.Reply {
	t.Helper()
	var rd io.Reader
	if c.body != "" {
		rd = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, e.url+c.path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
		if c.contentType != "" {
			req.Header.Set("Content-Type", c.contentType)
		}
	}
	if c.token != "" {
		scheme := c.authScheme
		if scheme == "" {
			scheme = "Bearer"
		}
		req.Header.Set("Authorization", scheme+" "+c.token)
	}
	if c.invalid {
		apitest.Invalid(req)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return apitest.Reply{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// streamRecords reads the whole audit stream, newest first, straight from Redis.
func (e *adminEnv) streamRecords(t *testing.T) []httpapi.AuditRecord {
	t.Helper()
	c, err := e.redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := c.Do(context.Background(), c.B().Xrevrange().Key(e.keys.Audit()).End("+").Start("-").Build()).AsXRange()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]httpapi.AuditRecord, len(entries))
	for i, entry := range entries {
		if err := json.Unmarshal([]byte(entry.FieldValues["record"]), &out[i]); err != nil {
			t.Fatalf("audit stream entry %s: %v", entry.ID, err)
		}
	}
	return out
}

// sameIDs reports whether a and b hold the same stream ids in any order
// (slots acquired in the same millisecond tie on expiry).
func sameIDs(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// hold acquires n slots for user and returns their stream ids.
func (e *adminEnv) hold(t *testing.T, user string, n int) []string {
	t.Helper()
	var ids []string
	for range n {
		res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three"})
		if err != nil || !res.Granted {
			t.Fatalf("acquire for %s: got %+v, %v, want granted", user, res, err)
		}
		ids = append(ids, res.StreamID)
	}
	return ids
}

func TestAdminAuthMatrix(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	user := newUser()
	held := e.hold(t, user, 2)
	slotsPath, releasePath := httpapi.AdminUserSlotsPath(user), httpapi.AdminUserReleasePath(user)
	reason := `{"reason":"ticket 4812: locked out after a crash"}`

	for _, tc := range []struct {
		name     string
		call     adminCall
		status   int
		code     string // error code; "" for a 200
		actor    string
		role     string
		action   string
		released []string
		reason   string
		detail   string // in the record's detail
	}{
		{name: "no token is 401", call: adminCall{method: "GET", path: slotsPath},
			status: 401, code: httpapi.CodeUnauthorized, action: httpapi.ActionListSlots, detail: "Authorization: Bearer"},
		{name: "an unknown token is 401", call: adminCall{method: "POST", path: releasePath, token: "not-a-token-0123456789", body: reason},
			status: 401, code: httpapi.CodeUnauthorized, action: httpapi.ActionReleaseAll, detail: "unknown token"}, // an anonymous body is not read
		{name: "a known token under another scheme is 401", call: adminCall{method: "GET", path: slotsPath, token: operatorToken, authScheme: "Basic"},
			status: 401, code: httpapi.CodeUnauthorized, action: httpapi.ActionListSlots},
		{name: "a viewer lists slots", call: adminCall{method: "GET", path: slotsPath, token: viewerToken},
			status: 200, actor: "vera", role: "viewer", action: httpapi.ActionListSlots},
		{name: "a viewer releasing is 403", call: adminCall{method: "POST", path: releasePath, token: viewerToken, body: reason},
			status: 403, code: httpapi.CodeForbidden, actor: "vera", role: "viewer", action: httpapi.ActionReleaseAll, reason: "ticket 4812: locked out after a crash", detail: "needs role operator"},
		{name: "an operator without a reason is 400", call: adminCall{method: "POST", path: releasePath, token: operatorToken, body: `{}`, invalid: true},
			status: 400, code: httpapi.CodeInvalidRequest, actor: "ola", role: "operator", action: httpapi.ActionReleaseAll, detail: "reason is required"},
		{name: "an operator with a blank reason is 400", call: adminCall{method: "POST", path: releasePath, token: operatorToken, body: `{"reason":" \n\t "}`},
			status: 400, code: httpapi.CodeInvalidRequest, actor: "ola", role: "operator", action: httpapi.ActionReleaseAll, detail: "reason is required"},
		{name: "an operator with a 501-character reason is 400", call: adminCall{method: "POST", path: releasePath, token: operatorToken, body: `{"reason":"` + strings.Repeat("r", 501) + `"}`, invalid: true},
			status: 400, code: httpapi.CodeInvalidRequest, actor: "ola", role: "operator", action: httpapi.ActionReleaseAll, reason: strings.Repeat("r", 501), detail: "reason is 501 characters, the limit is 500"},
		{name: "an operator with a NUL in the reason is 400, not a cleaned reason", call: adminCall{method: "POST", path: releasePath, token: operatorToken, body: `{"reason":"ticket\u0000 4812"}`},
			status: 400, code: httpapi.CodeInvalidRequest, actor: "ola", role: "operator", action: httpapi.ActionReleaseAll, reason: "ticket\ufffd 4812", detail: "reason must not contain control or format characters (found U+0000)"},
		{name: "an operator with a zero-width space in the reason is 400", call: adminCall{method: "POST", path: releasePath, token: operatorToken, body: `{"reason":"ticket 48\u200b12"}`},
			status: 400, code: httpapi.CodeInvalidRequest, actor: "ola", role: "operator", action: httpapi.ActionReleaseAll, reason: "ticket 48\ufffd12", detail: "reason must not contain control or format characters (found U+200B)"},
		{name: "an operator's release sent as text/plain is 415", call: adminCall{method: "POST", path: releasePath, token: operatorToken, body: reason, contentType: "text/plain", invalid: true},
			status: 415, code: httpapi.CodeUnsupportedMediaType, actor: "ola", role: "operator", action: httpapi.ActionReleaseAll, detail: "must be sent as application/json"},
		{name: "an operator releases with a reason", call: adminCall{method: "POST", path: releasePath, token: operatorToken, body: `{"reason":"ticket 4812:\nlocked out   after a crash"}`},
			status: 200, actor: "ola", role: "operator", action: httpapi.ActionReleaseAll, released: held, reason: "ticket 4812: locked out after a crash"},
		{name: "an operator reads the audit", call: adminCall{method: "GET", path: httpapi.PathAdminAudit + "?limit=5", token: operatorToken},
			status: 200, actor: "ola", role: "operator", action: httpapi.ActionReadAudit},
		{name: "an audit limit of 0 is 400", call: adminCall{method: "GET", path: httpapi.PathAdminAudit + "?limit=0", token: viewerToken, invalid: true},
			status: 400, code: httpapi.CodeInvalidRequest, actor: "vera", role: "viewer", action: httpapi.ActionReadAudit, detail: "limit must be"},
		{name: "an audit limit given twice is 400", call: adminCall{method: "GET", path: httpapi.PathAdminAudit + "?limit=1&limit=5000", token: viewerToken, invalid: true},
			status: 400, code: httpapi.CodeInvalidRequest, actor: "vera", role: "viewer", action: httpapi.ActionReadAudit, detail: "limit is given 2 times; give it once, a whole number from 1 to 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logBefore, streamBefore := len(auditLines(t, e.log)), len(e.streamRecords(t))
			r := e.do(t, tc.call)
			if tc.code != "" {
				apitest.WantError(t, r, tc.status, tc.code)
			} else if r.Status != tc.status {
				t.Fatalf("status: got %d, want %d; body %s", r.Status, tc.status, r.Body)
			}
			auditID := r.Header.Get(httpapi.HeaderAuditID)
			if tc.status == 401 && !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate: got %q, want a Bearer challenge", r.Header.Get("WWW-Authenticate"))
			}

			// Exactly one record, in the log and, for a known token, in the
			// stream, with the right fields.
			lines := auditLines(t, e.log)[logBefore:]
			stream := e.streamRecords(t)
			wantStream := 1
			if tc.actor == "" {
				wantStream = 0 // an anonymous call cannot push records out of the stream
			}
			if len(lines) != 1 || len(stream)-streamBefore != wantStream {
				t.Fatalf("audit records: got %d in the log and %d in the stream, want 1 and %d", len(lines), len(stream)-streamBefore, wantStream)
			}
			var got httpapi.AuditRecord
			if wantStream == 1 {
				got = stream[0]
			} else {
				// The log line is the record.
				data, _ := json.Marshal(lines[0])
				if err := json.Unmarshal(data, &got); err != nil {
					t.Fatal(err)
				}
				got.AuditID, got.Time = lines[0]["audit_id"].(string), time.Now()
				got.Detail, _ = lines[0]["detail"].(string)
			}
			if got.AuditID != auditID || lines[0]["audit_id"] != auditID {
				t.Errorf("audit_id: got stream %q, log %v, want the %s header %q", got.AuditID, lines[0]["audit_id"], httpapi.HeaderAuditID, auditID)
			}
			wantOutcome := httpapi.OutcomeOK
			if tc.code != "" {
				wantOutcome = tc.code
			}
			wantUser := user
			if tc.action == httpapi.ActionReadAudit {
				wantUser = ""
			}
			if got.Actor != tc.actor || got.Role != tc.role || got.Action != tc.action || got.UserID != wantUser ||
				got.Outcome != wantOutcome || got.Status != tc.status || got.Reason != tc.reason {
				t.Errorf("record: got actor %q role %q action %q user %q outcome %q status %d reason %q,\nwant actor %q role %q action %q user %q outcome %q status %d reason %q",
					got.Actor, got.Role, got.Action, got.UserID, got.Outcome, got.Status, got.Reason,
					tc.actor, tc.role, tc.action, wantUser, wantOutcome, tc.status, tc.reason)
			}
			if !sameIDs(got.Released, tc.released) {
				t.Errorf("record released: got %v, want %v", got.Released, tc.released)
			}
			if !strings.HasPrefix(got.Remote, "127.0.0.1:") || time.Since(got.Time) > time.Minute {
				t.Errorf("record remote, time: got %q, %v, want 127.0.0.1:port, now", got.Remote, got.Time)
			}
			if !strings.Contains(got.Detail, tc.detail) {
				t.Errorf("record detail: got %q, want it to contain %q", got.Detail, tc.detail)
			}
			for _, field := range []string{"actor", "role", "action", "user_id", "reason", "remote", "outcome"} {
				if lines[0][field] == nil {
					t.Errorf("log record: no %q field in %v", field, lines[0])
				}
			}
			for _, secret := range []string{viewerToken, operatorToken, "not-a-token-0123456789"} {
				if strings.Contains(e.log.String(), secret) {
					t.Fatalf("the log holds a token")
				}
			}
			if tc.status == 200 && tc.action == httpapi.ActionReleaseAll {
				var res httpapi.AdminReleaseResponse
				if err := json.Unmarshal(r.Body, &res); err != nil {
					t.Fatal(err)
				}
				if res.AuditID != auditID || !sameIDs(res.Released, held) {
					t.Errorf("release answer: got %+v, want released %v and audit_id %s", res, held, auditID)
				}
			}
		})
	}

	t.Run("after the release the user holds no slot", func(t *testing.T) {
		var got httpapi.AdminSlotsResponse
		r := e.do(t, adminCall{method: "GET", path: slotsPath, token: viewerToken})
		got = apitest.Decode[httpapi.AdminSlotsResponse](t, r, http.StatusOK)
		if got.Used != 0 || len(got.Slots) != 0 || got.UserID != user {
			t.Errorf("got %+v, want user %s with no slot", got, user)
		}
	})
	t.Run("the audit lists the calls newest first", func(t *testing.T) {
		got := apitest.Decode[httpapi.AuditResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.PathAdminAudit, token: viewerToken}), http.StatusOK)
		if len(got.Records) < 9 || got.Records[0].Action != httpapi.ActionListSlots || got.Records[0].Time.Before(got.Records[len(got.Records)-1].Time) {
			t.Errorf("records: got %d, first %+v, want at least 9, newest (the slot listing) first", len(got.Records), got.Records[0])
		}
	})
}

// A flood of calls without a known token, which anyone who reaches the
// admin port can send, is logged at a bounded rate and leaves the audit
// stream alone: the record of what an operator did stays in it.
func TestAdminAuditFloodKeepsOperatorRecords(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil) // the stream keeps 100 records
	admin.SetAnonymousAuditLogEvery(e.admin, time.Second)
	user := newUser()
	e.hold(t, user, 2)
	r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: `{"reason":"ticket 4812"}`})
	release := apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK)
	streamBefore := len(e.streamRecords(t))

	hc := &http.Client{Timeout: 10 * time.Second}
	send := func(method, path, token, body string) {
		req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("%s %s: got %d, want 401 or 405", method, path, resp.StatusCode)
		}
	}
	start := time.Now()
	for i := range 1000 {
		switch i % 4 {
		case 0:
			send("GET", httpapi.PathAdminAudit, "", "")
		case 1:
			send("POST", httpapi.AdminUserReleasePath(user), "guessed-token-0123456789-"+strconv.Itoa(i), `{"reason":"flood"}`)
		case 2:
			send("GET", httpapi.AdminUserSlotsPath(newUser()), "", "")
		case 3:
			send("DELETE", httpapi.AdminUserSlotsPath(user), "", "") // a 405 of no known caller
		}
	}
	elapsed := time.Since(start)

	stream := e.streamRecords(t)
	if len(stream) != streamBefore {
		t.Errorf("audit stream: got %d records after the flood, want %d (none added)", len(stream), streamBefore)
	}
	if !slices.ContainsFunc(stream, func(rec httpapi.AuditRecord) bool { return rec.AuditID == release.AuditID }) {
		t.Errorf("the operator's release %s is no longer in the audit stream", release.AuditID)
	}
	got := apitest.Decode[httpapi.AuditResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.PathAdminAudit, token: viewerToken}), http.StatusOK)
	if !slices.ContainsFunc(got.Records, func(rec httpapi.AuditRecord) bool { return rec.AuditID == release.AuditID }) {
		t.Errorf("GET %s: got %+v, want the operator's release among the records", httpapi.PathAdminAudit, got.Records)
	}

	// Logged, but rate-limited: one line per second, the next carrying the
	// count of those left out.
	var anonymous, counted int
	for _, line := range auditLines(t, e.log) {
		if line["actor"] == "" {
			anonymous++
			if n, ok := line["similar_since_last_line"].(float64); ok {
				counted += int(n)
			}
		}
	}
	if maxLines := int(elapsed/time.Second) + 2; anonymous < 1 || anonymous > maxLines {
		t.Errorf("log: got %d anonymous audit lines for 1000 calls in %v, want 1 to %d", anonymous, elapsed.Round(time.Millisecond), maxLines)
	}
	if anonymous+counted > 1000 {
		t.Errorf("log: %d lines and %d counted as left out, want at most 1000", anonymous, counted)
	}
}

func TestAdminSlots(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	user := newUser()
	held := e.hold(t, user, 2)
	got := apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(user), token: viewerToken}), http.StatusOK)
	if got.Used != 2 || len(got.Slots) != 2 {
		t.Fatalf("got %+v, want 2 slots", got)
	}
	var ids []string
	for i, s := range got.Slots {
		ids = append(ids, s.StreamID)
		if s.TTLMs <= 9_000 || s.TTLMs > 10_000 || time.Until(s.ExpiresAt) > 11*time.Second {
			t.Errorf("slot %d: got %+v, want ttl_ms in (9000, 10000]", i, s)
		}
	}
	if !sameIDs(ids, held) {
		t.Errorf("stream ids: got %v, want %v", ids, held)
	}
	t.Run("an invalid user id is 400 invalid_user_id, audited", func(t *testing.T) {
		r := e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath("a{b}"), token: viewerToken, invalid: true})
		apitest.WantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidUserID)
		if rec := e.streamRecords(t)[0]; rec.Outcome != httpapi.CodeInvalidUserID || rec.UserID != "a{b}" {
			t.Errorf("record: got %+v, want outcome invalid_user_id for user a{b}", rec)
		}
	})
	t.Run("the users ., .., / and a/ are listed and released, not another path's", func(t *testing.T) {
		for _, dots := range []string{".", "..", "/", "a/"} {
			held := e.hold(t, dots, 1)
			got := apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminUserSlotsPath(dots), token: viewerToken}), http.StatusOK)
			if got.UserID != dots || got.Used != 1 {
				t.Errorf("slots of %q: got %+v, want the user's 1 slot", dots, got)
			}
			r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(dots), token: operatorToken, body: `{"reason":"dots"}`})
			if res := apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK); !sameIDs(res.Released, held) {
				t.Errorf("release of %q: got %v, want %v", dots, res.Released, held)
			}
		}
	})
	t.Run("the user / is one user however its slash is escaped, and its wrong method is 405", func(t *testing.T) {
		e.hold(t, "/", 1)
		for _, path := range []string{"/v1/admin/users/%2F/slots", "/v1/admin/users/%2f/slots"} {
			got := apitest.Decode[httpapi.AdminSlotsResponse](t, e.do(t, adminCall{method: "GET", path: path, token: viewerToken}), http.StatusOK)
			if got.UserID != "/" || got.Used != 1 {
				t.Errorf("GET %s: got %+v, want the user /'s 1 slot", path, got)
			}
		}
		r := e.do(t, adminCall{method: "DELETE", path: "/v1/admin/users/%2F/slots", token: operatorToken})
		apitest.WantError(t, r, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
		if rec := e.streamRecords(t)[0]; rec.UserID != "/" || rec.Action != httpapi.ActionListSlots {
			t.Errorf("record: got %+v, want list_slots of the user /", rec)
		}
		r = e.do(t, adminCall{method: "GET", path: "/v1/admin/users/%2F/nothing", token: viewerToken})
		apitest.WantError(t, r, http.StatusNotFound, httpapi.CodeNotFound)
		r = e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath("/"), token: operatorToken, body: `{"reason":"slash"}`})
		if res := apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK); len(res.Released) != 1 {
			t.Errorf("release of /: got %v, want its 1 slot", res.Released)
		}
	})
	t.Run("a wrong method is 405, audited once", func(t *testing.T) {
		logBefore, streamBefore := len(auditLines(t, e.log)), len(e.streamRecords(t))
		r := e.do(t, adminCall{method: "DELETE", path: httpapi.AdminUserSlotsPath(user), token: operatorToken})
		apitest.WantError(t, r, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
		if got := r.Header.Get("Allow"); got != http.MethodGet {
			t.Errorf("Allow: got %q, want GET", got)
		}
		lines, stream := auditLines(t, e.log)[logBefore:], e.streamRecords(t)
		if len(lines) != 1 || len(stream)-streamBefore != 1 {
			t.Fatalf("audit records: got %d in the log and %d in the stream, want 1 and 1", len(lines), len(stream)-streamBefore)
		}
		rec := stream[0]
		if rec.AuditID != r.Header.Get(httpapi.HeaderAuditID) || rec.Outcome != httpapi.CodeMethodNotAllowed || rec.Status != http.StatusMethodNotAllowed ||
			rec.Actor != "ola" || rec.Action != httpapi.ActionListSlots || rec.UserID != user || !strings.Contains(rec.Detail, "DELETE is not allowed") {
			t.Errorf("record: got %+v, want audit id %s, outcome method_not_allowed 405, actor ola, action list_slots, user %s, detail naming DELETE",
				rec, r.Header.Get(httpapi.HeaderAuditID), user)
		}
		if lines[0]["level"] != "INFO" || lines[0]["outcome"] != httpapi.CodeMethodNotAllowed {
			t.Errorf("log record: got %v, want an INFO with outcome method_not_allowed (the caller's mistake, not the operator's page)", lines[0])
		}
		// HEAD, which a GET pattern would serve, reading Redis and
		// recording a listing that was never made, is 405 too.
		streamBefore = len(e.streamRecords(t))
		head := e.do(t, adminCall{method: "HEAD", path: httpapi.AdminUserSlotsPath(user), token: operatorToken, invalid: true})
		if head.Status != http.StatusMethodNotAllowed || head.Header.Get("Allow") != http.MethodGet {
			t.Errorf("HEAD: %d, Allow %q; want 405, Allow GET", head.Status, head.Header.Get("Allow"))
		}
		if stream := e.streamRecords(t); len(stream)-streamBefore != 1 || stream[0].Outcome != httpapi.CodeMethodNotAllowed {
			t.Errorf("the HEAD's audit records: %d, the newest %+v; want one, method_not_allowed", len(stream)-streamBefore, stream[0])
		}
		// A call its role may not make is for the operator on call: WARN.
		logBefore = len(auditLines(t, e.log))
		r = e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: viewerToken, body: `{"reason":"no"}`})
		apitest.WantError(t, r, http.StatusForbidden, httpapi.CodeForbidden)
		if lines := auditLines(t, e.log)[logBefore:]; len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["outcome"] != httpapi.CodeForbidden {
			t.Errorf("log records of a viewer's release: %v; want one WARN with outcome forbidden", lines)
		}
	})
}

// On a Redis Cluster the audit stream is one more key: release and the
// audit work there too.
func TestAdminOnCluster(t *testing.T) {
	t.Parallel()
	e := newAdminEnvOn(t, limitertest.Options{Backend: limitertest.RedisCluster}, nil)
	user := newUser()
	held := e.hold(t, user, 2)
	r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: `{"reason":"cluster"}`})
	got := apitest.Decode[httpapi.AdminReleaseResponse](t, r, http.StatusOK)
	if !sameIDs(got.Released, held) {
		t.Errorf("released: got %v, want %v", got.Released, held)
	}
	audit := apitest.Decode[httpapi.AuditResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.PathAdminAudit, token: viewerToken}), http.StatusOK)
	if len(audit.Records) != 1 || audit.Records[0].AuditID != got.AuditID || audit.Records[0].Reason != "cluster" {
		t.Errorf("audit: got %+v, want the one release record %s", audit.Records, got.AuditID)
	}
}

// A user id holding a newline and a forged record must stay inside one log
// line, whatever the log format.
func TestAdminLogInjection(t *testing.T) {
	t.Parallel()
	forged := `{"time":"2030-01-01T00:00:00Z","level":"INFO","msg":"admin audit","actor":"root","action":"release_all","outcome":"ok"}`
	user := "victim\n" + forged
	reason := "cleanup\n" + `time=2030-01-01T00:00:00Z level=INFO msg="admin audit" actor=root outcome=ok`
	for _, format := range []struct {
		name    string
		handler func(io.Writer) slog.Handler
	}{
		{"json", func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }},
		{"text", func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) }},
	} {
		t.Run(format.name, func(t *testing.T) {
			e := newAdminEnv(t, format.handler)
			r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: mustJSON(t, httpapi.AdminReleaseRequest{Reason: reason}), invalid: true})
			apitest.WantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidUserID)

			out := strings.TrimSuffix(e.log.String(), "\n")
			lines := strings.Split(out, "\n")
			if len(lines) != 1 {
				t.Fatalf("log: got %d lines, want 1:\n%s", len(lines), out)
			}
			if strings.Contains(lines[0], `\n`) || !strings.Contains(lines[0], "admin audit") {
				t.Errorf("log line: got %s, want the audit record with no newline left, even escaped", lines[0])
			}
			rec := e.streamRecords(t)[0]
			if strings.ContainsAny(rec.UserID, "\n\r") || !strings.HasPrefix(rec.UserID, "victim\uFFFD{") || rec.Actor != "ola" {
				t.Errorf("record user_id, actor: got %q, %q, want the newline replaced by U+FFFD, actor ola", rec.UserID, rec.Actor)
			}
			if strings.ContainsAny(rec.Reason, "\n\r") || !strings.HasPrefix(rec.Reason, "cleanup time=") {
				t.Errorf("record reason: got %q, want the newline collapsed into a space", rec.Reason)
			}
		})
	}
}

// TestAdminAuditMarksAHeldIdsInvisibleCharacters: support may act on a
// slot an earlier release granted under an id that is now refused, such as
// alice followed by a Hangul filler; the audit must not record that as
// alice.
func TestAdminAuditMarksAHeldIdsInvisibleCharacters(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	for _, user := range []string{"alice\u3164", "alice\uFE0F", "alice\u2800"} {
		r := e.do(t, adminCall{method: "POST", path: httpapi.AdminUserReleasePath(user), token: operatorToken, body: mustJSON(t, httpapi.AdminReleaseRequest{Reason: "clean up ❤️"}), invalid: true})
		if r.Status != http.StatusOK {
			t.Fatalf("release of held id %q: got %d %s, want 200 (a held id is still released)", user, r.Status, r.Body)
		}
		rec := e.streamRecords(t)[0]
		if rec.UserID != "alice\uFFFD" {
			t.Errorf("audit user_id for %q: got %q, want %q", user, rec.UserID, "alice\uFFFD")
		}
		if rec.Reason != "clean up ❤️" {
			t.Errorf("audit reason: got %q, want the emoji's variation selector kept", rec.Reason)
		}
	}
}

func TestAdminPage(t *testing.T) {
	t.Parallel()
	e := newAdminEnv(t, nil)
	get := func(t *testing.T, path string) (*http.Response, string) {
		t.Helper()
		client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Get(e.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for _, tc := range []struct {
		path, contentType string
	}{
		{"/admin/", "text/html"},
		{"/admin/app.js", "text/javascript"},
		{"/admin/app.css", "text/css"},
		{"/admin/favicon.svg", "image/svg+xml"},
	} {
		t.Run(tc.path+" is served under a strict CSP", func(t *testing.T) {
			resp, _ := get(t, tc.path)
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.contentType) {
				t.Errorf("got %d %q, want 200 %s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.contentType)
			}
			csp := resp.Header.Get("Content-Security-Policy")
			for _, want := range []string{"default-src 'self'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'"} {
				if !strings.Contains(csp, want) {
					t.Errorf("Content-Security-Policy: got %q, want it to hold %q", csp, want)
				}
			}
			if strings.Contains(csp, "unsafe-") {
				t.Errorf("Content-Security-Policy: got %q, want no unsafe- source", csp)
			}
			if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("X-Content-Type-Options: got %q, want nosniff", resp.Header.Get("X-Content-Type-Options"))
			}
		})
	}
	t.Run("the page holds no inline script, handler or style", func(t *testing.T) {
		_, html := get(t, "/admin/")
		lower := strings.ToLower(html)
		for i, part := range strings.Split(lower, "<script")[1:] {
			tag, rest, _ := strings.Cut(part, ">")
			if !strings.Contains(tag, " src=") || !strings.HasPrefix(strings.TrimSpace(rest), "</script>") {
				t.Errorf("script %d: got <script%s>%.40s, want an empty element with src", i+1, tag, rest)
			}
		}
		for _, bad := range []string{" onclick=", " onload=", " onsubmit=", " oninput=", " style=", "<style", "javascript:", "http://", "https://"} {
			if strings.Contains(lower, bad) {
				t.Errorf("index.html holds %q", bad)
			}
		}
	})
	t.Run("/admin redirects to /admin/", func(t *testing.T) {
		resp, _ := get(t, "/admin")
		if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/admin/" {
			t.Errorf("got %d Location %q, want 301 to /admin/", resp.StatusCode, resp.Header.Get("Location"))
		}
	})
	t.Run("an unknown page file is 404", func(t *testing.T) {
		if resp, _ := get(t, "/admin/nope.js"); resp.StatusCode != 404 {
			t.Errorf("got %d, want 404", resp.StatusCode)
		}
	})
}

func TestAdminSpecListsTheAdminRoutes(t *testing.T) {
	doc := apitest.Spec(t)
	for _, path := range []string{httpapi.PathAdminUserSlots, httpapi.PathAdminUserRelease, httpapi.PathAdminUserOverride,
		httpapi.PathAdminPoolKey, httpapi.PathAdminPoolKeyOverride, httpapi.PathAdminAudit} {
		if doc.Paths.Value(path) == nil {
			t.Errorf("api/openapi.yaml paths: got no %s, want it (pkg/admin serves it)", path)
		}
	}
}

// mustJSON is v as JSON.
func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
