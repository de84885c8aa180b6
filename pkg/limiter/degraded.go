package limiter

import (
	"context"
	"log/slog"
	"time"
)

// degradedLogEvery bounds the degraded-answer warnings: during an outage
// every request answers degraded, and one line per request would bury the
// log. The metric counts each one; the log says it is happening.
const degradedLogEvery = 10 * time.Second

// warnDegraded logs msg at most once per degradedLogEvery; the next line
// carries how many were left out.
func (l *Limiter) warnDegraded(ctx context.Context, msg string, args ...any) {
	l.degraded.Log(ctx, slog.LevelWarn, msg, args...)
}
