package limiter

import (
	"sync"
	"time"
)

// atLimit remembers the users this Limiter lately saw refused by their
// own limit. A pooled acquire sends its pool keys' scripts beside the
// user's, one round trip, and when the user's limit refuses it, the
// memberships taken meanwhile are held until their removal, a round
// trip later. A user at its limit who keeps retrying would so keep a
// small key full for the users behind it, refused by a key nobody
// streams on. For atLimitFor after such a refusal, that user's acquires
// join their pools only once its own slot is granted (a round trip more,
// for it alone), so its retries take no place of any key.
//
// Like joinedGrants it holds two generations of at most atLimitGenMax
// users, the older forgotten when the newer is full or atLimitFor old:
// a user is remembered for atLimitFor at least, unless atLimitGenMax
// others were refused after it, and for 2×atLimitFor at most. A user
// forgotten early only takes the one-round-trip path again.
type atLimit struct {
	mu        sync.Mutex
	cur, prev map[string]struct{}
	since     time.Time // cur's start
}

const (
	atLimitFor    = time.Second
	atLimitGenMax = 1 << 15
)

// mark records that user was refused by its own limit, at now.
func (a *atLimit) mark(user string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.turn(now)
	a.cur[user] = struct{}{}
}

// has reports whether user was refused by its own limit lately.
func (a *atLimit) has(user string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.turn(now)
	_, cur := a.cur[user]
	_, prev := a.prev[user]
	return cur || prev
}

// turn retires the current generation when it is full or atLimitFor old,
// and forgets the one before it; both when the current one is that old
// twice over.
func (a *atLimit) turn(now time.Time) {
	age := now.Sub(a.since)
	if a.cur != nil && len(a.cur) < atLimitGenMax && age < atLimitFor {
		return
	}
	if age >= 2*atLimitFor {
		a.cur = nil
	}
	a.prev, a.cur, a.since = a.cur, make(map[string]struct{}), now
}
