package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
)

// TestASlotBelongsToTheCallerThatTookIt: with callers authenticated, a
// stream held by chat is not batch's or ops's to take over, extend,
// heartbeat (alone or in a batch) or release, whatever plans they may
// use: each answers 403 not_slot_holder and the slot stays as it was.
// chat's own calls go on.
func TestASlotBelongsToTheCallerThatTookIt(t *testing.T) {
	e, _ := newAuthEnv(t, writeCallers(t, callerLines), time.Hour)
	user := "u-" + time.Now().Format("150405.000000")
	got := e.as(t, chatToken, http.MethodPost, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "one", "stream_id": "secret-1"})
	if got.status != http.StatusOK {
		t.Fatalf("chat's acquire: %d %s", got.status, got.body)
	}
	var first httpapi.AcquireResponse
	if err := json.Unmarshal(got.body, &first); err != nil {
		t.Fatal(err)
	}
	for _, other := range []struct{ name, token string }{{"batch", batchToken}, {"ops", opsToken}} {
		for _, call := range []struct {
			path string
			body map[string]any
		}{
			{"/v1/slots/acquire", map[string]any{"user_id": user, "plan": "one", "stream_id": "secret-1"}},
			{"/v1/slots/heartbeat", map[string]any{"user_id": user, "plan": "one", "stream_id": "secret-1"}},
			{"/v1/slots/release", map[string]any{"user_id": user, "stream_id": "secret-1"}},
		} {
			got := e.as(t, other.token, http.MethodPost, call.path, call.body)
			if code := errorCode(t, got); got.status != http.StatusForbidden || code != httpapi.CodeNotSlotHolder {
				t.Errorf("%s %s: %d %s; want 403 %s", other.name, call.path, got.status, got.body, httpapi.CodeNotSlotHolder)
			}
		}
		batch := e.as(t, other.token, http.MethodPost, "/v1/slots/heartbeats", map[string]any{"slots": []map[string]any{{"user_id": user, "plan": "one", "stream_id": "secret-1"}}})
		var res httpapi.HeartbeatsResponse
		if err := json.Unmarshal(batch.body, &res); err != nil || batch.status != http.StatusOK || len(res.Results) != 1 ||
			res.Results[0].Alive || res.Results[0].Error == nil || res.Results[0].Error.Code != httpapi.CodeNotSlotHolder {
			t.Errorf("%s's batch heartbeat: %d %s; want the slot refused with %s", other.name, batch.status, batch.body, httpapi.CodeNotSlotHolder)
		}
	}
	slots, err := e.lim.Slots(t.Context(), user)
	if err != nil || slots.Used != 1 || !slots.Slots[0].ExpiresAt.Equal(first.ExpiresAt) || slots.Slots[0].Caller != "chat" {
		t.Fatalf("the slot after the others' calls: %+v, %v; want chat's, expiring at %v", slots, err, first.ExpiresAt)
	}
	if got := e.as(t, chatToken, http.MethodPost, "/v1/slots/heartbeat", map[string]any{"user_id": user, "plan": "one", "stream_id": "secret-1"}); got.status != http.StatusOK {
		t.Errorf("chat's heartbeat: %d %s", got.status, got.body)
	}
	if got := e.as(t, chatToken, http.MethodPost, "/v1/slots/release", map[string]any{"user_id": user, "stream_id": "secret-1"}); got.status != http.StatusOK {
		t.Errorf("chat's release: %d %s", got.status, got.body)
	}
}

func errorCode(t *testing.T, r reply) string {
	t.Helper()
	var body httpapi.ErrorResponse
	_ = json.Unmarshal(r.body, &body)
	return body.Error.Code
}

// TestAWaitingAcquiresPlaceBelongsToItsCaller: chat's acquire of stream
// w waits in its user's queue (plan wait, 1 stream, held). ops, which may
// use every plan, acquires w too: 403 not_slot_holder saying w waits in
// the queue under another caller, not a 429 of the full plan, and it
// takes nothing. chat's acquire is granted once the user's slot frees.
func TestAWaitingAcquiresPlaceBelongsToItsCaller(t *testing.T) {
	e, _ := newAuthEnvOf(t, writeCallers(t, "chat "+chatToken+" wait\nops "+opsToken+" *\n"), time.Hour, limitertest.Options{Tiers: waitTiers()})
	user := "u-" + time.Now().Format("150405.000000")
	if got := e.as(t, chatToken, http.MethodPost, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "wait", "stream_id": "a"}); got.status != http.StatusOK {
		t.Fatalf("chat's first acquire: %d %s", got.status, got.body)
	}
	waited := make(chan reply, 1)
	go func() {
		waited <- e.as(t, chatToken, http.MethodPost, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "wait", "stream_id": "w", "wait_ms": 3000})
	}()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if slots, err := e.lim.Slots(t.Context(), user); err == nil && len(slots.Queue) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("chat's acquire of w did not wait in the user's queue within 2s")
		}
	}
	got := e.as(t, opsToken, http.MethodPost, "/v1/slots/acquire", map[string]any{"user_id": user, "plan": "wait", "stream_id": "w"})
	var refused httpapi.ErrorResponse
	if got.status != http.StatusForbidden || json.Unmarshal(got.body, &refused) != nil || refused.Error.Code != httpapi.CodeNotSlotHolder ||
		!strings.Contains(refused.Error.Message, "waits in the queue under another caller") || !strings.Contains(refused.Error.Message, "a waiting acquire's place") {
		t.Fatalf("ops's acquire of w, waiting under chat: %d %s; want 403 not_slot_holder saying it waits in the queue under another caller", got.status, got.body)
	}
	if got := e.as(t, chatToken, http.MethodPost, "/v1/slots/release", map[string]any{"user_id": user, "stream_id": "a"}); got.status != http.StatusOK {
		t.Fatalf("chat's release of a: %d %s", got.status, got.body)
	}
	if r := <-waited; r.status != http.StatusOK {
		t.Fatalf("chat's waiting acquire of w once a was released: %d %s; want 200", r.status, r.body)
	}
	slots, err := e.lim.Slots(t.Context(), user)
	if err != nil || slots.Used != 1 || slots.Slots[0].StreamID != "w" || slots.Slots[0].Caller != "chat" {
		t.Errorf("the user's slots: %+v, %v; want w alone, chat's", slots, err)
	}
}
