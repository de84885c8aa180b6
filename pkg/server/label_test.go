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
