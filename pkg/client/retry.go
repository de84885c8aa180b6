package client

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// Waits between the attempts of an acquire whose answer carries no
// Retry-After (a transport failure or a timeout): doubling from the first.
const (
	firstAcquireBackoff = 200 * time.Millisecond
	maxAcquireBackoff   = 2 * time.Second
)

// maxRetryAfter is the longest Retry-After an acquire's retry waits out,
// as long as the longest backoff: the limiter's own 503s ask for 1s. An
// answer asking for longer (a maintenance page of a proxy in front of the
// limiter) ends the retries at once, rather than hold Acquire that long
// per retry.
const maxRetryAfter = maxAcquireBackoff

// acquireRetrying sends req (whose StreamID is set) until it is answered,
// at most 1+c.retries times. An attempt that went unanswered (transport
// failure, timeout, 503) may have taken the slot in Redis with only its
// answer lost: the retry under the same stream id is then granted that
// slot without taking a second, and when Acquire gives up without a
// grant, it releases the id so that such a slot does not count against
// the user until its TTL runs out.
//
// A waiting acquire (WaitMs) waits in all for WaitMs: a retry, which keeps
// the first attempt's place in the queue while its ticket lives, asks for
// what is left.
//
// generated says that req's stream id was made for this Acquire, so its
// release may be sent once more later (see releaseUnanswered).
func (c *Client) acquireRetrying(ctx context.Context, req httpapi.AcquireRequest, generated bool) (httpapi.AcquireResponse, error) {
	unanswered := false
	waitUntil := time.Now().Add(time.Duration(req.WaitMs) * time.Millisecond)
	for attempt := 0; ; attempt++ {
		if attempt > 0 && req.WaitMs > 0 {
			req.WaitMs = max(time.Until(waitUntil).Milliseconds(), 0)
		}
		out, err := c.acquire(ctx, req)
		switch {
		case err == nil:
			return out, nil
		case definite(err) && !unanswered:
			return out, err // refused: no attempt can have taken a slot
		case errors.Is(err, ErrNotSlotHolder):
			// Another caller holds the id: no attempt of ours holds it, and
			// the limiter would refuse our release of it too.
			return out, err
		case !definite(err):
			unanswered = true
			if attempt < c.retries && errors.Is(err, ErrUnavailable) {
				if wait, ok := retryWait(err, attempt); ok && sleep(ctx, wait) {
					continue
				}
			}
		}
		c.releaseUnanswered(ctx, req, generated)
		return out, err
	}
}

// retryWait is how long to wait after the attempt-th unanswered attempt
// failed with err: at least the answer's Retry-After, up to half as long
// again; without one, a doubling backoff drawn from its upper half. The
// jitter keeps clients cut off by one outage from all coming back at once.
// ok is false when the answer's Retry-After is above maxRetryAfter: no
// retry.
func retryWait(err error, attempt int) (wait time.Duration, ok bool) {
	var e *Error
	if errors.As(err, &e) && e.RetryAfter > 0 {
		if e.RetryAfter > maxRetryAfter {
			return 0, false
		}
		return e.RetryAfter + rand.N(e.RetryAfter/2+1), true
	}
	wait = maxAcquireBackoff
	if attempt < 8 { // beyond, the doubling is past the cap (and the shift past int64)
		wait = min(firstAcquireBackoff<<attempt, maxAcquireBackoff)
	}
	return wait/2 + rand.N(wait/2+1), true
}

// sleep waits d unless ctx ends first (or would end before d passed:
// waiting only to fail helps no one). It reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// releaseAgainAfter is how long after the release of an unanswered
// acquire it is sent once more: the lost attempt may still be on its way
// to Redis, and reach it after the release (the limiter's Redis client
// sends an acquire script again after a broken connection).
const releaseAgainAfter = time.Second

// givenBack waits until no release of an unanswered acquire of userID's
// streamID is under way in the background (see releaseUnanswered), or
// ctx ends: an acquire of that stream id sent before it was answered
// could be granted, and then have its slot freed by it.
func (c *Client) givenBack(ctx context.Context, userID, streamID string) error {
	for {
		c.mu.Lock()
		given := c.givingBack[leaseKey{userID, streamID}]
		c.mu.Unlock()
		if given == nil {
			return nil
		}
		select {
		case <-given:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// releaseUnanswered frees the slot an unanswered acquire of req may have
// taken. While ctx lives the release is sent before Acquire returns, so
// that the caller's next acquire finds the slot free; once ctx has ended
// it is sent in the background, bounded by the request timeout (Close
// waits for it). A stream id this client holds a lease for is left alone:
// the acquire was a re-acquire of a slot in use. When the id was made for
// this acquire (generated), no one else can hold it, so the release is
// sent once more releaseAgainAfter later, in the background, for an
// attempt that reached Redis after the first. The release is best
// effort: if it fails, the slot frees itself after its TTL.
func (c *Client) releaseUnanswered(ctx context.Context, req httpapi.AcquireRequest, generated bool) {
	c.mu.Lock()
	if _, held := c.leases[leaseKey{req.UserID, req.StreamID}]; held {
		c.mu.Unlock()
		return
	}
	background := ctx.Err() != nil && !c.closed
	again := generated && !c.closed
	var given chan struct{} // closed once the background release is answered
	if background {
		c.releasing.Add(1)
		given = make(chan struct{})
		if c.givingBack == nil {
			c.givingBack = map[leaseKey]chan struct{}{}
		}
		c.givingBack[leaseKey{req.UserID, req.StreamID}] = given
	}
	if again {
		c.releasing.Add(1)
	}
	c.mu.Unlock()

	release := func(ctx context.Context) {
		var out httpapi.ReleaseResponse
		err := c.api.do(ctx, http.MethodPost, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: req.UserID, StreamID: req.StreamID}, &out)
		if err != nil {
			c.log.Warn("limiter: releasing the stream id of an unanswered acquire failed; a slot it took expires after its TTL", "stream_id", req.StreamID, "err", err)
		}
	}
	switch {
	case ctx.Err() == nil:
		release(ctx)
	case background:
		go func() {
			defer c.releasing.Done()
			release(context.WithoutCancel(ctx))
			c.mu.Lock()
			key := leaseKey{req.UserID, req.StreamID}
			if c.givingBack[key] == given {
				delete(c.givingBack, key)
			}
			c.mu.Unlock()
			close(given)
		}()
	default:
		// Closed already, so nothing would wait for a background release;
		// post bounds this one by the request timeout.
		release(context.WithoutCancel(ctx))
	}
	if again {
		go func() {
			defer c.releasing.Done()
			time.Sleep(releaseAgainAfter)
			release(context.WithoutCancel(ctx))
		}()
	}
}
