package limiter

import (
	"context"
	"sync/atomic"
	"time"
)

// degradedLogEvery bounds the degraded-answer warnings: during an outage
// every request answers degraded, and one line per request would bury the
// log. The metric counts each one; the log says it is happening.
const degradedLogEvery = 10 * time.Second

// degradedLog rate-limits the warning logged when Redis does not answer.
type degradedLog struct {
	last       atomic.Int64 // unix nanoseconds of the last line
	suppressed atomic.Int64 // answers not logged since
}

// warn logs msg unless a line was logged less than degradedLogEvery ago;
// the next line carries how many were left out.
func (l *Limiter) warnDegraded(ctx context.Context, msg string, args ...any) {
	now := time.Now().UnixNano()
	last := l.degraded.last.Load()
	if now-last < int64(degradedLogEvery) || !l.degraded.last.CompareAndSwap(last, now) {
		l.degraded.suppressed.Add(1)
		return
	}
	if n := l.degraded.suppressed.Swap(0); n > 0 {
		args = append(args, "similar_since_last_line", n)
	}
	l.log.WarnContext(ctx, msg, args...)
}
