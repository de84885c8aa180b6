package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
)

// ReleaseResult is the answer to a release.
type ReleaseResult struct {
	// Released: the slot was held (live) and is now free. Releasing a
	// missing or already expired slot is not an error, only Released false.
	Released bool
	// Degraded: Redis did not answer. The slot, if held, frees itself when
	// its TTL runs out, so a release never fails for an outage.
	Degraded bool
}

// Release frees one slot. Errors: ErrInvalidUserID, ErrInvalidStreamID.
func (l *Limiter) Release(ctx context.Context, userID, streamID string) (ReleaseResult, error) {
	ctx, span := l.tracer.Start(ctx, "limiter.release")
	res, err := l.release(ctx, userID, streamID)
	span.SetAttributes(attrReleased.Bool(res.Released), attrDegraded.Bool(res.Degraded))
	endSpan(span, err)
	l.observer.Released(ctx, res, err)
	return res, err
}

func (l *Limiter) release(ctx context.Context, userID, streamID string) (ReleaseResult, error) {
	key, err := l.keys.UserKey(userID)
	if err != nil {
		return ReleaseResult{}, err
	}
	if err := keys.ValidateStreamID(streamID); err != nil {
		return ReleaseResult{}, err
	}
	var released bool
	var pruned int
	start := time.Now()
	err = l.call(ctx, func(ctx context.Context, c rueidis.Client) error {
		released, pruned, err = lua.Release(ctx, c, key, streamID)
		return err
	})
	l.observer.RedisCall(ctx, "release", time.Since(start), err)
	if err != nil {
		if final := notOutage(ctx, err); final != nil {
			return ReleaseResult{}, final
		}
		l.warnDegraded(ctx, "redis unavailable; release answered degraded, the slot will expire by itself", "err", err)
		return ReleaseResult{Degraded: true}, nil
	}
	if pruned > 0 {
		l.observer.Reclaimed(ctx, "", pruned)
	}
	return ReleaseResult{Released: released}, nil
}

// ReleaseAll frees every slot of userID and returns the stream ids of the
// live slots it released (support's "unlock this account"); slots that had
// already expired are counted as reclaimed, not returned. Errors: ErrInvalidUserID,
// ErrUnavailable.
func (l *Limiter) ReleaseAll(ctx context.Context, userID string) ([]string, error) {
	ctx, span := l.tracer.Start(ctx, "limiter.release_all")
	ids, err := l.releaseAll(ctx, userID)
	span.SetAttributes(attrReleasedSlots.Int(len(ids)))
	endSpan(span, err)
	return ids, err
}

func (l *Limiter) releaseAll(ctx context.Context, userID string) ([]string, error) {
	key, err := l.keys.UserKey(userID)
	if err != nil {
		return nil, err
	}
	var ids []string
	var pruned int
	start := time.Now()
	err = l.call(ctx, func(ctx context.Context, c rueidis.Client) error {
		ids, pruned, err = lua.ReleaseAll(ctx, c, key)
		return err
	})
	l.observer.RedisCall(ctx, "release_all", time.Since(start), err)
	if err != nil {
		if final := notOutage(ctx, err); final != nil {
			return nil, final
		}
		return nil, fmt.Errorf("%w: release all: %w", ErrUnavailable, err)
	}
	if pruned > 0 {
		l.observer.Reclaimed(ctx, "", pruned)
	}
	return ids, nil
}
