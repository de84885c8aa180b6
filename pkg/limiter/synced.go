package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
)

// replicaSync makes an acquire wait until Options.SyncReplicas replicas
// have its write. WAIT counts the replicas that acknowledged the writes of
// the connection it runs on, so it must follow the script on the same
// connection: syncedClient sends every command of the script (EVALSHA, and
// EVAL after NOSCRIPT) in one DoMulti with a WAIT. rueidis sends a DoMulti
// holding a blocking command such as WAIT on one dedicated connection, in
// order, and a cluster client sends a keyless command of a DoMulti to the
// node of the keyed one: the key's master.
//
// A redirected script (MOVED during a failover) is retried on the new
// master without its WAIT; the WAIT then answers on the old node, which
// refuses it once demoted (an error counts as unconfirmed).
type replicaSync struct {
	want   int64
	acked  int64
	err    error // of the latest WAIT
	waited bool
}

// syncedClient is the rueidis.Client the acquire script runs on when
// replicaSync is on; only Do is changed.
type syncedClient struct {
	rueidis.Client
	sync *replicaSync
}

func (c syncedClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	wait := c.B().Wait().Numreplicas(c.sync.want).Timeout(waitTimeout(ctx)).Build()
	resps := c.DoMulti(ctx, cmd, wait)
	c.sync.acked, c.sync.err = resps[1].AsInt64()
	c.sync.waited = true
	return resps[0]
}

// waitTimeout is WAIT's timeout: half of what is left of ctx's deadline,
// so WAIT answers (with fewer replicas) before the call gives up, and at
// least 1ms (0 would block forever).
func waitTimeout(ctx context.Context) int64 {
	left := time.Second
	if deadline, ok := ctx.Deadline(); ok {
		left = time.Until(deadline)
	}
	return max(left.Milliseconds()/2, 1)
}

// synced returns the client to run the acquire script on, and the state
// of its WAIT; nil when Options.SyncReplicas is 0.
func (l *Limiter) synced(c rueidis.Client) (rueidis.Client, *replicaSync) {
	if l.syncReplicas == 0 {
		return c, nil
	}
	s := &replicaSync{want: int64(l.syncReplicas)}
	return syncedClient{Client: c, sync: s}, s
}

// confirmGrant applies the outcome of the WAIT after a granted acquire.
// Fewer replicas than wanted: res is marked Unsynced; on a Closed plan the
// acquire's part of the slot (own: its share, see userSlot.member) is
// released (best effort: it expires anyway) and ErrUnavailable returned
// (wrapping ErrUnconfirmed),
// on an Open plan the grant stands.
func (l *Limiter) confirmGrant(ctx context.Context, s *replicaSync, tier tiers.Tier, own lua.Member, res *AcquireResult) error {
	if s == nil || (s.waited && s.err == nil && s.acked >= s.want) {
		return nil
	}
	res.Unsynced = true
	why := fmt.Sprintf("%d of %d replicas confirmed the slot", s.acked, s.want)
	if s.err != nil {
		why = "WAIT failed: " + s.err.Error()
	}
	if tier.OutageMode() != tiers.FailClosed {
		l.warnDegraded(ctx, "slot not confirmed by replicas; keeping the grant (failureMode Open)", "plan", tier.Plan, "reason", why)
		return nil
	}
	if own.Key != "" {
		// Given back even when the caller has left meanwhile (the WAIT
		// takes up to half the call's deadline): its context is done then,
		// and an id the limiter made is known to no one else.
		_ = l.dropSlot(context.WithoutCancel(ctx), time.Time{}, "release", own)
	}
	res.Granted, res.ExpiresAt = false, time.Time{}
	return fmt.Errorf("%w: %w: acquire: %s (redis.syncReplicas %d)", ErrUnavailable, ErrUnconfirmed, why, s.want)
}
