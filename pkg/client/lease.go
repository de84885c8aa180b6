package client

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// Lease is one held stream slot. The Client heartbeats it until Release,
// Close, or the limiter says the slot is gone (then Lost closes).
type Lease struct {
	client   *Client
	userID   string
	plan     string
	streamID string
	// poolKeys and label are the acquire's, sent again when a degraded
	// lease is re-acquired: the stream joins its pool keys then.
	poolKeys map[string]string
	label    string
	interval time.Duration // guarded by client.mu
	waited   time.Duration

	mu        sync.Mutex
	expiresAt time.Time
	degraded  bool
	// used, limit and pools are the latest acquire answer's; wouldRefuse
	// and wouldRefuseBy the answer of the acquire that took the stream.
	used          int
	limit         int
	pools         []httpapi.PoolGrant
	wouldRefuse   string
	wouldRefuseBy *httpapi.PoolGrant
	released      bool
	// vacant says the limiter answered that it holds no slot under the
	// stream id for the lease (see markLost): its release has nothing to
	// free, and would free the slot of an acquire of the id since.
	vacant bool
	err    error // set once, when lost closes
	lost   chan struct{}
}

// newLease is the lease of a granted acquire of req.
func newLease(c *Client, req httpapi.AcquireRequest, out httpapi.AcquireResponse) *Lease {
	l := &Lease{
		client:   c,
		userID:   req.UserID,
		plan:     req.Plan,
		streamID: out.StreamID,
		poolKeys: req.Pools,
		label:    req.Label,
		interval: heartbeatInterval(out),
		waited:   time.Duration(out.WaitedMs) * time.Millisecond,
		lost:     make(chan struct{}),
	}
	l.acquired(out, false)
	return l
}

// StreamID returns the slot's stream id (given with WithStreamID or made by
// the limiter).
func (l *Lease) StreamID() string { return l.streamID }

// UserID returns the user the slot counts against.
func (l *Lease) UserID() string { return l.userID }

// Plan returns the plan the slot was acquired under.
func (l *Lease) Plan() string { return l.plan }

// Waited returns how long the acquire waited in the user's queue before
// the slot was granted (WithWait); 0 when it was granted at once.
func (l *Lease) Waited() time.Duration { return l.waited }

// ExpiresAt returns when the slot stops counting unless heartbeated, as of
// the latest answer (acquire or heartbeat). Heartbeats move it forward.
func (l *Lease) ExpiresAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiresAt
}

// Degraded reports whether the latest answer about the slot was degraded:
// the limiter could not reach Redis and, its tier failing open, granted or
// kept the slot without counting it. A degraded lease that the limiter later
// reports lost is acquired again with the same stream id (so it counts
// again once Redis is back) and only loses if that acquire is refused.
func (l *Lease) Degraded() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.degraded
}

// Used returns how many live slots the user holds, this one included, as
// of the latest acquire answer about the slot: Acquire's, that of an
// Acquire of its stream id again (an extension), or that of a degraded
// lease's re-acquire. 0 when that answer was degraded (not counted).
// Heartbeats answer no counts, so Used does not follow the user's other
// streams coming and going in between. Above Limit when a plan in shadow
// mode let the stream in over its limit (see WouldRefuse), or when the
// limit was lowered while the user's streams were held.
func (l *Lease) Used() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}

// Limit returns the limit the latest acquire answer about the slot was
// judged by (see Used): the plan's maxConcurrentStreams, or the user's
// support override while one is in force.
func (l *Lease) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// Pools returns the capped pool keys the stream joined (WithPools), in the
// order of the pools' names, each with its live memberships (Used) and
// cap (Limit) as of the latest acquire answer about the slot (see Used);
// nil when it joined none. A key its pool does not cap is not listed: the
// stream joins nothing there. Used of a key is 0 when the answer was
// degraded.
func (l *Lease) Pools() []httpapi.PoolGrant {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pools)
}

// WouldRefuse returns the refusal that a scope in shadow mode (a plan's or
// a pool's enforce: false) would have answered to the acquire that took
// the stream, and did not: httpapi.CodeStreamLimitReached (the plan's
// limit; that answer's used counted the stream, above its limit) or
// httpapi.CodePoolLimitReached (a pool key's cap: WouldRefuseBy). "" when
// no scope would have refused, and always when every scope enforces (an
// enforcing scope refuses: Acquire fails). It is the stream's admission
// that is judged: an Acquire of the stream id again extends the held
// stream whatever the limits, so its answer keeps what the first said; a
// degraded lease's re-acquire takes the stream anew, and says it again.
func (l *Lease) WouldRefuse() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.wouldRefuse
}

