package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/server"
)

// poolsAPI is the API of a limiter with pool model: gpt-4o capped at 1.
func poolsAPI(t *testing.T) *api {
	t.Helper()
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Limiter: limiter.Options{Pools: table}}).Limiter
	return newAPIOf(t, server.New(lim, server.Options{}))
}

// TestAcquireJoinsPoolsOverHTTP: a grant lists the pool keys it joined;
// the next acquire of the full key is 429 pool_limit_reached naming it,
// with Retry-After, never stream_limit_reached; once released, granted.
func TestAcquireJoinsPoolsOverHTTP(t *testing.T) {
	a := poolsAPI(t)
	suffix := time.Now().Format("150405.000000")
	first := a.call(t, http.MethodPost, "/v1/slots/acquire", mustJSON(t, map[string]any{"user_id": "ana-" + suffix, "plan": "one", "pools": map[string]string{"model": "gpt-4o"}}), false)
	var grant httpapi.AcquireResponse
	if first.status != http.StatusOK || json.Unmarshal(first.body, &grant) != nil || len(grant.Pools) != 1 ||
		grant.Pools[0] != (httpapi.PoolGrant{Pool: "model", Key: "gpt-4o", Used: 1, Limit: 1}) {
		t.Fatalf("first acquire: %d %s; want granted with model=gpt-4o 1 of 1", first.status, first.body)
	}
	second := a.call(t, http.MethodPost, "/v1/slots/acquire", mustJSON(t, map[string]any{"user_id": "bo-" + suffix, "plan": "one", "pools": map[string]string{"model": "gpt-4o"}}), false)
	var refused httpapi.ErrorResponse
	if second.status != http.StatusTooManyRequests || json.Unmarshal(second.body, &refused) != nil {
		t.Fatalf("second acquire: %d %s; want 429", second.status, second.body)
	}
	e := refused.Error
	if e.Code != httpapi.CodePoolLimitReached || e.Pool != "model" || e.Key != "gpt-4o" || e.Used == nil || *e.Used != 1 ||
		e.Limit == nil || *e.Limit != 1 || e.RetryAfterMs == nil || second.header.Get("Retry-After") == "" {
		t.Errorf("refusal: %s, Retry-After %q; want pool_limit_reached naming model=gpt-4o, 1 of 1", second.body, second.header.Get("Retry-After"))
	}
	if rel := a.call(t, http.MethodPost, "/v1/slots/release", mustJSON(t, map[string]any{"user_id": "ana-" + suffix, "stream_id": grant.StreamID}), false); rel.status != http.StatusOK {
		t.Fatalf("release: %d %s", rel.status, rel.body)
	}
	if third := a.call(t, http.MethodPost, "/v1/slots/acquire", mustJSON(t, map[string]any{"user_id": "bo-" + suffix, "plan": "one", "pools": map[string]string{"model": "gpt-4o"}}), false); third.status != http.StatusOK {
		t.Errorf("acquire after the release: %d %s; want granted", third.status, third.body)
	}
}

func TestAcquirePoolsAreChecked(t *testing.T) {
	a := poolsAPI(t)
	for _, tc := range []struct {
		name, body string
		invalid    bool
		status     int
		code, says string
	}{
		{"an unknown pool", `{"user_id":"u","plan":"one","pools":{"region":"eu"}}`, false, 422, httpapi.CodeUnknownPool, `region`},
		{"a key outside the charset", `{"user_id":"u","plan":"one","pools":{"model":"gpt 4o"}}`, true, 400, httpapi.CodeInvalidPoolKey, `gpt 4o`},
		{"five pools", `{"user_id":"u","plan":"one","pools":{"a":"1","b":"2","c":"3","d":"4","e":"5"}}`, true, 400, httpapi.CodeInvalidPoolKey, "more than 4 pools"},
		{"a pool named twice", `{"user_id":"u","plan":"one","pools":{"model":"a","model":"b"}}`, true, 400, httpapi.CodeInvalidRequest, "given twice"},
		{"pools not an object", `{"user_id":"u","plan":"one","pools":["model"]}`, true, 400, httpapi.CodeInvalidRequest, "pools"},
		{"a key not a string", `{"user_id":"u","plan":"one","pools":{"model":4}}`, true, 400, httpapi.CodeInvalidRequest, "pools.model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := a.call(t, http.MethodPost, "/v1/slots/acquire", []byte(tc.body), tc.invalid)
			if code := errorCode(t, got); got.status != tc.status || code != tc.code || !strings.Contains(string(got.body), tc.says) {
				t.Errorf("%d %s; want %d %s saying %s", got.status, got.body, tc.status, tc.code, tc.says)
			}
		})
	}
}

