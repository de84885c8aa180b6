package limiter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// do makes the Redis call of op (the op label of the Redis round-trip
// metric): it runs fn under the per-call deadline (see deadlines), reports
// the round trip to the observer, failures included, and returns the error
// classified (see classify). fn's client returns by the deadline whatever
// rueidis does (see deadlineClient).
func (l *Limiter) do(ctx context.Context, op string, fn func(context.Context, rueidis.Client) error) error {
	return l.doBy(ctx, time.Time{}, op, fn)
}

// doBy is do for one step of a decision made of several calls (an acquire
// that joins pools, a heartbeat or release of a stream in pools): the call
// ends by the decision's end, by when the decision answers whatever Redis
// does (DESIGN §10 P4), or by its own per-call deadline if that is sooner.
// A zero end is no end beyond the call's own. A call that the decision
// left no time for fails at once as an outage, a timeout like any other.
func (l *Limiter) doBy(ctx context.Context, end time.Time, op string, fn func(context.Context, rueidis.Client) error) error {
	start := time.Now()
	timeout := l.redis.Timeout()
	if !end.IsZero() {
		timeout = min(timeout, end.Sub(start))
	}
	client, err := l.client()
	switch {
	case err != nil:
	case timeout <= 0:
		err = fmt.Errorf("no time left of the decision's %v: %w", l.redis.Timeout(), context.DeadlineExceeded)
	default:
		callCtx, cancel := l.deadlines.after(ctx, start, timeout)
		err = fn(callCtx, client)
		cancel()
	}
	l.observer.RedisCall(ctx, op, time.Since(start), err)
	return classify(ctx, op, err)
}

// decisionEnd is when a decision of several Redis calls that starts now
// must answer: one per-call timeout from now.
func (l *Limiter) decisionEnd() time.Time { return time.Now().Add(l.redis.Timeout()) }

// client returns the connected client as a deadlineClient, made once
// rather than once per call: cluster.Client.Redis hands out one client
// from the first connection on.
func (l *Limiter) client() (rueidis.Client, error) {
	if c := l.wrapped.Load(); c != nil {
		return *c, nil
	}
	client, err := l.redis.Redis()
	if err != nil {
		return nil, err
	}
	var c rueidis.Client = deadlineClient{Client: client, redis: l.redis, direct: &l.direct, goCalls: &l.goCalls}
	l.wrapped.Store(&c)
	return c, nil
}

// deadlineClient is the rueidis client of fn: its Do and DoMulti return by
// their context's deadline whatever rueidis does. rueidis makes a call
// wait, its context aside, for a connection that another call is dialling
// (on a cluster up to the dial timeout, or a topology refresh: past the
// deadline of a call that came in meanwhile), and for room in a
// connection's queue that unanswered calls have filled. So unless rueidis
// is known to bound the call by its deadline itself (see
// cluster.Client.HonorsDeadlines), the command runs in a goroutine of its
// own and the caller waits on its deadline, and on its own context; a late
// result is dropped, and the call answers the context's error, a timeout
// like any other. The goroutine ends when rueidis returns: at the deadline
// at the latest once a connection is there, or when the dial in progress
// times out. When rueidis does bound it (a standalone client, or a
// cluster serving every slot, with no outage or dial lately, and fewer
// than cluster.MaxDirectCalls such calls in flight), the command runs in
// the caller's goroutine: a goroutine per
// call and its scheduling cost about as much client CPU as the library's
// own work. The other methods are rueidis's own.
type deadlineClient struct {
	rueidis.Client
	redis   *cluster.Client
	direct  *atomic.Int64 // calls in flight in the callers' goroutines
	goCalls *atomic.Int64 // calls run in a goroutine of their own, ever
}

// enter reports whether a call may run in its caller's goroutine, and if
// so counts it in flight until leave.
func (c deadlineClient) enter() bool {
	if c.direct.Load() >= cluster.MaxDirectCalls || !c.redis.HonorsDeadlines(c.Client, time.Now()) {
		return false
	}
	if c.direct.Add(1) > cluster.MaxDirectCalls {
		c.direct.Add(-1)
		return false
	}
	return true
}

func (c deadlineClient) leave() { c.direct.Add(-1) }

// reachesOnce reports whether rueidis sends cmd once, when its call
// starts: only then does a dial it waits for belong to a call that started
// before it, whose deadline comes first (see cluster.Client.HonorsDeadlines).
// rueidis sends a retryable command again after an error, later in the
// call, so the scripts' calls are built not retryable (see package lua; the
// caller retries one, bounded, if its connection fails); an EVAL follows an
// EVALSHA that met NOSCRIPT, later in the call too.
func reachesOnce(cmd rueidis.Completed) bool {
	return !cmd.IsRetryable() && cmd.Commands()[0] != "EVAL"
}

