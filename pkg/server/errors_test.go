package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
)

// TestAPoolFailingClosedIsNamedInItsOutage: an acquire that a pool
// failing closed refused in an outage answers 503 limiter_unavailable
// naming the pool, not "this plan fails closed" (its plan may fail
// open); the plan's own outage keeps its message.
func TestAPoolFailingClosedIsNamedInItsOutage(t *testing.T) {
	err := fmt.Errorf("acquire: %w", &limiter.PoolUnavailableError{Pool: "acct", Key: "a1", Err: fmt.Errorf("the user's slot: %w", limiter.ErrUnavailable)})
	status, e := server.APIError(err)
	if status != http.StatusServiceUnavailable || e.Code != httpapi.CodeUnavailable || !strings.Contains(e.Message, `pool "acct" fails closed`) || strings.Contains(e.Message, "plan") {
		t.Errorf("a pool's outage: %d %+v; want 503 %s naming pool acct, not the plan", status, e, httpapi.CodeUnavailable)
	}
	status, e = server.APIError(limiter.ErrUnavailable)
	if status != http.StatusServiceUnavailable || !strings.Contains(e.Message, "this plan fails closed") {
		t.Errorf("a plan's outage: %d %+v; want 503 saying the plan fails closed", status, e)
	}
}

// TestAnUnconfirmedSlotIsAnsweredAsSuch: with redis.syncReplicas 1 on a
// standalone Redis (no replica), a Closed plan's acquire answers 503
// limiter_unavailable saying the replicas did not confirm the slot, not
// that Redis did not answer: it did, and the operator must look at its
// replicas.
func TestAnUnconfirmedSlotIsAnsweredAsSuch(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Limiter: limiter.Options{SyncReplicas: 1}}).Limiter)
	r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: newUser(t), Plan: "closed"})
	var e httpapi.ErrorResponse
	if r.status != http.StatusServiceUnavailable || json.Unmarshal(r.body, &e) != nil || e.Error.Code != httpapi.CodeUnavailable {
		t.Fatalf("acquire: %d %s; want 503 %s", r.status, r.body, httpapi.CodeUnavailable)
	}
	if !strings.Contains(e.Error.Message, "redis.syncReplicas") || strings.Contains(e.Error.Message, "did not answer") {
		t.Errorf("message %q; want it to name redis.syncReplicas, not a Redis that did not answer", e.Error.Message)
	}
}
