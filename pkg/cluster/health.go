package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// DownAfter is how long Client.Up stays true after the latest answer when
// calls since have failed as outages: one timeout between answers is a
// blip, not a Redis that is down, and a shard that fails while others
// answer does not make the gauge flap.
const DownAfter = time.Second

// Up reports whether Redis answers this replica: the latest call (the
// limiter's, or the client's own probe) was answered, or, if it failed as
// an outage, one was answered less than DownAfter before it. False until
// the first answer.
//
// An outage is a call that got no answer: a timeout, a connection error, a
// slot with no node (a cluster that never formed), a connection Redis
// refused to authenticate (WRONGPASS, NOAUTH: a rotated password), or an
// error reply of a passing state (see OutageReply). A permanent error reply
// (NOPERM, WRONGTYPE) is an answer: Redis is up and the configuration is
// wrong. A call whose caller gave up (context canceled) counts as neither.
//
// Besides the limiter's calls, the client probes Redis every
// ProbeInterval: PING, or CLUSTER INFO on a cluster, which must report
// cluster_state:ok. So an idle replica's Up is current, and a cluster
// that never formed is down, not merely connected.
func (c *Client) Up() bool { return c.health.up(time.Now()) }

// Answered reports whether Redis has answered at least once since New.
// Unlike Up it never turns false again.
func (c *Client) Answered() bool {
	select {
	case <-c.health.answered:
		return true
	default:
		return false
	}
}

// outcome is what a call says about Redis.
type outcome int

const (
	answered  outcome = iota // Redis replied
	outage                   // no reply: Redis, or the way to it, is down
	abandoned                // the caller gave up; it says nothing
)

func (o outcome) String() string {
	return [...]string{"answered", "outage", "abandoned"}[o]
}

// outcomeOf classifies the error of one call.
func outcomeOf(err error) outcome {
	if err == nil || rueidis.IsRedisNil(err) {
		return answered
	}
	if errors.Is(err, context.Canceled) {
		return abandoned
	}
	if rerr, ok := rueidis.IsRedisErr(err); ok && !OutageReply(rerr) {
		return answered
	}
	return outage
}

// OutageReply reports whether a Redis error reply leaves Redis unusable to
// this replica for now: a passing state of the server or the cluster
// (loading, failing over, out of memory under noeviction, busy with a
// script), or a connection Redis refused to authenticate (WRONGPASS,
// NOAUTH: the password was rotated, or is wrong). It is an outage like a
// timeout, not an answer: each plan's failureMode applies.
func OutageReply(err *rueidis.RedisError) bool {
	switch replyCode(err) {
	case "LOADING", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY", "OOM", "NOREPLICAS", "MOVED", "ASK":
		return true
	}
	return authReply(err)
}

// answerStep is how much later than the stored one an answer must be to
// be stored while Redis answers (see health.record).
const answerStep = time.Millisecond

// health records the outcomes of calls.
type health struct {
	lastAnswer atomic.Int64          // unix nanoseconds of the latest answer; 0: none yet
	lastOutage atomic.Int64          // unix nanoseconds of the latest outage; 0: none
	lastErr    atomic.Pointer[error] // the latest failure (an outage, or a failed connection), for the log
	refusedAt  atomic.Int64          // unix nanoseconds of the latest refused authentication; 0: none since Redis accepted it
	answered   chan struct{}         // closed at the first answer
	once       sync.Once
	logger     *slog.Logger
	addrs      []string // for the log
}

func newHealth(logger *slog.Logger, addrs []string) *health {
	return &health{answered: make(chan struct{}), logger: logger, addrs: addrs}
}

func (h *health) record(err error) {
	switch outcomeOf(err) {
	case answered:
		// Stored at most once per answerStep while no outage came since:
		// every call storing it would make the callers' CPUs pass its
		// cache line around, and Up reads it in seconds.
		now := time.Now().UnixNano()
		if last := h.lastAnswer.Load(); now-last >= int64(answerStep) || h.lastOutage.Load() >= last {
			h.lastAnswer.Store(now)
		}
		h.noteAnswer(now)
		h.once.Do(func() { close(h.answered) })
	case outage:
		h.fail(err)
		h.lastOutage.Store(time.Now().UnixNano())
	}
}

