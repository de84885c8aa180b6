package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// HeartbeatRequest names one held slot to keep alive.
type HeartbeatRequest struct {
	UserID   string
	Plan     string
	StreamID string
	// Caller names who asks, as AcquireRequest.Caller: a slot another
	// caller holds is not extended (ErrNotSlotHolder). Empty: any slot.
	Caller string
}

// HeartbeatResult is the answer to one heartbeat.
type HeartbeatResult struct {
	StreamID string
	// Alive: the slot is held and now expires at ExpiresAt.
	Alive     bool
	ExpiresAt time.Time
	// Degraded: Redis did not answer and the tier fails open; the slot is
	// assumed alive.
	Degraded bool
	// Used is the user's live slots after the heartbeat, as Redis counted
	// them; 0 when Redis did not answer.
	Used int
	// Plan is the plan the heartbeat was judged by: the request's, when
	// this replica's tier table holds (or held) it, else "" (it labels
	// metrics, and a request must not choose label values).
	Plan string
}

// Heartbeat extends a held slot by its own TTL, recorded when it was
// acquired, so the plan need not exist any more. Errors: ErrSlotLost when
// the slot is missing or expired (it is never re-added), the validation
// errors, ErrUnknownPlan for a slot without a recorded TTL (one taken by a
// version that recorded none) whose plan is unknown, ErrUnavailable when
// Redis is down and the tier, or a pool the stream joined, fails closed,
// and ErrRedisRefused when Redis refuses a script, the user's or a pool
// key's (a key of another type under the prefix).
func (l *Limiter) Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, error) {
	ctx, span := l.startSpan(ctx, "limiter.heartbeat")
	res, tier, err := l.heartbeat(ctx, req)
	if span.IsRecording() {
		span.SetAttributes(tierAttrs(tier, attrAlive.Bool(res.Alive), attrDegraded.Bool(res.Degraded))...)
	}
	endSpan(span, err)
	l.observer.Heartbeated(ctx, res, err)
	return res, err
}

func (l *Limiter) heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatResult, tiers.Tier, error) {
	key, tier, err := l.heartbeatTarget(req)
	if err != nil {
		return HeartbeatResult{StreamID: req.StreamID}, tier, err
	}
	end := l.decisionEnd() // the slot's and its memberships' (DESIGN §10 P4)
	later := l.beatRememberedLater(ctx, end, []HeartbeatRequest{req}, []tiers.Tier{tier}, []int{0})
	var beat lua.Beat
	err = l.doBy(ctx, end, "heartbeat", func(ctx context.Context, c rueidis.Client) (err error) {
		beat, err = lua.Heartbeat(ctx, c, req.Caller, key, req.StreamID, tier.SlotTTL)
		return err
	})
	later.wait()
	if err == nil && beat.Pruned > 0 {
		l.wake(ctx, key) // slots freed: whoever waits for them looks
	}
	res, err := l.beatResult(ctx, req, tier, beat, err)
	if err != nil {
		return res, tier, err
	}
	held, ttl := beat.Pools, membersTTL(beat, tier)
	switch {
	case res.Degraded && later.apply(0, &res, &err):
		return res, tier, err
	case res.Degraded:
		held, ttl = l.joined.peek(req.UserID, req.StreamID), degradedTTL(tier)
	case res.Alive && len(held) > 0:
		l.joined.remember(req.UserID, req.StreamID, req.Caller, held, time.Now())
	case res.Alive:
		l.joined.forget(req.UserID, req.StreamID) // its record names no pool
	}
	if res.Alive && len(held) > 0 {
		results, errs := []HeartbeatResult{res}, []error{nil}
		l.beatPools(ctx, end, []HeartbeatRequest{req}, []memberTTL{ttl}, [][]lua.PoolKey{held}, results, errs)
		res, err = results[0], errs[0]
	}
	return res, tier, err
}

