package admin_test

import (
	"context"
	"github.com/joishi/limiter/internal/apitest"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// llama is a model name that holds a '/': one path segment, escaped.
const llama = "meta-llama/Llama-3.1-70B-Instruct"

// newPoolEnv is an admin env whose limiter holds the pools model (gpt-4o
// capped at 3, llama at 2, any other key at 2 by default) and org (acme
// capped at 1, no default: other keys are not capped).
func newPoolEnv(t *testing.T, backend limitertest.Backend) *adminEnv {
	t.Helper()
	two := 2
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{
		pools.Pool{Pool: "model", MaxConcurrentStreams: &two, Keys: map[string]int{"gpt-4o": 3, llama: 2}}.WithDefaults(),
		pools.Pool{Pool: "org", Keys: map[string]int{"acme": 1}}.WithDefaults(),
	}); err != nil {
		t.Fatal(err)
	}
	return newAdminEnvOn(t, limitertest.Options{Backend: backend, Limiter: limiter.Options{Pools: table}}, nil)
}

// join acquires a stream of user (plan three) that joins key of model,
// and returns its result.
func (e *adminEnv) join(t *testing.T, user, key, label string) limiter.AcquireResult {
	t.Helper()
	res, err := e.lim.Acquire(context.Background(), limiter.AcquireRequest{UserID: user, Plan: "three", Caller: "chat-api", Label: label,
		Pools: map[string]string{"model": key}})
	if err != nil {
		t.Fatalf("acquire of %s joining model=%s: %v", user, key, err)
	}
	return res
}

// TestAdminPoolKey: the listing of a pool key names each holder's user
// and stream with the record of its acquire (caller, label, plan, since,
// expiry), the key's cap, and is audited naming the pool key; on a Redis
// Cluster, where the key is a slot of its own, too.
func TestAdminPoolKey(t *testing.T) {
	for _, b := range []limitertest.Backend{limitertest.Standalone, limitertest.RedisCluster} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			e := newPoolEnv(t, b)
			users := []string{newUser(), newUser()}
			streams := map[string]string{} // stream id → user
			for i, user := range users {
				res := e.join(t, user, "gpt-4o", "pod-"+string(rune('a'+i)))
				if !res.Granted || len(res.Pools) != 1 {
					t.Fatalf("acquire %d: got %+v, want granted with a membership of model=gpt-4o", i, res)
				}
				streams[res.StreamID] = user
			}
			r := e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "gpt-4o"), token: viewerToken})
			got := apitest.Decode[httpapi.AdminPoolKeyResponse](t, r, http.StatusOK)
			if got.Pool != "model" || got.Key != "gpt-4o" || got.Used != 2 || len(got.Holders) != 2 || got.Limit == nil || *got.Limit != 3 || got.Override != nil {
				t.Fatalf("pool key: got %+v, want model=gpt-4o with 2 holders, limit 3, no override", got)
			}
			for _, h := range got.Holders {
				if streams[h.StreamID] != h.UserID || h.UserID == "" {
					t.Errorf("holder %+v: got user %q for stream %s, want %q", h, h.UserID, h.StreamID, streams[h.StreamID])
				}
				if h.Caller != "chat-api" || h.Plan != "three" || !strings.HasPrefix(h.Label, "pod-") || h.StartedAt == nil || h.AgeMs == nil ||
					h.TTLMs <= 9_000 || h.TTLMs > 10_000 || time.Until(h.ExpiresAt) > 11*time.Second {
					t.Errorf("holder %+v: want caller chat-api, plan three, a pod- label, a start, an age and about 10s left", h)
				}
			}
			rec := e.streamRecords(t)[0]
			if rec.AuditID != r.Header.Get(httpapi.HeaderAuditID) || rec.Action != httpapi.ActionListSlots || rec.Pool != "model" || rec.Key != "gpt-4o" ||
				rec.UserID != "" || rec.Actor != "vera" || rec.Outcome != httpapi.OutcomeOK {
				t.Errorf("audit record: got %+v, want list_slots of model=gpt-4o by vera, no user", rec)
			}
			line := auditLines(t, e.log)
			if last := line[len(line)-1]; last["pool"] != "model" || last["key"] != "gpt-4o" {
				t.Errorf("audit log line: got %v, want pool model and key gpt-4o", last)
			}
		})
	}
}