func (c deadlineClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if err := ctx.Err(); err != nil {
		return rueidis.NewErrorResult(err)
	}
	if reachesOnce(cmd) && c.enter() {
		resp := c.Client.Do(ctx, cmd)
		c.leave()
		if resp.NonRedisError() == nil || ctx.Err() != nil {
			return resp
		}
		retry, ok := lua.Retryable(cmd)
		if !ok {
			return resp
		}
		// Its connection failed: again with rueidis's retries, bounded.
		cmd = retry
	} else {
		cmd, _ = lua.Retryable(cmd)
	}
	c.goCalls.Add(1)
	done := resultChans.Get().(chan rueidis.RedisResult)
	go c.do(ctx, cmd, done)
	select {
	case resp := <-done:
		resultChans.Put(done) // empty, and its sender gone
		return resp
	case <-ctx.Done(): // done is left to its late sender
	case <-callerDone(ctx):
	}
	return rueidis.NewErrorResult(ctx.Err())
}

func (c deadlineClient) do(ctx context.Context, cmd rueidis.Completed, done chan<- rueidis.RedisResult) {
	done <- c.Client.Do(ctx, cmd)
}

// resultChans recycles the channels that carry a result to Do, two
// allocations per call saved on the hot path.
var resultChans = sync.Pool{New: func() any { return make(chan rueidis.RedisResult, 1) }}

// DoMulti sends cmds as one pipeline. Each command's answer is its own:
// on a cluster rueidis sends each node its commands, and a node that does
// not answer by the deadline fails only its own. Where rueidis bounds the
// call itself (see enter), it runs in the caller's goroutine; where it may
// not, each node's commands go on a goroutine of their own (see byNode),
// and those not answered by the deadline answer the context's error, so
// that one node's hang is its own commands' outage there too.
func (c deadlineClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	if ctx.Err() == nil && !slices.ContainsFunc(cmds, func(cmd rueidis.Completed) bool { return cmd.IsRetryable() }) && c.enter() {
		// Not retried, so it reaches rueidis once (see reachesOnce); a pipeline
		// takes one place in each node's queue.
		defer c.leave()
		return c.Client.DoMulti(ctx, cmds...)
	}
	resps := make([]rueidis.RedisResult, len(cmds))
	answered := make([]bool, len(cmds))
	if ctx.Err() == nil {
		groups := c.byNode(cmds)
		c.goCalls.Add(1)
		done := make(chan nodeAnswer, len(groups))
		for _, at := range groups {
			go func() {
				group := make([]rueidis.Completed, len(at))
				for j, i := range at {
					group[j] = cmds[i]
				}
				done <- nodeAnswer{at: at, resps: c.Client.DoMulti(ctx, group...)}
			}()
		}
	wait:
		for range groups {
			select {
			case a := <-done:
				for j, i := range a.at {
					resps[i], answered[i] = a.resps[j], true
				}
			case <-ctx.Done(): // the rest are left to their late senders
				break wait
			case <-callerDone(ctx):
				break wait
			}
		}
	}
	for i := range resps {
		if !answered[i] {
			resps[i] = rueidis.NewErrorResult(ctx.Err())
		}
	}
	return resps
}

// nodeAnswer is the answers of one node's commands of a pipeline, at
// their indexes in it.
type nodeAnswer struct {
	at    []int
	resps []rueidis.RedisResult
}

// byNode splits cmds into the indexes of each node's commands, as the
// slot map says. They go together on one Redis, and on a cluster when a
// command's node is not known: the slot map's gap, or a command of no key
// (a WAIT), which rueidis sends to the node of the others' slot.
func (c deadlineClient) byNode(cmds []rueidis.Completed) [][]int {
	all := [][]int{seq(len(cmds))}
	if c.Client.Mode() != rueidis.ClientModeCluster {
		return all
	}
	var groups [][]int
	nodes := map[string]int{} // a node's group in groups
	for i, cmd := range cmds {
		node := c.redis.NodeOf(cmd.Slot())
		if node == "" {
			return all
		}
		g, ok := nodes[node]
		if !ok {
			g = len(groups)
			groups = append(groups, nil)
			nodes[node] = g
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// seq returns 0, 1, ..., n-1.
func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// classify sorts err, from the Redis call of op, into an outage or a final
// error. An outage (Redis not connected, not answering within the deadline,
// in a passing state, or refusing the credentials: see
// cluster.OutageReply) wraps ErrUnavailable, and the operation answers it
// by its failure mode (see degrade). Final are the
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
	if rerr, ok := rueidis.IsRedisErr(err); ok && !cluster.OutageReply(rerr) {
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
