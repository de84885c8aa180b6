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
	// waiting in its user's queue (AcquireRequest.Wait). Waits in a pool
	// key's queue go to PoolWaiting instead.
	Waiting(ctx context.Context, tier tiers.Tier, delta int)
	// Waited reports how a wait in its user's queue ended, and how long
	// it took.
	Waited(ctx context.Context, tier tiers.Tier, outcome WaitOutcome, took time.Duration)
	// PoolWaiting reports an acquire that starts (delta 1) or stops (-1)
	// waiting in the queue of a key of pool (DESIGN §17), at its tier's
	// priority (0 to tiers.MaxPriority). As for Joined, the key is not
	// passed.
	PoolWaiting(ctx context.Context, pool string, priority, delta int)
	// PoolWaited reports how a wait in the queue of a key of pool ended,
	// at its tier's priority, and how long it took. WaitFull there means
	// the key's queue was full; WaitCancelled includes a membership
	// granted as the caller left (given back), WaitRevoked one granted as
	// the caller was revoked.
	PoolWaited(ctx context.Context, pool string, priority int, outcome WaitOutcome, took time.Duration)
	// Joined reports one pool step of an acquire: how its membership of a
	// key of pool ended, with the key's live memberships after the step
	// (used) and the cap it was judged by (limit, an override's when one
	// is in force). used is 0 when Redis did not count (JoinDegraded,
	// JoinUnavailable). The key is not passed: metrics are labelled by
	// pool name only.
	Joined(ctx context.Context, pool string, outcome JoinOutcome, used, limit int)
	// PoolReclaimed reports memberships of a key of pool that had expired
	// instead of being left, found and removed by an acquire, a wait or
	// a heartbeat on the key (members > 0 only). As for Joined, the key
	// is not passed.
	PoolReclaimed(ctx context.Context, pool string, members int)
}

// JoinOutcome says how one pool step of an acquire ended: the outcome
// label of the pool metrics.
type JoinOutcome string

// Outcomes of a pool step.
const (
	// JoinGranted: the key had room (or the stream held its membership
	// already). A later pool of the same acquire may still refuse it, and
	// the membership is then given back.
	JoinGranted JoinOutcome = "granted"
	// JoinLimited: the key held its cap; the acquire is refused
	// (AcquireResult.RefusedBy) and the pools after it are not asked.
	JoinLimited JoinOutcome = "limited"
	// JoinDegraded: the key's shard did not answer and the pool fails
	// open: the membership was granted uncounted (PoolGrant.Degraded).
	JoinDegraded JoinOutcome = "degraded"
	// JoinUnavailable: the key's shard did not answer and the pool fails
	// closed: the acquire answers ErrUnavailable.
	JoinUnavailable JoinOutcome = "unavailable"
	// JoinShadowRefused: the key held its cap and the pool is in shadow
	// mode (enforce: false): the membership was granted all the same, and
	// counted (PoolGrant.WouldRefuse).
	JoinShadowRefused JoinOutcome = "shadow_refused"
)

type nopObserver struct{}

func (nopObserver) Acquired(context.Context, tiers.Tier, AcquireResult, error)          {}
func (nopObserver) Heartbeated(context.Context, HeartbeatResult, error)                 {}
func (nopObserver) Released(context.Context, ReleaseResult, error)                      {}
func (nopObserver) Reclaimed(context.Context, string, int)                              {}
func (nopObserver) RedisCall(context.Context, string, time.Duration, error)             {}
func (nopObserver) Waiting(context.Context, tiers.Tier, int)                            {}
func (nopObserver) Waited(context.Context, tiers.Tier, WaitOutcome, time.Duration)      {}
func (nopObserver) Joined(context.Context, string, JoinOutcome, int, int)               {}
func (nopObserver) PoolReclaimed(context.Context, string, int)                          {}
func (nopObserver) PoolWaiting(context.Context, string, int, int)                       {}
func (nopObserver) PoolWaited(context.Context, string, int, WaitOutcome, time.Duration) {}
