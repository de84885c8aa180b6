// Package ratelog bounds how often a log line repeats. During a Redis
// outage every request is answered the same way (granted degraded, or
// failed); a line per request would bury the log and cost as much as the
// requests. The metrics count every one; the log says it is happening.
package ratelog

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// SuppressedKey is the attribute of a line that says how many lines the
// Logger left out since its previous one.
const SuppressedKey = "similar_since_last_line"

// Logger logs at most one line per interval; the next line it logs carries
// how many it left out (SuppressedKey). Give each kind of event its own
// Logger, so that a flood of one does not hide the other. Safe for
// concurrent use.
type Logger struct {
	log   *slog.Logger
	every int64            // nanoseconds
	now   func() time.Time // time.Now; tests move it

	last       atomic.Int64 // unix nanoseconds of the latest line; 0: none yet
	suppressed atomic.Int64 // lines left out since
}

// New returns a Logger writing to log at most once per every.
func New(log *slog.Logger, every time.Duration) *Logger {
	return &Logger{log: log, every: int64(every), now: time.Now}
}

// Log logs msg at level with args, unless the Logger logged less than its
// interval ago; then it only counts the line. A level the handler does not
// log is neither logged nor counted.
func (l *Logger) Log(ctx context.Context, level slog.Level, msg string, args ...any) {
	if !l.log.Enabled(ctx, level) {
		return
	}
	now := l.now().UnixNano()
	last := l.last.Load()
	if (last != 0 && now-last < l.every) || !l.last.CompareAndSwap(last, now) {
		l.suppressed.Add(1)
		return
	}
	if n := l.suppressed.Swap(0); n > 0 {
		args = append(args, SuppressedKey, n)
	}
	l.log.Log(ctx, level, msg, args...)
}
