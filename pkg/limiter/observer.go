package limiter

import (
	"context"
	"time"

	"github.com/joishi/limiter/pkg/tiers"
)

// Observer is told the outcome of each operation; telemetry implements it.
// Methods must be cheap and must not block: they run on the request path.
type Observer interface {
	// Acquired reports one acquire. err is nil for grants and denials.
	Acquired(ctx context.Context, tier tiers.Tier, res AcquireResult, err error)
	// Heartbeated reports one heartbeat (each slot of a batch too).
	Heartbeated(ctx context.Context, res HeartbeatResult, err error)
	// Released reports one release.
	Released(ctx context.Context, res ReleaseResult, err error)
	// Reclaimed reports slots that had expired instead of being released,
	// found and removed by any operation (slots > 0 only). plan is the
	// request's tier, empty for releases, which carry none.
	Reclaimed(ctx context.Context, plan string, slots int)
	// RedisCall reports one round trip to Redis for op.
	RedisCall(ctx context.Context, op string, took time.Duration, err error)
	// Waiting reports an acquire that starts (delta 1) or stops (-1)
	// waiting in its user's queue (AcquireRequest.Wait).
	Waiting(ctx context.Context, tier tiers.Tier, delta int)
	// Waited reports how a wait in the queue ended, and how long it took.
	Waited(ctx context.Context, tier tiers.Tier, outcome WaitOutcome, took time.Duration)
}

type nopObserver struct{}

func (nopObserver) Acquired(context.Context, tiers.Tier, AcquireResult, error)     {}
func (nopObserver) Heartbeated(context.Context, HeartbeatResult, error)            {}
func (nopObserver) Released(context.Context, ReleaseResult, error)                 {}
func (nopObserver) Reclaimed(context.Context, string, int)                         {}
func (nopObserver) RedisCall(context.Context, string, time.Duration, error)        {}
func (nopObserver) Waiting(context.Context, tiers.Tier, int)                       {}
func (nopObserver) Waited(context.Context, tiers.Tier, WaitOutcome, time.Duration) {}