// TestAdminPoolKeyHostileCallers: whatever spelling a caller tries, a
// call reaches exactly the pool key it names, or is refused with the
// reason, audited; the path is never resolved to another key.
func TestAdminPoolKeyHostileCallers(t *testing.T) {
	t.Parallel()
	e := newPoolEnv(t, limitertest.Standalone)
	user := newUser()
	held := e.join(t, user, "gpt-4o", "")
	llamaHeld := e.join(t, user, llama, "")
	max := strings.Repeat("k", 128)

	for _, tc := range []struct {
		name       string
		pool, key  string
		path       string // default AdminPoolKeyPath(pool, key)
		token      string // default viewerToken
		invalid    bool
		status     int
		code       string
		holders    []string // the streams listed, on a 200
		limit      int      // on a 200; -1: absent (not capped)
		wantDetail string
	}{
		{name: "a model name holding a '/' is one escaped segment", pool: "model", key: llama, status: 200, holders: []string{llamaHeld.StreamID}, limit: 2},
		{name: "another case is another key, judged by the pool's default", pool: "model", key: "GPT-4o", status: 200, limit: 2},
		{name: "the key's '/' sent unescaped reaches no pool key", pool: "model", key: llama, path: "/v1/admin/pools/model/keys/" + llama, status: 404, code: httpapi.CodeNotFound},
		{name: "an escaped slash elsewhere is not the key with a slash", pool: "model", key: "meta-llama", path: httpapi.AdminPoolKeyPath("model", "meta-llama"), status: 200, limit: 2},
		{name: "the key a//b is one key, not a/b", pool: "model", key: "a//b", status: 200, limit: 2},
		{name: "the key a/ is one key, not a", pool: "model", key: "a/", status: 200, limit: 2},
		{name: "the key / is a key", pool: "model", key: "/", status: 200, limit: 2},
		{name: "the key ./a is a key, not a", pool: "model", key: "./a", status: 200, limit: 2},
		{name: "the key . is a key, not this directory", pool: "model", key: ".", status: 200, limit: 2},
		{name: "the key .. is a key, not the parent directory", pool: "model", key: "..", status: 200, limit: 2},
		{name: "a key of 128 bytes is a key", pool: "model", key: max, status: 200, limit: 2},
		{name: "a key of 129 bytes is 400 invalid_pool_key", pool: "model", key: max + "k", invalid: true, status: 400, code: httpapi.CodeInvalidPoolKey, wantDetail: "1-128 bytes"},
		{name: "a key with a space is 400 invalid_pool_key", pool: "model", key: "gpt 4o", invalid: true, status: 400, code: httpapi.CodeInvalidPoolKey},
		{name: "a key with a brace is 400 invalid_pool_key", pool: "model", key: "gpt-4o}", invalid: true, status: 400, code: httpapi.CodeInvalidPoolKey},
		{name: "a pool not configured is 422 unknown_pool, naming it and those held", pool: "region", key: "eu", status: 422, code: httpapi.CodeUnknownPool, wantDetail: `"region" is not one of the pools configured (model, org)`},
		{name: "the pool's name in another case is not the pool", pool: "Model", key: "gpt-4o", status: 422, code: httpapi.CodeUnknownPool},
		{name: "a key the pool does not cap is listed without a limit", pool: "org", key: "globex", status: 200, limit: -1},
		{name: "no token is 401", pool: "model", key: "gpt-4o", token: "-", status: 401, code: httpapi.CodeUnauthorized},
		{name: "a wrong token is 401", pool: "model", key: "gpt-4o", token: "not-a-token-0123456789", status: 401, code: httpapi.CodeUnauthorized, wantDetail: "unknown token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path
			if path == "" {
				path = httpapi.AdminPoolKeyPath(tc.pool, tc.key)
			}
			token := tc.token
			switch token {
			case "":
				token = viewerToken
			case "-":
				token = ""
			}
			r := e.do(t, adminCall{method: "GET", path: path, token: token, invalid: tc.invalid})
			if tc.code != "" {
				if e := apitest.WantError(t, r, tc.status, tc.code); !strings.Contains(e.Message, tc.wantDetail) {
					t.Errorf("message: got %q, want it to say %q", e.Message, tc.wantDetail)
				}
			} else {
				got := apitest.Decode[httpapi.AdminPoolKeyResponse](t, r, tc.status)
				var streams []string
				for _, h := range got.Holders {
					streams = append(streams, h.StreamID)
				}
				if got.Pool != tc.pool || got.Key != tc.key || !sameIDs(streams, tc.holders) || got.Used != len(tc.holders) {
					t.Errorf("got %s=%s with holders %v, want %s=%s with %v", got.Pool, got.Key, streams, tc.pool, tc.key, tc.holders)
				}
				if (tc.limit < 0) != (got.Limit == nil) || (got.Limit != nil && *got.Limit != tc.limit) {
					t.Errorf("limit: got %v, want %d (-1: absent)", got.Limit, tc.limit)
				}
			}
			if tc.status == http.StatusNotFound || tc.status == http.StatusUnauthorized {
				return // no route, or a record only logged
			}
			if rec := e.streamRecords(t)[0]; rec.AuditID != r.Header.Get(httpapi.HeaderAuditID) || rec.Pool != tc.pool || rec.Key != tc.key ||
				(tc.code != "" && (rec.Outcome != tc.code || rec.Status != tc.status)) {
				t.Errorf("audit record: got %+v, want pool %q key %q outcome %q", rec, tc.pool, tc.key, tc.code)
			}
		})
	}
	t.Run("the streams stay listed under their own key only", func(t *testing.T) {
		got := apitest.Decode[httpapi.AdminPoolKeyResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "gpt-4o"), token: viewerToken}), http.StatusOK)
		if len(got.Holders) != 1 || got.Holders[0].StreamID != held.StreamID || got.Holders[0].UserID != user {
			t.Errorf("model=gpt-4o: got %+v, want %s's stream %s alone", got.Holders, user, held.StreamID)
		}
	})
}

