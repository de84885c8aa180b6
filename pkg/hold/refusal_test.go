package hold_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/hold"
	"github.com/joishi/limiter/pkg/limiter"
)

// TestAnUnconfirmedSlotIsRefusedAsSuch: with redis.syncReplicas 1 on a
// standalone Redis (no replica), a Closed plan's acquire is refused 503
// limiter_unavailable, and the message says the replicas did not
// confirm the slot, not that the store cannot be reached: Redis answered,
// and an operator would look in the wrong place.
func TestAnUnconfirmedSlotIsRefusedAsSuch(t *testing.T) {
	t.Parallel()
	s := limitertest.New(t, limitertest.Options{Backend: limitertest.Standalone, Limiter: limiter.Options{SyncReplicas: 1}})
	_, err := s.Limiter.Acquire(context.Background(), limiter.AcquireRequest{UserID: newUser(), Plan: "closed"})
	r, known := hold.AcquireRefusal(err)
	if !known || r.Status != http.StatusServiceUnavailable || r.Error.Code != hold.CodeUnavailable {
		t.Fatalf("AcquireRefusal(%v) = %+v, %v; want 503 %s", err, r, known, hold.CodeUnavailable)
	}
	if !strings.Contains(r.Error.Message, "redis.syncReplicas") || strings.Contains(r.Error.Message, "cannot reach") {
		t.Errorf("message %q; want it to name redis.syncReplicas, not an unreachable store", r.Error.Message)
	}
}
