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
// releases through ReleaseAs. Errors: ErrInvalidUserID, ErrInvalidStreamID.
func (l *Limiter) Release(ctx context.Context, userID, streamID string) (ReleaseResult, error) {
	return l.ReleaseAs(ctx, "", userID, streamID)
}

// ReleaseAs frees one slot on behalf of caller: a slot that another
// caller holds (its record names another) is not released, and the error
// is ErrNotSlotHolder. caller "" releases any slot, as Release does.
// Errors: ErrInvalidUserID, ErrInvalidStreamID, ErrNotSlotHolder.
func (l *Limiter) ReleaseAs(ctx context.Context, caller, userID, streamID string) (ReleaseResult, error) {
	ctx, span := l.startSpan(ctx, "limiter.release")
	res, err := l.release(ctx, caller, userID, streamID)
	if span.IsRecording() {
		span.SetAttributes(attrReleased.Bool(res.Released), attrDegraded.Bool(res.Degraded))
	}
	endSpan(span, err)
	l.observer.Released(ctx, res, err)
	return res, err
}

func (l *Limiter) release(ctx context.Context, caller, userID, streamID string) (ReleaseResult, error) {
	return l.releaseBy(ctx, time.Time{}, caller, userID, streamID)
}

// releaseBy is release as one decision, answered by end (a zero end: one
// per-call timeout from now) with the memberships it drops.
func (l *Limiter) releaseBy(ctx context.Context, end time.Time, caller, userID, streamID string) (ReleaseResult, error) {
	if end.IsZero() {
		end = l.decisionEnd()
	}
	key, err := l.keys.UserKey(userID)
	if err != nil {
		return ReleaseResult{}, err
	}
	if err := keys.ValidateStreamID(streamID); err != nil {
		return ReleaseResult{}, err
	}
	var got lua.Released
	err = l.doBy(ctx, end, "release", func(ctx context.Context, c rueidis.Client) (err error) {
		got, err = lua.Release(ctx, c, caller, key, streamID)
		return err
	})
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
	if got.Pruned > 0 {
		l.observer.Reclaimed(ctx, "", got.Pruned)
	}
	if got.Head != "" {
		l.wake(ctx, key, got.Head)
	}
	if len(got.Pools) > 0 {
		l.leavePools(ctx, end, userID, streamID, got.Pools)
	}
	return ReleaseResult{Released: got.Released}, nil
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
	key, err := l.keys.UserKey(userID)
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
	end := l.decisionEnd()
	for i, held := range got.Pools {
		l.leavePools(ctx, end, userID, got.IDs[i], held)
	}
	return got.IDs, nil
}