// TestAdminPoolOverride: an operator overrides a pool key's cap through
// the same route, body, bounds and audit as a user's: it judges every
// stream joining the key, shows in the key's listing, leaves another
// spelling of the key alone, and once removed the pool's cap applies
// again.
func TestAdminPoolOverride(t *testing.T) {
	t.Parallel()
	e := newPoolEnv(t, limitertest.RedisCluster)
	path := httpapi.AdminPoolKeyOverridePath("model", "gpt-4o")
	body := `{"max_concurrent_streams":4,"expires_in":3600,"reason":"ticket 4900:\nlaunch   traffic"}`

	r := e.do(t, adminCall{method: "POST", path: path, token: viewerToken, body: body})
	apitest.WantError(t, r, http.StatusForbidden, httpapi.CodeForbidden)
	if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionSetOverride || rec.Actor != "vera" || rec.Pool != "model" || rec.Key != "gpt-4o" ||
		rec.Reason != "ticket 4900: launch traffic" || rec.Override != nil {
		t.Errorf("record of the viewer's attempt: got %+v, want set_override of model=gpt-4o by vera with the reason, no override", rec)
	}

	r = e.do(t, adminCall{method: "POST", path: path, token: operatorToken, body: body})
	set := apitest.Decode[httpapi.AdminPoolOverrideResponse](t, r, http.StatusOK)
	if o := set.Override; set.Pool != "model" || set.Key != "gpt-4o" || o.MaxConcurrentStreams != 4 || o.Actor != "ola" || o.Reason != "ticket 4900: launch traffic" ||
		o.ExpiresAt.Sub(o.SetAt) != time.Hour || set.AuditID != r.Header.Get(httpapi.HeaderAuditID) {
		t.Fatalf("set: got %+v, want 4 streams for 1h on model=gpt-4o by ola, this call's audit id", set)
	}
	if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionSetOverride || rec.Outcome != httpapi.OutcomeOK || rec.Pool != "model" || rec.Key != "gpt-4o" ||
		rec.UserID != "" || rec.Override == nil || rec.Override.MaxConcurrentStreams != 4 || !rec.Override.ExpiresAt.Equal(set.Override.ExpiresAt) {
		t.Errorf("record of the override: got %+v, want set_override ok of model=gpt-4o, 4 streams", rec)
	}

	// The pool caps gpt-4o at 3: the override lets 4 users' streams join,
	// and no more.
	for i := range 4 {
		if res := e.join(t, newUser(), "gpt-4o", ""); !res.Granted || res.Pools[0].Limit != 4 {
			t.Fatalf("stream %d joining model=gpt-4o under an override of 4: got %+v, want granted, limit 4", i+1, res)
		}
	}
	if res := e.join(t, newUser(), "gpt-4o", ""); res.Granted || res.RefusedBy == nil || res.RefusedBy.Limit != 4 || res.RefusedBy.Used != 4 {
		t.Fatalf("5th stream: got %+v, want refused by model=gpt-4o at 4 of 4", res)
	}
	listed := apitest.Decode[httpapi.AdminPoolKeyResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "gpt-4o"), token: viewerToken}), http.StatusOK)
	if listed.Used != 4 || *listed.Limit != 3 || listed.Override == nil || listed.Override.MaxConcurrentStreams != 4 || listed.Override.Actor != "ola" || listed.Override.TTLMs <= 0 {
		t.Fatalf("listing: got %+v, want 4 holders, the pool's limit 3 and the override of 4", listed)
	}
	other := apitest.Decode[httpapi.AdminPoolKeyResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "GPT-4o"), token: viewerToken}), http.StatusOK)
	if other.Override != nil {
		t.Errorf("model=GPT-4o: got override %+v, want none (another key)", other.Override)
	}

	for i, want := range []bool{true, false} {
		r := e.do(t, adminCall{method: "DELETE", path: path, token: operatorToken, body: `{"reason":"ticket 4900: launch over"}`})
		if got := apitest.Decode[httpapi.AdminOverrideRemoveResponse](t, r, http.StatusOK); got.Removed != want {
			t.Errorf("removal %d: got removed %v, want %v", i+1, got.Removed, want)
		}
		if rec := e.streamRecords(t)[0]; rec.Action != httpapi.ActionRemoveOverride || rec.Pool != "model" || rec.Key != "gpt-4o" || rec.OverrideRemoved == nil ||
			*rec.OverrideRemoved != want || rec.Reason != "ticket 4900: launch over" {
			t.Errorf("record of removal %d: got %+v, want remove_override of model=gpt-4o, removed %v", i+1, rec, want)
		}
	}
	if res := e.join(t, newUser(), "gpt-4o", ""); res.Granted || res.RefusedBy == nil || res.RefusedBy.Limit != 3 {
		t.Errorf("a stream after the removal: got %+v, want refused by the pool's cap of 3 (4 held)", res)
	}

	t.Run("a key the pool does not cap takes no override", func(t *testing.T) {
		r := e.do(t, adminCall{method: "POST", path: httpapi.AdminPoolKeyOverridePath("org", "globex"), token: operatorToken, body: body})
		if got := apitest.WantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidRequest); !strings.Contains(got.Message, "caps neither key") {
			t.Errorf("message: got %q, want it to say the pool does not cap the key", got.Message)
		}
	})
	t.Run("a pool not configured is 422, for a set and a removal", func(t *testing.T) {
		for _, c := range []adminCall{
			{method: "POST", path: httpapi.AdminPoolKeyOverridePath("region", "eu"), token: operatorToken, body: body},
			{method: "DELETE", path: httpapi.AdminPoolKeyOverridePath("region", "eu"), token: operatorToken, body: `{"reason":"r"}`},
		} {
			apitest.WantError(t, e.do(t, c), http.StatusUnprocessableEntity, httpapi.CodeUnknownPool)
		}
	})
	t.Run("a key of 129 bytes is 400 invalid_pool_key", func(t *testing.T) {
		r := e.do(t, adminCall{method: "POST", path: httpapi.AdminPoolKeyOverridePath("model", strings.Repeat("k", 129)), token: operatorToken, body: body, invalid: true})
		apitest.WantError(t, r, http.StatusBadRequest, httpapi.CodeInvalidPoolKey)
	})
	t.Run("no token and a wrong token are 401", func(t *testing.T) {
		for _, token := range []string{"", "not-a-token-0123456789"} {
			apitest.WantError(t, e.do(t, adminCall{method: "POST", path: path, token: token, body: body}), http.StatusUnauthorized, httpapi.CodeUnauthorized)
		}
	})
}