// HeartbeatBatch heartbeats many slots in one pipelined round per Redis
// node. It returns one result and one error per request, in order; the
// per-slot errors are those of Heartbeat. The call fails as a whole only
// when ctx ends.
func (l *Limiter) HeartbeatBatch(ctx context.Context, reqs []HeartbeatRequest) ([]HeartbeatResult, []error) {
	ctx, span := l.startSpan(ctx, "limiter.heartbeat_batch")
	defer span.End()
	results := make([]HeartbeatResult, len(reqs))
	errs := make([]error, len(reqs))
	tiersOf := make([]tiers.Tier, len(reqs))
	args := make([]lua.HeartbeatArgs, 0, len(reqs))
	index := make([]int, 0, len(reqs)) // args[j] is reqs[index[j]]
	for i, req := range reqs {
		key, tier, err := l.heartbeatTarget(req)
		if err != nil {
			results[i], errs[i] = HeartbeatResult{StreamID: req.StreamID}, err
			continue
		}
		tiersOf[i] = tier
		args = append(args, lua.HeartbeatArgs{Key: key, StreamID: req.StreamID, TTL: tier.SlotTTL, Caller: req.Caller})
		index = append(index, i)
	}
	if len(args) > 0 {
		var pooled [][]lua.PoolKey // the memberships of the slots kept alive, by request; nil: none
		var ttls []memberTTL
		var beats []lua.Beat
		var beatErrs []error
		end := l.decisionEnd() // the slots' and their memberships' (DESIGN §10 P4)
		later := l.beatRememberedLater(ctx, end, reqs, tiersOf, index)
		callErr := l.doBy(ctx, end, "heartbeat_batch", func(ctx context.Context, c rueidis.Client) error {
			beats, beatErrs = lua.HeartbeatMulti(ctx, c, args, l.redis.NodeOf)
			return errors.Join(beatErrs...)
		})
		later.wait()
		for j, i := range index {
			var beat lua.Beat
			err := callErr // set alone when not connected
			if beats != nil {
				beat, err = beats[j], classify(ctx, "heartbeat_batch", beatErrs[j])
			}
			if err == nil && beat.Pruned > 0 {
				l.wake(ctx, args[j].Key) // slots freed: whoever waits for them looks
			}
			results[i], errs[i] = l.beatResult(ctx, reqs[i], tiersOf[i], beat, err)
			held, ttl := beat.Pools, membersTTL(beat, tiersOf[i])
			switch {
			case results[i].Degraded && later.apply(i, &results[i], &errs[i]):
				continue
			case results[i].Degraded:
				held, ttl = l.joined.peek(reqs[i].UserID, reqs[i].StreamID), degradedTTL(tiersOf[i])
			}
			if errs[i] == nil && results[i].Alive && len(held) > 0 {
				if pooled == nil {
					pooled, ttls = make([][]lua.PoolKey, len(reqs)), make([]memberTTL, len(reqs))
				}
				pooled[i], ttls[i] = held, ttl
			}
		}
		l.joined.rememberBeats(reqs, results, pooled, time.Now())
		if pooled != nil {
			l.beatPools(ctx, end, reqs, ttls, pooled, results, errs)
		}
	}
	var alive, lost, degraded int
	for i := range reqs {
		l.observer.Heartbeated(ctx, results[i], errs[i])
		switch {
		case results[i].Degraded:
			degraded++
		case results[i].Alive:
			alive++
		case errors.Is(errs[i], ErrSlotLost):
			lost++
		}
	}
	span.SetAttributes(attrBatchSize.Int(len(reqs)), attrBatchAlive.Int(alive),
		attrBatchLost.Int(lost), attrBatchDegraded.Int(degraded))
	return results, errs
}

func (l *Limiter) heartbeatTarget(req HeartbeatRequest) (string, tiers.Tier, error) {
	key, err := l.keys.HeldUserKey(req.UserID)
	if err != nil {
		return "", tiers.Tier{}, err
	}
	if err := keys.ValidateStreamID(req.StreamID); err != nil {
		return "", tiers.Tier{}, err
	}
	// Limits apply at acquire time, and held slots are kept: the slot's TTL
	// is recorded with it, and the tier only gives the TTL of slots that
	// have no record and the failure mode.
	tier, ok := l.tiers.LookupHeld(req.Plan)
	if !ok {
		// A plan this replica never held (deleted before it started): no
		// fallback TTL, and failure mode Open. The slot was granted and is
		// held; during an outage a degraded "alive" only lets a running
		// stream go on, it admits no new one, while Closed would end
		// streams over the limiter's own outage by a rule no one
		// configures any more. Plan stays empty: it labels metrics, and a
		// request must not choose label values.
		tier = tiers.Tier{FailureMode: tiers.FailOpen}
	}
	return key, tier, nil
}