// WouldRefuseBy returns, for a WouldRefuse of httpapi.CodePoolLimitReached,
// the pool key in shadow mode that would have refused the stream (the
// first in the order of the pools' names), with its live memberships and
// cap as that acquire answered; ok is false otherwise.
func (l *Lease) WouldRefuseBy() (by httpapi.PoolGrant, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.wouldRefuseBy == nil {
		return httpapi.PoolGrant{}, false
	}
	return *l.wouldRefuseBy, true
}

// Lost is closed when the lease is lost: the limiter answered that the slot
// no longer exists (expired, released by someone else or by support), or
// that it cannot be heartbeated (unknown plan, a plan or a slot that is
// another caller's, invalid ids), or the Client was closed. Err says which.
// Release does not close it.
func (l *Lease) Lost() <-chan struct{} { return l.lost }

// Err returns why the lease was lost: an *Error matching ErrSlotLost,
// ErrUnknownPlan, ErrPlanNotAllowed, ErrNotSlotHolder, ErrInvalid or
// ErrLimitReached (a degraded lease refused on re-acquire), or ErrClosed.
// Nil while Lost is open.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Release stops heartbeating the lease and frees its slot (POST
// /v1/slots/release). It is idempotent: once a release succeeded, later
// calls return nil without a request; after a failure, calling it again
// retries. A slot that cannot be released expires after its TTL.
//
// It sends nothing, and returns nil, where the slot under the stream id is
// no longer the lease's: when the Client holds another Lease of that user
// and stream id (an Acquire of the id after this lease was lost, or after
// its release failed: the slot is that Lease's now), or when the limiter
// answered that it holds no slot under the id (the lease lost with
// ErrSlotLost, or a degraded lease refused on re-acquire). A lease lost
// for another reason (ErrUnknownPlan, ErrPlanNotAllowed, ErrNotSlotHolder,
// ErrInvalid, ErrClosed) may still hold its slot: its release is sent.
func (l *Lease) Release(ctx context.Context) error {
	l.client.remove(l)
	return l.release(ctx)
}

func (l *Lease) release(ctx context.Context) error {
	l.mu.Lock()
	done := l.released
	l.mu.Unlock()
	if done {
		return nil
	}
	return l.sendRelease(ctx)
}

// sendRelease asks the limiter to free the slot, whether or not a release
// of the lease succeeded before: for a slot a re-acquire took again after
// it (see Client.reacquire). It sends nothing, and the lease counts as
// released, when the slot under the stream id is not the lease's (see
// Release).
func (l *Lease) sendRelease(ctx context.Context) error {
	l.mu.Lock()
	vacant := l.vacant
	l.mu.Unlock()
	if !vacant && !l.client.holdsAnother(l) {
		var out httpapi.ReleaseResponse
		err := l.client.api.do(ctx, http.MethodPost, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: l.userID, StreamID: l.streamID}, &out)
		if err != nil {
			return err
		}
	}
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	return nil
}

// markLost closes Lost with err, once. vacant says the limiter answered
// that it holds no slot under the stream id: a heartbeat's slot_lost, or
// a degraded lease's re-acquire refused (the heartbeat before it found no
// slot, and a refused acquire takes none).
func (l *Lease) markLost(err error, vacant bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	l.vacant = vacant
	close(l.lost)
}

// acquired records an acquire's answer about the slot. extension says it
// answers an acquire of a stream the lease held already, which the limiter
// extends whatever the limits: its answer says the would_refuse of the
// acquire that took the stream, and one that says none (a release before
// this one) leaves the lease's as it is.
func (l *Lease) acquired(out httpapi.AcquireResponse, extension bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !out.ExpiresAt.IsZero() {
		l.expiresAt = out.ExpiresAt
	}
	l.degraded = out.Degraded
	l.used, l.limit = out.Used, out.Limit
	l.pools = slices.Clone(out.Pools)
	if !extension || out.WouldRefuse != "" {
		l.wouldRefuse = out.WouldRefuse
		l.wouldRefuseBy = nil
		if out.WouldRefuseBy != nil {
			by := *out.WouldRefuseBy
			l.wouldRefuseBy = &by
		}
	}
}

// update records a heartbeat's answer about the slot: heartbeats answer
// neither counts nor would_refuse (see Used).
func (l *Lease) update(expiresAt time.Time, degraded bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !expiresAt.IsZero() {
		l.expiresAt = expiresAt
	}
	l.degraded = degraded
}