// TestAdminDeletedPoolKeyOnEveryReplica: a pool deleted while a stream
// holds its key (DESIGN §16: support sees who holds a key, and removes
// its override) is listed, deleted, on the replica that saw it go and on
// one started since, which knows no definition of it; there, its key's
// override is removed, audited. A key of it that holds nothing is
// unknown on both, its override's removal too, as is a new override.
func TestAdminDeletedPoolKeyOnEveryReplica(t *testing.T) {
	t.Parallel()
	three := 3
	model := pools.Pool{Pool: "model", MaxConcurrentStreams: &three}.WithDefaults()
	org := pools.Pool{Pool: "org", MaxConcurrentStreams: &three}.WithDefaults()
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{model, org}); err != nil {
		t.Fatal(err)
	}
	e := newAdminEnvOn(t, limitertest.Options{Backend: limitertest.Standalone, Limiter: limiter.Options{Pools: table}}, nil)
	held := e.join(t, newUser(), "gpt-4o", "pod-a")
	r := e.do(t, adminCall{method: "POST", path: httpapi.AdminPoolKeyOverridePath("model", "gpt-4o"), token: operatorToken,
		body: `{"max_concurrent_streams":800,"expires_in":2592000,"reason":"launch"}`})
	apitest.Decode[httpapi.AdminPoolOverrideResponse](t, r, http.StatusOK)
	if err := table.Replace([]pools.Pool{org}); err != nil { // model is deleted
		t.Fatal(err)
	}
	later := pools.NewTable()
	if err := later.Replace([]pools.Pool{org}); err != nil {
		t.Fatal(err)
	}
	e2 := newAdminEnvOn(t, limitertest.Options{Backend: limitertest.Standalone, Limiter: limiter.Options{Pools: later, Keys: e.keys}}, nil)

	for _, c := range []struct {
		name  string
		e     *adminEnv
		limit *int
	}{{"the replica that saw the deletion", e, &three}, {"a replica started since", e2, nil}} {
		got := apitest.Decode[httpapi.AdminPoolKeyResponse](t, c.e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "gpt-4o"), token: viewerToken}), http.StatusOK)
		if !got.Deleted || len(got.Holders) != 1 || got.Holders[0].StreamID != held.StreamID || got.Override == nil ||
			(got.Limit == nil) != (c.limit == nil) || got.Limit != nil && *got.Limit != *c.limit {
			t.Errorf("%s lists the deleted pool's key: %+v; want deleted, its holder %s, its override, limit %v", c.name, got, held.StreamID, c.limit)
		}
	}
	for _, replica := range []*adminEnv{e, e2} {
		r = replica.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "llama"), token: viewerToken})
		apitest.WantError(t, r, http.StatusUnprocessableEntity, httpapi.CodeUnknownPool)
		r = replica.do(t, adminCall{method: "DELETE", path: httpapi.AdminPoolKeyOverridePath("model", "llama"), token: operatorToken, body: `{"reason":"r"}`})
		apitest.WantError(t, r, http.StatusUnprocessableEntity, httpapi.CodeUnknownPool)
	}
	r = e2.do(t, adminCall{method: "POST", path: httpapi.AdminPoolKeyOverridePath("model", "gpt-4o"), token: operatorToken,
		body: `{"max_concurrent_streams":5,"expires_in":60,"reason":"again"}`})
	apitest.WantError(t, r, http.StatusUnprocessableEntity, httpapi.CodeUnknownPool)

	r = e2.do(t, adminCall{method: "DELETE", path: httpapi.AdminPoolKeyOverridePath("model", "gpt-4o"), token: operatorToken, body: `{"reason":"pool gone"}`})
	if got := apitest.Decode[httpapi.AdminOverrideRemoveResponse](t, r, http.StatusOK); !got.Removed {
		t.Errorf("removing the deleted pool key's override on a replica started since: %+v; want removed", got)
	}
	if rec := e2.streamRecords(t)[0]; rec.Action != httpapi.ActionRemoveOverride || rec.Pool != "model" || rec.Key != "gpt-4o" || rec.Outcome != httpapi.OutcomeOK {
		t.Errorf("audit record of the removal: %+v; want remove_override of model=gpt-4o, ok", rec)
	}
	got := apitest.Decode[httpapi.AdminPoolKeyResponse](t, e.do(t, adminCall{method: "GET", path: httpapi.AdminPoolKeyPath("model", "gpt-4o"), token: viewerToken}), http.StatusOK)
	if got.Override != nil || len(got.Holders) != 1 {
		t.Errorf("the key after the removal: %+v; want its holder, no override", got)
	}
}
