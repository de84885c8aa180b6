package client

import (
	"context"
	"net/http"
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
	// pools and label are the acquire's, sent again when a degraded
	// lease is re-acquired: the stream joins its pool keys then.
	pools    map[string]string
	label    string
	interval time.Duration // guarded by client.mu
	waited   time.Duration

	mu        sync.Mutex
	expiresAt time.Time
	degraded  bool
	released  bool
	err       error // set once, when lost closes
	lost      chan struct{}
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
// it (see Client.reacquire).
func (l *Lease) sendRelease(ctx context.Context) error {
	var out httpapi.ReleaseResponse
	err := l.client.api.do(ctx, http.MethodPost, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: l.userID, StreamID: l.streamID}, &out)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	return nil
}

// markLost closes Lost with err, once.
func (l *Lease) markLost(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	l.err = err
	close(l.lost)
}

// update records an answer about the slot.
func (l *Lease) update(expiresAt time.Time, degraded bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !expiresAt.IsZero() {
		l.expiresAt = expiresAt
	}
	l.degraded = degraded
}
