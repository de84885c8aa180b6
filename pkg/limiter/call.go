package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// do makes the Redis call of op (the op label of the Redis round-trip
// metric): it runs fn under the per-call deadline, reports the round trip
// to the observer, failures included, and returns the error classified
// (see classify).
func (l *Limiter) do(ctx context.Context, op string, fn func(context.Context, rueidis.Client) error) error {
	start := time.Now()
	client, err := l.redis.Redis()
	if err == nil {
		callCtx, cancel := context.WithTimeout(ctx, l.redis.Timeout())
		err = fn(callCtx, client)
		cancel()
	}
	l.observer.RedisCall(ctx, op, time.Since(start), err)
	return classify(ctx, op, err)
}

// classify sorts err, from the Redis call of op, into an outage or a final
// error. An outage (Redis not connected, not answering within the deadline,
// or in a passing state: see transientReply) wraps ErrUnavailable, and the
// operation answers it by its failure mode (see degrade). Final are the
// caller's own context ending, returned as its error, and an error reply
// no retry will fix (a missing ACL permission, a key of the wrong type),
// returned as ErrRedisRefused: failing open on those would stop limiting
// for good and hide the misconfiguration.
func classify(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if rerr, ok := rueidis.IsRedisErr(err); ok && !transientReply(rerr) {
		return fmt.Errorf("%w: %s: %w", ErrRedisRefused, op, err)
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

// degrade reports whether an operation answers degraded instead of
// returning err, the classified error of its Redis call: only for an
// outage, and only when mode is Open. Closed returns err, ErrUnavailable.
func degrade(mode tiers.FailureMode, err error) bool {
	return mode != tiers.FailClosed && errors.Is(err, ErrUnavailable)
}

// transientReply reports whether a Redis error reply is a passing state of
// the server or the cluster (loading, failing over, out of memory under
// noeviction, busy with a script): an outage like a timeout.
func transientReply(err *rueidis.RedisError) bool {
	code, _, _ := strings.Cut(err.Error(), " ")
	switch code {
	case "LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY", "OOM", "NOREPLICAS", "MOVED", "ASK":
		return true
	}
	return false
}
