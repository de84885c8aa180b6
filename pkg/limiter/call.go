package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// do makes the Redis call of op (the op label of the Redis round-trip
// metric): it runs fn under the per-call deadline, reports the round trip
// to the observer, failures included, and returns the error classified
// (see classify). fn's client returns by the deadline whatever rueidis
// does (see deadlineClient).
func (l *Limiter) do(ctx context.Context, op string, fn func(context.Context, rueidis.Client) error) error {
	start := time.Now()
	client, err := l.redis.Redis()
	if err == nil {
		callCtx, cancel := context.WithTimeout(ctx, l.redis.Timeout())
		err = fn(callCtx, deadlineClient{client})
		cancel()
	}
	l.observer.RedisCall(ctx, op, time.Since(start), err)
	return classify(ctx, op, err)
}

// deadlineClient is the rueidis client of fn: its Do and DoMulti return by
// their context's deadline whatever rueidis does. rueidis makes a call wait,
// its context aside, for a connection that another call is dialling: up to
// the dial timeout, past the deadline of a call that came in meanwhile. So
// the command runs in a goroutine of its own and the caller waits on its
// deadline; a late result is dropped, and the call answers the context's
// error, a timeout like any other. The goroutine ends when rueidis returns:
// at once when the context is cancelled (do cancels it on return), at the
// latest when the dial in progress times out. The other methods are
// rueidis's own.
type deadlineClient struct{ rueidis.Client }

func (c deadlineClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if err := ctx.Err(); err != nil {
		return rueidis.NewErrorResult(err)
	}
	done := resultChans.Get().(chan rueidis.RedisResult)
	go func() { done <- c.Client.Do(ctx, cmd) }()
	select {
	case resp := <-done:
		resultChans.Put(done) // empty, and its sender gone
		return resp
	case <-ctx.Done():
		return rueidis.NewErrorResult(ctx.Err()) // done is left to its late sender
	}
}

// resultChans recycles the channels that carry a result to Do, two
// allocations per call saved on the hot path.
var resultChans = sync.Pool{New: func() any { return make(chan rueidis.RedisResult, 1) }}

func (c deadlineClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if ctx.Err() == nil {
		done := make(chan []rueidis.RedisResult, 1)
		go func() { done <- c.Client.DoMulti(ctx, cmds...) }()
		select {
		case resps := <-done:
			return resps
		case <-ctx.Done():
		}
	}
	resps := make([]rueidis.RedisResult, len(cmds))
	for i := range resps {
		resps[i] = rueidis.NewErrorResult(ctx.Err())
	}
	return resps
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
	if rerr, ok := rueidis.IsRedisErr(err); ok && !cluster.TransientReply(rerr) {
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