// beatResult answers req from its beat, or from err, the classified error
// of its Redis call.
func (l *Limiter) beatResult(ctx context.Context, req HeartbeatRequest, tier tiers.Tier, beat lua.Beat, err error) (HeartbeatResult, error) {
	res := HeartbeatResult{StreamID: req.StreamID, Plan: tier.Plan}
	if err == nil {
		res.Used = beat.Used
	}
	if err == nil && beat.Pruned > 0 {
		l.observer.Reclaimed(ctx, tier.Plan, beat.Pruned)
	}
	switch {
	case err == nil && beat.Alive:
		res.Alive, res.ExpiresAt = true, msTime(beat.ExpiresAtMs)
		return res, nil
	case err == nil && beat.NotHolder:
		return res, fmt.Errorf("%w: stream %q of user %q", ErrNotSlotHolder, req.StreamID, req.UserID)
	case err == nil && beat.NoTTL:
		return res, fmt.Errorf("%w: %q, and stream %q has no recorded TTL", ErrUnknownPlan, req.Plan, req.StreamID)
	case err == nil:
		return res, fmt.Errorf("%w: stream %q", ErrSlotLost, req.StreamID)
	case degrade(tier.OutageMode(), err):
		l.warnDegraded(ctx, "redis unavailable; heartbeat answered degraded (failureMode Open)", "plan", tier.Plan, "err", err)
		res.Alive, res.Degraded = true, true
		// An estimate, as every degraded expiry: the slot's own TTL is in
		// Redis, and an unknown plan gives none.
		ttl := tier.SlotTTL
		if ttl == 0 {
			ttl = tiers.DefaultSlotTTL
		}
		res.ExpiresAt = degradedExpiry(ttl)
		return res, nil
	default:
		return res, err
	}
}

// rememberedLater is the refresh of the memberships this Limiter
// remembers (joinedGrants) for streams whose heartbeat their users' slots
// have not answered half a per-call timeout in: sent then, beside the
// users' call still on its way, so that a stream its user's shard leaves
// degraded (down, hung, slower than the timeout) keeps its places in the
// pool keys whose shards answer within the same decision (DESIGN §10: a
// node that is down never stops heartbeats to slots on healthy nodes;
// P4). They are kept as for a degraded stream (see beatPools), and the
// answers are used for the streams the users' call left degraded. A
// heartbeat answered in time sends nothing more; one answered degraded
// at once (its node refused the connection) refreshes them after, with
// the decision's time left.
type rememberedLater struct {
	timer   *time.Timer
	done    chan struct{}
	ran     bool            // set before done is closed
	pooled  [][]lua.PoolKey // by request; nil: none remembered
	results []HeartbeatResult
	errs    []error
}

// beatRememberedLater starts the rememberedLater of reqs[index[j]] (their
// tiers tiersOf), by end; nil when this Limiter remembers no stream's
// pool keys. reqs, tiersOf and index must not change until wait returns.
func (l *Limiter) beatRememberedLater(ctx context.Context, end time.Time, reqs []HeartbeatRequest, tiersOf []tiers.Tier, index []int) *rememberedLater {
	if l.joined.len() == 0 {
		return nil
	}
	r := &rememberedLater{done: make(chan struct{})}
	r.timer = time.AfterFunc(l.redis.Timeout()/2, func() {
		defer close(r.done)
		var pooled [][]lua.PoolKey
		var ttls []memberTTL
		var results []HeartbeatResult
		for _, i := range index {
			held := l.joined.peek(reqs[i].UserID, reqs[i].StreamID)
			if len(held) == 0 {
				continue
			}
			if pooled == nil {
				pooled, ttls, results = make([][]lua.PoolKey, len(reqs)), make([]memberTTL, len(reqs)), make([]HeartbeatResult, len(reqs))
			}
			pooled[i], ttls[i] = held, degradedTTL(tiersOf[i])
			results[i] = HeartbeatResult{Alive: true, Degraded: true}
		}
		if pooled == nil {
			return
		}
		errs := make([]error, len(reqs))
		l.beatPools(ctx, end, reqs, ttls, pooled, results, errs)
		r.ran, r.pooled, r.results, r.errs = true, pooled, results, errs
	})
	return r
}

// wait stops the refresh if it has not started, else waits for its end.
func (r *rememberedLater) wait() {
	if r != nil && !r.timer.Stop() {
		<-r.done
	}
}

// apply answers request i, left degraded by its user's slot, from the
// refresh of its memberships, when the refresh ran for it: alive and
// degraded still, or what a membership answered (lost, another caller's,
// its pool failing closed). It reports whether it did. After wait.
func (r *rememberedLater) apply(i int, res *HeartbeatResult, err *error) bool {
	if r == nil || !r.ran || r.pooled[i] == nil {
		return false
	}
	if e := r.errs[i]; e != nil {
		res.Alive, res.ExpiresAt, res.Degraded = false, time.Time{}, r.results[i].Degraded
		*err = e
	}
	return true
}
