package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// ReleaseResult is the answer to a release.
type ReleaseResult struct {
	// Released: the slot was held (live) and is now free. Releasing a
	// missing or already expired slot is not an error, only Released false.
	Released bool
	// Degraded: Redis did not answer, so whether the slot was released is
	// not known (the call may have run with only its answer lost). A slot
	// still held frees itself when its TTL runs out, so a release never
	// fails for an outage.
	Degraded bool
}

// Release frees one slot, whichever caller holds it: for code that holds
// its own slots (the proxy, ext_proc) and tests. A caller of the API
// releases through ReleaseAs. The memberships of a stream that this
// Limiter granted on nobody's behalf leave beside its slot, in one round
// trip, as ReleaseJoined's do (see joinedGrants); a stream another
// replica granted takes two, as its record names them.
// Errors: ErrInvalidUserID, ErrInvalidStreamID.
func (l *Limiter) Release(ctx context.Context, userID, streamID string) (ReleaseResult, error) {
	return l.ReleaseAs(ctx, "", userID, streamID)
}

// ReleaseAs frees one slot on behalf of caller: a slot that another
// caller holds (its record names another) is not released, and the error
// is ErrNotSlotHolder. caller "" releases any slot, as Release does.
// Errors: ErrInvalidUserID, ErrInvalidStreamID, ErrNotSlotHolder.
func (l *Limiter) ReleaseAs(ctx context.Context, caller, userID, streamID string) (ReleaseResult, error) {
	return l.traced(ctx, caller, userID, streamID, nil)
}

// ReleaseJoined is Release for code that holds its own slots and kept
// the pool keys its stream's grant joined (AcquireResult.Pools): their
// memberships leave in the same round trip as the slot (one pipeline per
// node), where Release drops them in a second one, after the slot's
// record has named them. The record still decides what leaves: a pool
// key it names that joined leaves out is dropped after, as by Release.
// A membership is its stream's alone (the stream and user ids), so one
// named in joined that the stream does not hold is not there to remove.
// Errors: ErrInvalidUserID, ErrInvalidStreamID.
func (l *Limiter) ReleaseJoined(ctx context.Context, userID, streamID string, joined []PoolGrant) (ReleaseResult, error) {
	return l.traced(ctx, "", userID, streamID, joined)
}

// traced is a release (see releaseBy) in its span, observed.
func (l *Limiter) traced(ctx context.Context, caller, userID, streamID string, joined []PoolGrant) (ReleaseResult, error) {
	ctx, span := l.startSpan(ctx, "limiter.release")
	res, err := l.releaseBy(ctx, time.Time{}, caller, userID, streamID, joined)
	if span.IsRecording() {
		span.SetAttributes(attrReleased.Bool(res.Released), attrDegraded.Bool(res.Degraded))
	}
	endSpan(span, err)
	l.observer.Released(ctx, res, err)
	return res, err
}

func (l *Limiter) release(ctx context.Context, caller, userID, streamID string) (ReleaseResult, error) {
	return l.releaseBy(ctx, time.Time{}, caller, userID, streamID, nil)
}

// releaseBy is release as one decision, answered by end (a zero end: one
// per-call timeout from now) with the memberships it drops: those of
// joined (see ReleaseJoined) beside the slot, when caller is "" (a
// release on somebody's behalf may be refused, and must then drop
// nothing), and those the slot's record names that joined does not,
// after it.
func (l *Limiter) releaseBy(ctx context.Context, end time.Time, caller, userID, streamID string, joined []PoolGrant) (ReleaseResult, error) {
	if end.IsZero() {
		end = l.decisionEnd()
	}
	key, err := l.keys.HeldUserKey(userID)
	if err != nil {
		return ReleaseResult{}, err
	}
	if err := keys.ValidateStreamID(streamID); err != nil {
		return ReleaseResult{}, err
	}
	var along []lua.Member // the memberships that leave beside the slot
	if caller == "" {
		// What this Limiter's grant joined, when the caller kept nothing.
		held := l.joined.take(userID, streamID)
		if joined != nil {
			held = counted(joined)
		}
		along = l.heldMembers(userID, streamID, held)
	}
	var got lua.Released
	var left []lua.Released // along's answers
	var leftErrs []error
	err = l.doBy(ctx, end, "release", func(ctx context.Context, c rueidis.Client) (err error) {
		if len(along) == 0 {
			got, err = lua.Release(ctx, c, caller, key, streamID)
			return err
		}
		answers, errs := lua.ReleaseAt(ctx, c, "", append([]lua.Member{{Key: key, ID: streamID}}, along...), l.redis.NodeOf)
		got, left, leftErrs = answers[0], answers[1:], errs[1:]
		return errs[0]
	})
	for i, m := range left {
		if leftErrs[i] == nil && m.Head != "" {
			l.wake(ctx, along[i].Key, m.Head)
		}
		if leftErrs[i] == nil {
			l.reclaimedAt(ctx, along[i].Key, m.Pruned)
		}
	}
	// Every plan's release fails open: a slot it misses frees itself when
	// its TTL runs out.
	if degrade(tiers.FailOpen, err) {
		l.warnDegraded(ctx, "redis unavailable; release answered degraded, the slot will expire by itself", "err", err)
		return ReleaseResult{Degraded: true}, nil
	}
	if err != nil {
		return ReleaseResult{}, err
	}
	if got.NotHolder {
		return ReleaseResult{}, fmt.Errorf("%w: stream %q of user %q", ErrNotSlotHolder, streamID, userID)
	}
	if caller != "" {
		l.joined.forget(userID, streamID) // released, or not held: over either way
	}
	if got.Pruned > 0 {
		l.observer.Reclaimed(ctx, "", got.Pruned)
	}
	if got.Head != "" {
		l.wake(ctx, key, got.Head)
	}
	if held := l.notLeft(got.Pools, along, leftErrs, poolMember(userID, streamID)); len(held) > 0 {
		l.leaveLater(ctx, l.leaveAll(ctx, end, held))
	}
	return ReleaseResult{Released: got.Released}, nil
}

