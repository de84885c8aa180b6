package limiter

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/lua"
)

// joinedGrants remembers, per stream, the pool keys it holds memberships
// of, as this Limiter last saw them: its own grants' (counted ones), and
// those the records of the slots its heartbeats kept alive named. Two
// uses, both hints, never the truth:
//
//   - Release on nobody's behalf (caller "", which no record refuses)
//     sends the memberships beside the slot, one round trip, as
//     ReleaseJoined does for a caller that kept its grant, instead of
//     reading them from the slot's record first and dropping them in a
//     second one. The record still decides what leaves (see releaseBy).
//   - A heartbeat that the user's slot did not answer (its shard down or
//     slow, and the plan fails open) keeps these memberships alive all
//     the same (see heartbeat): their pool keys' shards answer, and a
//     membership left to lapse there would let another stream into a
//     full key while this one runs on. They are only extended, never
//     added, and only for the caller their own records name.
//
// What it remembers of a stream goes when this Limiter releases it,
// grants its id again without pools, or beats it and its record names
// none: a stream id may be taken again once released, and what was
// remembered of the stream before would keep beating (and, gone, end)
// memberships the new one never joined. Another replica's release and
// grant it cannot see: its next heartbeat that the user's slot answers
// puts it right.
//
// A stream it does not know (granted and beaten by other replicas only,
// or forgotten) is released in two round trips, and its memberships
// lapse while its user's slot does not answer, as before. Nor does a
// release use what a caller's grant or heartbeat left (the release of
// that stream on its behalf reads its record): only a heartbeat does.
//
// It holds at most two generations of joinedGenMax streams: a generation
// is retired, and the one before it forgotten, when it is full or
// joinedGenFor old, so a stream is remembered for at least joinedGenFor
// after it was last granted or beaten here unless joinedGenMax pooled
// grants and beats came after it, and streams that are never released
// (their holders crashed; their slots expire) are forgotten by then.
type joinedGrants struct {
	// any is set once a stream is remembered: until then, forgetting
	// (every grant and heartbeat without pools) takes no lock.
	any       atomic.Bool
	mu        sync.Mutex
	cur, prev map[joinedKey]joinedPools
	since     time.Time // cur's start
}

type joinedKey struct{ user, stream string }

// joinedPools are the pool keys of a stream, and the caller whose grant
// or heartbeat named them ("" for none).
type joinedPools struct {
	pools  []lua.PoolKey
	caller string
}

const (
	joinedGenMax = 1 << 17
	joinedGenFor = 5 * time.Minute
)

// remember records the pool keys user's stream holds memberships of, as
// caller's grant named them.
func (j *joinedGrants) remember(user, stream, caller string, pools []lua.PoolKey, now time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.put(joinedKey{user, stream}, joinedPools{pools, caller}, now)
}

// rememberBeats records, under one lock, the pool keys of the streams
// reqs[i] whose heartbeat found pooled[i] in their records, and forgets
// those of the streams whose record named none (pooled nil, or pooled[i]
// nil): what was remembered of them is of an earlier stream of the same
// id, released since, which a heartbeat its user's slot does not answer
// would otherwise keep beating, and find lost. Streams answered degraded
// or not alive are left as they are (pooled[i] is then what was
// remembered, or nothing was read).
func (j *joinedGrants) rememberBeats(reqs []HeartbeatRequest, results []HeartbeatResult, pooled [][]lua.PoolKey, now time.Time) {
	if pooled == nil && !j.any.Load() {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range reqs {
		if !results[i].Alive || results[i].Degraded {
			continue
		}
		k := joinedKey{reqs[i].UserID, reqs[i].StreamID}
		if pooled != nil && len(pooled[i]) > 0 {
			j.put(k, joinedPools{pooled[i], reqs[i].Caller}, now)
		} else {
			delete(j.cur, k)
			delete(j.prev, k)
		}
	}
}

// forget drops what is remembered of user's stream: it was released, or
// taken anew without pools.
func (j *joinedGrants) forget(user, stream string) {
	if !j.any.Load() {
		return
	}
	k := joinedKey{user, stream}
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.cur, k)
	delete(j.prev, k)
}

// put is remember, with j.mu held.
func (j *joinedGrants) put(k joinedKey, pools joinedPools, now time.Time) {
	if j.cur == nil || len(j.cur) >= joinedGenMax || now.Sub(j.since) >= joinedGenFor {
		j.prev, j.cur, j.since = j.cur, make(map[joinedKey]joinedPools), now
	}
	delete(j.prev, k)
	j.cur[k] = pools
	j.any.Store(true)
}

// take returns the pool keys remembered for user's stream on nobody's
// behalf (nil when none are, or a caller's are) and forgets them.
func (j *joinedGrants) take(user, stream string) []lua.PoolKey {
	k := joinedKey{user, stream}
	j.mu.Lock()
	defer j.mu.Unlock()
	p, ok := j.cur[k]
	if ok {
		delete(j.cur, k)
	} else if p, ok = j.prev[k]; ok {
		delete(j.prev, k)
	}
	if p.caller != "" {
		return nil
	}
	return p.pools
}

// peek returns the pool keys remembered for user's stream (nil when none
// are), remembering them still.
func (j *joinedGrants) peek(user, stream string) []lua.PoolKey {
	k := joinedKey{user, stream}
	j.mu.Lock()
	defer j.mu.Unlock()
	if p, ok := j.cur[k]; ok {
		return p.pools
	}
	return j.prev[k].pools
}

// len returns how many streams are remembered.
func (j *joinedGrants) len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.cur) + len(j.prev)
}

// counted are the pool keys of grants whose memberships were counted
// (a degraded one's was not: there is nothing to keep or drop).
func counted(grants []PoolGrant) []lua.PoolKey {
	var out []lua.PoolKey
	for _, g := range grants {
		if !g.Degraded {
			out = append(out, lua.PoolKey{Pool: g.Pool, Key: g.Key})
		}
	}
	return out
}