// fail keeps err as the latest failure, without counting a call.
func (h *health) fail(err error) {
	h.lastErr.Store(&err)
	h.noteCredentials(err)
}

func (h *health) up(now time.Time) bool {
	answer, outage := h.lastAnswer.Load(), h.lastOutage.Load()
	if answer == 0 {
		return false
	}
	return outage <= answer || now.UnixNano()-answer < int64(DownAfter)
}

// lastError returns the latest failure, or nil.
func (h *health) lastError() error {
	if p := h.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// observed is the rueidis client handed out by Client.Redis: it records
// the outcome of every call. (Dedicated connections and streams are not
// observed; the limiter uses neither.)
type observed struct {
	rueidis.Client
	health *health
}

func (o observed) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	res := o.Client.Do(ctx, cmd)
	o.health.record(res.Error())
	return res
}

// DoMulti records one outcome for the pipeline: an answer if any command
// was answered (on a cluster the others may be on a shard that is down),
// after its outage if any.
func (o observed) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	results := o.Client.DoMulti(ctx, cmds...)
	var failure error
	answer := false
	for _, res := range results {
		switch err := res.Error(); outcomeOf(err) {
		case answered:
			answer = true
		case outage:
			if failure == nil {
				failure = err
			}
		}
	}
	if failure != nil {
		o.health.record(failure)
	}
	if answer {
		o.health.record(nil)
	}
	return results
}

// errClusterState is a cluster whose nodes do not cover every slot.
var errClusterState = errors.New("the cluster does not serve every slot")

// probe sends one health probe on client, the unobserved rueidis client,
// and records its outcome. On a cluster it also rereads the slot map (see
// NodeOf) and notes whether every slot is served (see HonorsDeadlines).
func (c *Client) probe(client rueidis.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	if client.Mode() != rueidis.ClientModeCluster {
		c.health.record(client.Do(ctx, client.B().Ping().Build()).Error())
		return
	}
	m, mapErr := ReadSlotMap(ctx, client)
	if mapErr == nil {
		c.slots.Store(m)
	}
	info, err := client.Do(ctx, client.B().ClusterInfo().Build()).ToString()
	// Calls may run without a deadline goroutine only while the cluster
	// serves every slot (see HonorsDeadlines).
	c.served.Store(mapErr == nil && m.Complete() && err == nil && strings.Contains(info, "cluster_state:ok"))
	if err == nil && !strings.Contains(info, "cluster_state:ok") {
		state := "unknown"
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cluster_state:"); ok {
				state = v
			}
		}
		err = fmt.Errorf("%w: cluster_state:%s", errClusterState, state)
	}
	c.health.record(err)
}

// watchFirstAnswer logs at ERROR when Redis has not answered within
// AnswerWithin of New: a wrong address, a firewall, a cluster that never
// formed. Until it answers every plan applies its failureMode, and WARN
// lines about degraded answers alone are easy to miss.
func (c *Client) watchFirstAnswer(start time.Time) {
	timer := time.NewTimer(c.opts.AnswerWithin)
	defer timer.Stop()
	select {
	case <-c.health.answered:
		return
	case <-c.stop:
		return
	case <-timer.C:
	}
	args := []any{"addrs", c.opts.Addrs, "waited", c.opts.AnswerWithin.String()}
	if err := c.health.lastError(); err != nil {
		args = append(args, "err", err.Error())
	}
	c.opts.Logger.Error("redis has not answered since start: until it does, every plan applies its failureMode "+
		"(Open: granting degraded, uncounted, limits not enforced; Closed: 503 limiter_unavailable)", args...)
	select {
	case <-c.health.answered:
		c.opts.Logger.Info("redis answered", "addrs", c.opts.Addrs, "after", time.Since(start).Round(time.Millisecond).String())
	case <-c.stop:
	}
}
