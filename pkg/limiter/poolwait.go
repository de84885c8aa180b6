package limiter

import (
	"cmp"
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// Waiting for a full pool key (DESIGN §17). An acquire whose pool key is
// full, and that may still wait, takes a ticket in the key's queue: the
// queue of a user's slots (wait.go, queue.go, round.go), under the key's
// own hash tag, served by priority, then the user holding the fewest
// members of the key, then the user waiting for the fewest, then arrival
// (the wait script's order). The
// acquire's one wait budget runs across its user's queue and its pools':
// what the user's queue left of it, capped by each pool's maxWait.
//
// Meanwhile the stream holds its user's slot and the memberships taken
// before, which no one heartbeats yet: they are kept alive every heartbeat
// interval of the plan until the wait ends.

// poolWait is how long an acquire refused by pool may wait in the key's
// queue: what is left of its wait (until waitUntil; zero: it may not
// wait), capped by the pool's maxWait and the tier's.
func poolWait(waitUntil time.Time, tier tiers.Tier, pool pools.Pool) time.Duration {
	if waitUntil.IsZero() {
		return 0
	}
	return max(0, min(time.Until(waitUntil), pool.MaxWait, tier.MaxWait))
}

// poolWaited is how a wait in a pool key's queue ended.
type poolWaited struct {
	// grant, when the key granted the membership (err nil).
	grant *PoolGrant
	// refusal, when the wait ran out (or the queue was full: full).
	refusal *PoolRefusal
	full    bool
	// err: the caller left, or the wait failed (Redis, a pool removed).
	err error
	// unsure: the membership may have been granted without the answer
	// reaching the loop; the undo removes it.
	unsure bool
	// share: the grant's share of the membership, which the undo leaves
	// (see waitResult.share); holders, of one this replica's loop granted
	// to several waiters of the stream at once, who share it.
	share   lua.Share
	holders *atomic.Int32
	waited  time.Duration
	// extended: the grant extended a membership the stream held (another
	// request of it took it), which is counted granted (see outcome).
	extended bool
}

// awaitPool waits up to wait for a membership of m's key for the stream
// req names (of a budget that has left in all), keeping alive meanwhile
// what the acquire holds: the user's slot and the memberships taken
// (their keys' sorted sets).
func (l *Limiter) awaitPool(ctx context.Context, req AcquireRequest, tier tiers.Tier, m membership, wait, left time.Duration, taken []string) poolWaited {
	if req.OnWait != nil {
		req.OnWait(left)
	}
	req.waiting(true)
	defer req.waiting(false)
	start := time.Now()
	stop := l.keepAlive(ctx, req, tier, taken)
	defer stop()
	w := &waiter{
		streamID: poolMember(req.UserID, req.StreamID), stream: req.StreamID,
		record:  lua.Record{Caller: req.Caller, Plan: tier.Plan, Priority: tier.Priority, User: req.UserID, Label: req.Label, Token: req.token},
		slotTTL: tier.SlotTTL,
		ctx:     ctx, deadline: start.Add(wait), done: make(chan waitResult, 1),
	}
	r := l.waitIn(ctx, queueScope{key: m.slots, userID: req.UserID, pool: m.pool.Pool, poolKey: m.key}, tier, w)
	out := poolWaited{waited: time.Since(start), unsure: r.unsure, share: r.share, holders: r.holders}
	outcome := r.outcome
	limit, uncapped := m.limit, false
	if pool, ok := l.pools.Lookup(m.pool.Pool); ok {
		current, capped := pool.Limit(m.key)
		if capped {
			limit = current // the cap the queue served by, if it changed while the acquire waited
		}
		uncapped = !capped // lifted while it waited: the queue served it by none
	}
	if r.override >= 0 && !r.degraded && (r.outcome == WaitGranted || r.outcome == WaitTimeout || r.outcome == WaitFull) {
		limit = r.override
	}
	switch r.outcome {
	case WaitGranted:
		out.grant = &PoolGrant{Pool: m.pool.Pool, Key: m.key, Used: r.used, Limit: limit, Overridden: r.override >= 0, Degraded: r.degraded,
			// Let in by shadow mode, over the cap; an extension adds no
			// member, and answers the verdict its record keeps (as
			// acquire's extensions do).
			WouldRefuse: r.overLimit}
		out.extended = r.extended
		if r.degraded {
			out.grant.Used, out.grant.Limit, out.grant.Overridden = 0, m.limit, false
		}
		*out.grant = out.grant.judged(uncapped)
		if err := ctx.Err(); err != nil {
			out.err = err // granted as the caller left: the undo removes it
			outcome = WaitCancelled
		}
	case WaitTimeout, WaitFull:
		out.refusal = &PoolRefusal{Pool: m.pool.Pool, Key: m.key, Used: r.used, Limit: limit, RetryAfter: r.retry,
			Overridden: r.override >= 0 && !r.degraded}
		if r.outcome == WaitFull {
			out.full = true
			if !r.displaced {
				out.waited = 0 // refused at once, as a user's full queue is
			}
		}
		if uncapped {
			// Its cap lifted as its wait ran out: the acquire joins the
			// key uncapped (see joinPools), which its wait is counted as.
			outcome = WaitGranted
		}
	case WaitCancelled:
		out.err = cmp.Or(ctx.Err(), context.Canceled)
	default:
		out.err = r.err
	}
	l.observer.PoolWaited(ctx, m.pool.Pool, tier.Priority, observed(ctx, outcome), out.waited)
	return out
}

// keepAlive refreshes, every heartbeat interval of tier until stop is
// called, the user's slot of the stream req names and its memberships of
// taken (pool keys' sorted sets),
// each by its own TTL as a heartbeat would: an acquire that waits for a
// pool key holds them, and no one else heartbeats them yet. A refresh
// that fails is left to the next; the wait's own outcome decides.
func (l *Limiter) keepAlive(ctx context.Context, req AcquireRequest, tier tiers.Tier, taken []string) (stop func()) {
	var args []lua.HeartbeatArgs
	if key, err := l.keys.UserKey(req.UserID); err == nil {
		args = append(args, lua.HeartbeatArgs{Key: key, StreamID: req.StreamID, TTL: tier.SlotTTL, Caller: req.Caller})
	}
	member := poolMember(req.UserID, req.StreamID)
	for _, slots := range taken {
		args = append(args, lua.HeartbeatArgs{Key: slots, StreamID: member, TTL: tier.SlotTTL})
	}
	if len(args) == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(tier.HeartbeatInterval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			_ = l.do(ctx, "heartbeat_batch", func(ctx context.Context, c rueidis.Client) error {
				_, errs := lua.HeartbeatMulti(ctx, c, args, l.redis.NodeOf)
				return errors.Join(errs...)
			})
		}
	}()
	return func() { cancel(); <-done }
}