// notLeft returns the sorted sets of the pool keys named (by a released
// slot's record) whose membership did not leave beside the slot: not
// among along, or along with an error (errs, along's).
func (l *Limiter) notLeft(named []lua.PoolKey, along []lua.Member, errs []error, member string) []lua.Member {
	var out []lua.Member
	for _, p := range named {
		slots, err := l.keys.PoolKey(p.Pool, p.Key)
		if err != nil {
			continue
		}
		i := slices.IndexFunc(along, func(m lua.Member) bool { return m.Key == slots })
		if i < 0 || i >= len(errs) || errs[i] != nil {
			out = append(out, lua.Member{Key: slots, ID: member})
		}
	}
	return out
}

// releasedAnswerKeep is how long release_all keeps its answer for a retry
// of the same call: far longer than the Redis client retries one call
// (within the per-call deadline), short enough to leave nothing behind.
const releasedAnswerKeep = time.Minute

// ReleaseAll frees every slot of userID and returns the stream ids of the
// live slots it released (support's "unlock this account"); slots that had
// already expired are counted as reclaimed, not returned. callID names the
// call (the admin audit id; 1-128 characters of [A-Za-z0-9._:-]), a new one
// per call: a retry after a lost reply answers what the call released, not
// "nothing left". Errors: ErrInvalidUserID, ErrUnavailable (nothing was
// released), ErrOutcomeUnknown (the call was sent but no answer came back:
// it may have released some or all of the slots), ErrRedisRefused.
func (l *Limiter) ReleaseAll(ctx context.Context, userID, callID string) ([]string, error) {
	ctx, span := l.startSpan(ctx, "limiter.release_all")
	ids, err := l.releaseAll(ctx, userID, callID)
	span.SetAttributes(attrReleasedSlots.Int(len(ids)))
	endSpan(span, err)
	return ids, err
}

func (l *Limiter) releaseAll(ctx context.Context, userID, callID string) ([]string, error) {
	key, err := l.keys.HeldUserKey(userID)
	if err != nil {
		return nil, err
	}
	answer, err := keys.ReleasedAnswer(key, callID)
	if err != nil {
		return nil, err
	}
	var got lua.ReleasedAll
	sent := false
	err = l.do(ctx, "release_all", func(ctx context.Context, c rueidis.Client) (err error) {
		sent = true
		got, err = lua.ReleaseAll(ctx, c, key, answer, releasedAnswerKeep)
		return err
	})
	// Sent and not refused (a refusal is the same on every attempt): an
	// attempt may have run with its reply lost, even when the last one
	// ended in a passing error reply (LOADING, BUSY) of a retry.
	if sent && err != nil && !errors.Is(err, ErrRedisRefused) {
		return nil, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	if err != nil {
		return nil, err
	}
	if got.Pruned > 0 {
		l.observer.Reclaimed(ctx, "", got.Pruned)
	}
	if got.Head != "" {
		l.wake(ctx, key, got.Head)
	}
	// Every stream's memberships at once, one pipeline per node; what
	// is not confirmed by the decision's end is asked again beside the
	// answer.
	var members, left []lua.Member
	for i, held := range got.Pools {
		members = append(members, l.heldMembers(userID, got.IDs[i], held)...)
	}
	for i, err := range l.leaveMembers(ctx, l.decisionEnd(), members) {
		if err != nil {
			left = append(left, members[i])
		}
	}
	l.leaveLater(ctx, left)
	return got.IDs, nil
}
