package limiter

import (
	"context"
	"errors"
	"time"

	"github.com/joishi/limiter/pkg/lua"
)

// unansweredReleaseTimeout bounds the background release of a slot whose
// acquire went unanswered.
const unansweredReleaseTimeout = 2 * time.Second

// releaseUnanswered gives back a slot that an acquire may have taken
// although its caller was told no: the call timed out or was abandoned
// after reaching Redis, so the script may have run with only its answer
// lost. Left alone, that slot would count against the user for a whole TTL
// and the caller's retry would be refused as over the limit. It runs in the
// background, bounded by unansweredReleaseTimeout, so the refusal itself is
// not delayed; a call that surely never reached Redis is left alone.
func (l *Limiter) releaseUnanswered(key, streamID string, err error) {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		return
	}
	client, cerr := l.redis.Redis()
	if cerr != nil {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), unansweredReleaseTimeout)
		defer cancel()
		released, _, err := lua.Release(ctx, client, key, streamID)
		l.log.Debug("released the slot of an unanswered acquire", "stream_id", streamID, "released", released, "err", err)
	}()
}
