package telemetry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// A wait the process ends as it shuts down (the front end cancels its
// context with limiter.ErrShuttingDown as the cause, or an error that
// wraps it: serve's drain, a holder's EndWaits) is counted failed, in a
// user's queue and in a pool key's: its caller did not leave, the limiter
// gave up on it. One the front end ends as it revokes the caller
// (limiter.ErrRevoked, wrapped) is counted revoked. A wait whose caller
// left is still cancelled.
func TestAWaitEndedByAShutdownIsCountedFailed(t *testing.T) {
	s := newPoolStackOf(t, poolWaitTiers(), true, pools.Pool{Pool: "model", Keys: map[string]int{"gpt-4o": 1}, MaxWait: 10 * time.Second}.WithDefaults())
	ctx := context.Background()
	// ended runs req, waiting, until waiting shows on /metrics, then
	// cancels it with cause (nil: the caller left).
	ended := func(req limiter.AcquireRequest, waiting string, cause error) {
		t.Helper()
		waitCtx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		done := make(chan error, 1)
		go func() {
			_, err := s.lim.Acquire(waitCtx, req)
			done <- err
		}()
		awaitLine(t, s.tel, waiting)
		cancel(cause)
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("acquire whose wait was ended (cause %v): %v; want context.Canceled", cause, err)
		}
	}

	user := "shutdown-" + keys.NewStreamID()[:12]
	for range 3 { // gold's limit
		if res, err := s.lim.Acquire(ctx, limiter.AcquireRequest{UserID: user, Plan: "gold"}); err != nil || !res.Granted {
			t.Fatalf("acquire within gold's limit: %+v, %v; want granted", res, err)
		}
	}
	inQueue := limiter.AcquireRequest{UserID: user, Plan: "gold", Wait: 10 * time.Second}
	ended(inQueue, `limiter_acquire_waiting{plan="gold"} 1`, limiter.ErrShuttingDown)
	ended(inQueue, `limiter_acquire_waiting{plan="gold"} 1`, fmt.Errorf("holder closed: %w", limiter.ErrShuttingDown))
	ended(inQueue, `limiter_acquire_waiting{plan="gold"} 1`, nil)
	ended(inQueue, `limiter_acquire_waiting{plan="gold"} 1`, fmt.Errorf("tokens file: %w", limiter.ErrRevoked))
	for outcome, n := range map[limiter.WaitOutcome]string{limiter.WaitFailed: "2", limiter.WaitCancelled: "1", limiter.WaitRevoked: "1"} {
		line := `limiter_acquire_wait_total{outcome="` + string(outcome) + `",plan="gold"}`
		expectLines(t, s.tel, line, line+" "+n)
	}

	model := map[string]string{"model": "gpt-4o"}
	if res, err := s.lim.Acquire(ctx, limiter.AcquireRequest{UserID: "shutdown-holder-" + keys.NewStreamID()[:12], Plan: "gold", Pools: model}); err != nil || !res.Granted {
		t.Fatalf("the pool key's holder: %+v, %v; want granted", res, err)
	}
	forKey := func() limiter.AcquireRequest {
		return limiter.AcquireRequest{UserID: "shutdown-" + keys.NewStreamID()[:12], Plan: "gold", Pools: model, Wait: 10 * time.Second}
	}
	ended(forKey(), `limiter_pool_acquire_waiting{pool="model",priority="5"} 1`, limiter.ErrShuttingDown)
	ended(forKey(), `limiter_pool_acquire_waiting{pool="model",priority="5"} 1`, nil)
	ended(forKey(), `limiter_pool_acquire_waiting{pool="model",priority="5"} 1`, limiter.ErrRevoked)
	for outcome, n := range map[limiter.WaitOutcome]string{limiter.WaitFailed: "1", limiter.WaitCancelled: "1", limiter.WaitRevoked: "1"} {
		line := `limiter_pool_acquire_wait_total{outcome="` + string(outcome) + `",pool="model",priority="5"}`
		expectLines(t, s.tel, line, line+" "+n)
	}
}