// TestAPoolWaitThatRunsOutIsThePoolsRefusal: an acquire with wait_ms on
// a full pool key that may be waited for queues, and when its wait runs
// out answers the pool's 429 with waited_ms, as the OpenAPI contract
// says (the transport checks it).
func TestAPoolWaitThatRunsOutIsThePoolsRefusal(t *testing.T) {
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}, MaxWait: 5 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Pools: table}}).Limiter
	a := newAPIOf(t, server.New(lim, server.Options{}))
	suffix := time.Now().Format("150405.000000")
	acquire := func(user string, waitMs int) reply {
		return a.post(t, "/v1/slots/acquire", map[string]any{"user_id": user + "-" + suffix, "plan": "wait", "wait_ms": waitMs, "pools": map[string]string{"model": "gpt-4o"}})
	}
	if r := acquire("ana", 0); r.status != http.StatusOK {
		t.Fatalf("first acquire: %d %s", r.status, r.body)
	}
	r := acquire("bo", 300)
	var refused httpapi.ErrorResponse
	if r.status != http.StatusTooManyRequests || json.Unmarshal(r.body, &refused) != nil || refused.Error.Code != httpapi.CodePoolLimitReached ||
		refused.Error.WaitedMs == nil || *refused.Error.WaitedMs < 200 || !strings.Contains(refused.Error.Message, "waited") {
		t.Fatalf("an acquire waiting 300ms for the full key: %d %s; want 429 pool_limit_reached with waited_ms", r.status, r.body)
	}
}

// TestAGrantListsNoKeyWhoseCapWasLiftedAsItWaited: an acquire waits for a
// place in model=gpt-4o (cap 1, held), and the key's cap is lifted
// meanwhile. Its 200 lists no pools, as a new acquire's, which joins no
// key without a cap: not gpt-4o with "used":2 above a "limit":1 it no
// longer has.
func TestAGrantListsNoKeyWhoseCapWasLiftedAsItWaited(t *testing.T) {
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}, MaxWait: 5 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	stack := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Pools: table}})
	a := newAPIOf(t, server.New(stack.Limiter, server.Options{}))
	suffix := time.Now().Format("150405.000000")
	acquire := func(user string, waitMs int) reply {
		return a.post(t, "/v1/slots/acquire", map[string]any{"user_id": user + "-" + suffix, "plan": "wait", "wait_ms": waitMs, "pools": map[string]string{"model": "gpt-4o"}})
	}
	if r := acquire("ana", 0); r.status != http.StatusOK {
		t.Fatalf("first acquire: %d %s", r.status, r.body)
	}
	waited := make(chan reply, 1)
	go func() { waited <- acquire("bo", 3000) }()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if key, err := stack.Limiter.PoolSlots(context.Background(), "model", "gpt-4o"); err == nil && len(key.Waiters) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("bo's acquire did not wait in model=gpt-4o's queue within 2s")
		}
	}
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"other": 1}, MaxWait: 5 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	r := <-waited
	var got httpapi.AcquireResponse
	if r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil || !got.Granted || got.WaitedMs == 0 {
		t.Fatalf("the acquire waiting as the key's cap was lifted: %d %s; want granted after a wait", r.status, r.body)
	}
	if len(got.Pools) != 0 || strings.Contains(string(r.body), `"pools"`) {
		t.Errorf("its answer: %s; want no pools, as a new acquire of the uncapped key answers", r.body)
	}
}

