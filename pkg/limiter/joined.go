package limiter

import (
	"sync"
	"time"
)

// joinedGrants remembers the pool keys that this Limiter's own grants
// joined, per stream, so that Release of such a stream sends their
// memberships beside the slot, one round trip, as ReleaseJoined does for
// a caller that kept its grant, instead of reading them from the slot's
// record first and dropping them in a second one. It is a hint, not the
// truth: the record still decides what leaves (see releaseBy), and a
// stream it does not know (granted by another replica, or forgotten) is
// released in two round trips as before.
//
// It is used for releases on nobody's behalf only (caller ""), which no
// record refuses, and remembers only grants made on nobody's behalf: a
// release that a record may refuse must drop nothing, and a membership
// sent beside it would be dropped before the refusal is known.
//
// It holds at most two generations of joinedGenMax streams: a generation
// is retired, and the one before it forgotten, when it is full or
// joinedGenFor old, so a stream is remembered for at least joinedGenFor
// unless joinedGenMax pooled grants came after it, and streams that are
// never released (their holders crashed; their slots expire) are
// forgotten by then.
type joinedGrants struct {
	mu        sync.Mutex
	cur, prev map[joinedKey][]PoolGrant
	since     time.Time // cur's start
}

type joinedKey struct{ user, stream string }

const (
	joinedGenMax = 1 << 15
	joinedGenFor = 5 * time.Minute
)

// remember records the pool keys the grant of user's stream joined.
func (j *joinedGrants) remember(user, stream string, pools []PoolGrant, now time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.cur == nil || len(j.cur) >= joinedGenMax || now.Sub(j.since) >= joinedGenFor {
		j.prev, j.cur, j.since = j.cur, make(map[joinedKey][]PoolGrant), now
	}
	k := joinedKey{user, stream}
	delete(j.prev, k)
	j.cur[k] = pools
}

// take returns the pool keys remembered for user's stream (nil when none
// are) and forgets them.
func (j *joinedGrants) take(user, stream string) []PoolGrant {
	k := joinedKey{user, stream}
	j.mu.Lock()
	defer j.mu.Unlock()
	if p, ok := j.cur[k]; ok {
		delete(j.cur, k)
		return p
	}
	if p, ok := j.prev[k]; ok {
		delete(j.prev, k)
		return p
	}
	return nil
}

// len returns how many streams are remembered.
func (j *joinedGrants) len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.cur) + len(j.prev)
}