// TestAPoolRefusalSaysWhyItDidNotWait: a refusal says whose cap refused
// it, a support override's when one is in force, and why an acquire that
// asked to wait did not: the key capped at 0 (no place will free), or
// its queue full of waiters served first (waited_ms absent), not the
// pool's maxWait, which allows the wait.
func TestAPoolRefusalSaysWhyItDidNotWait(t *testing.T) {
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1, "shut": 5}, MaxWait: 5 * time.Second}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	lim := limitertest.New(t, limitertest.Options{Tiers: waitTiers(), Limiter: limiter.Options{Pools: table, MaxQueue: 1}}).Limiter
	a := newAPIOf(t, server.New(lim, server.Options{}))
	ctx := t.Context()
	if _, err := lim.SetPoolOverride(ctx, "model", "shut", limiter.OverrideRequest{MaxConcurrentStreams: 0, For: time.Hour, Actor: "test", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	suffix := time.Now().Format("150405.000000")
	acquire := func(user, key string, waitMs int) httpapi.Error {
		t.Helper()
		r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": user + "-" + suffix, "plan": "wait", "wait_ms": waitMs, "pools": map[string]string{"model": key}})
		var refused httpapi.ErrorResponse
		if r.status != http.StatusTooManyRequests || json.Unmarshal(r.body, &refused) != nil || refused.Error.Code != httpapi.CodePoolLimitReached {
			t.Fatalf("%s's acquire of model=%s: %d %s; want 429 pool_limit_reached", user, key, r.status, r.body)
		}
		return refused.Error
	}
	e := acquire("ana", "shut", 400)
	if !strings.Contains(e.Message, "(a support override of the key's cap") || !strings.Contains(e.Message, "model=shut is capped at 0, so no place will free") ||
		strings.Contains(e.Message, "maxWait") || e.WaitedMs != nil {
		t.Errorf("a wait for a key an override caps at 0: %+v; want the override named, and the cap of 0 as why it did not wait", e)
	}

	if r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": "holder-" + suffix, "plan": "wait", "pools": map[string]string{"model": "gpt-4o"}}); r.status != http.StatusOK {
		t.Fatalf("the holder: %d %s", r.status, r.body)
	}
	waiting := make(chan reply, 1)
	go func() {
		waiting <- a.post(t, "/v1/slots/acquire", map[string]any{"user_id": "bo-" + suffix, "plan": "wait", "wait_ms": 3000, "pools": map[string]string{"model": "gpt-4o"}})
	}()
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if key, err := lim.PoolSlots(ctx, "model", "gpt-4o"); err == nil && len(key.Waiters) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("bo's acquire did not queue within 3s")
		}
	}
	e = acquire("cy", "gpt-4o", 400) // cy holds none of the key, as bo: served after bo, who came first
	if !strings.Contains(e.Message, "the queue of pool key model=gpt-4o holds its most waiters, 1, each served before") || strings.Contains(e.Message, "maxWait") || e.WaitedMs != nil {
		t.Errorf("a wait for a key whose queue is full: %+v; want the full queue as why it did not wait, no waited_ms", e)
	}
	if e.Limit == nil || *e.Limit != 1 || strings.Contains(e.Message, "override") {
		t.Errorf("the refusal of model=gpt-4o: %+v; want the pool's cap of 1", e)
	}
	<-waiting

	// The user's own queue, full (MaxQueue 1) of the user's first waiter.
	dee := "dee-" + suffix
	if r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": dee, "plan": "wait"}); r.status != http.StatusOK {
		t.Fatalf("dee's first: %d %s", r.status, r.body)
	}
	go func() {
		waiting <- a.post(t, "/v1/slots/acquire", map[string]any{"user_id": dee, "plan": "wait", "wait_ms": 1000})
	}()
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if slots, err := lim.Slots(ctx, dee); err == nil && len(slots.Queue) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("dee's second acquire did not queue within 3s")
		}
	}
	r := a.post(t, "/v1/slots/acquire", map[string]any{"user_id": dee, "plan": "wait", "wait_ms": 400})
	var refused httpapi.ErrorResponse
	if r.status != http.StatusTooManyRequests || json.Unmarshal(r.body, &refused) != nil || refused.Error.Code != httpapi.CodeStreamLimitReached ||
		!strings.Contains(refused.Error.Message, "the user's queue holds its most waiters, 1") || refused.Error.WaitedMs != nil {
		t.Errorf("a wait in a full user's queue: %d %s; want 429 stream_limit_reached saying the queue is full, no waited_ms", r.status, r.body)
	}
	<-waiting
}
