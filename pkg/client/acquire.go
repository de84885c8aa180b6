package client

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/keys"
)

// An AcquireOption adjusts one Acquire.
type AcquireOption func(*httpapi.AcquireRequest)

// MaxWait bounds WithWait: no plan waits longer (tiers.MaxMaxWait).
const MaxWait = 60 * time.Second

// WithWait lets the Acquire wait up to d for one of the user's slots when
// all are held, instead of failing with ErrLimitReached at once: it takes
// a place in the user's queue, and the slots go to the queue first come,
// first served, whichever replica each request reached (the user's
// requests under a plan of higher priority first). The plan's
// maxWait caps d (0: the plan never waits); a wait that runs out is the
// usual ErrLimitReached, with Error.Waited set. The request's timeout is
// extended by d, and a retry of an unanswered attempt waits only what
// is left of d; it keeps the attempt's place on the replica that holds it
// (on another, while the attempt still waits there: docs/api.md). Cancelling ctx leaves the queue at
// once. d is rounded down to whole milliseconds and bounded by MaxWait;
// d <= 0: no waiting (the default).
func WithWait(d time.Duration) AcquireOption {
	return func(r *httpapi.AcquireRequest) { r.WaitMs = min(d, MaxWait).Milliseconds() }
}

// AcquireWait is Acquire with WithWait(wait): it waits up to wait (capped
// by the plan's maxWait) for one of the user's slots to free up.
func (c *Client) AcquireWait(ctx context.Context, userID, plan string, wait time.Duration, opts ...AcquireOption) (*Lease, error) {
	return c.Acquire(ctx, userID, plan, append(opts, WithWait(wait))...)
}

// WithStreamID names the slot (1-128 characters of [A-Za-z0-9._:-]).
// Default: the client makes a random 128-bit id. Naming it makes a
// retried Acquire idempotent: the same slot is extended rather than a
// second one taken.
func WithStreamID(id string) AcquireOption {
	return func(r *httpapi.AcquireRequest) { r.StreamID = id }
}

// WithLabel says what the stream is (a pod, a model, a request id): the
// limiter keeps it with the slot, and support sees it beside the slot's
// age and caller (the admin page, limiter admin slots). At most
// httpapi.MaxLabelBytes bytes, no whitespace, control or invisible characters; the
// limiter refuses anything else with ErrInvalid (code invalid_label).
// Default: none.
func WithLabel(label string) AcquireOption {
	return func(r *httpapi.AcquireRequest) { r.Label = label }
}

// WithPools names the pool keys the stream joins, pool → key
// ({"model": "gpt-4o", "org": "acme"}; at most httpapi.MaxPools): each
// capped key must have room too, or Acquire fails with an *Error matching
// ErrPoolLimitReached (Error.Pool, Error.Key) and takes nothing. The
// limiter keeps the stream's memberships with its slot: heartbeats and
// the release cover them. Default: none.
func WithPools(pools map[string]string) AcquireOption {
	pools = maps.Clone(pools) // fixed when the stream is taken, whatever the caller does with its map
	return func(r *httpapi.AcquireRequest) {
		if len(pools) > 0 {
			r.Pools = pools
		}
	}
}

// Acquire takes a stream slot for userID under plan and heartbeats it until
// it is released or lost. Errors: an *Error matching ErrLimitReached (with
// Used, Limit, RetryAfter), ErrPoolLimitReached (WithPools; Pool, Key),
// ErrUnknownPlan, ErrUnknownPool, ErrInvalid, ErrUnauthenticated,
// ErrPlanNotAllowed, ErrNotSlotHolder (a WithStreamID another caller holds)
// or ErrUnavailable; ErrUnavailable also when the limiter cannot be
// reached; ErrClosed after Close.
//
// Every acquire is sent under a stream id of the client's own (or the one
// of WithStreamID), so that an attempt whose answer is lost can be told
// apart: Acquire retries it under the same id and, when it gives up,
// releases that id (see WithAcquireRetries). A refusal (429, 4xx) is never
// retried. An Acquire given up once its ctx ended releases the id in the
// background; an Acquire of that WithStreamID meanwhile (the
// application's retry) waits for that release first, so that the slot it
// is granted is not freed by it.
//
// The Lease says what the grant answered: the user's Used and Limit, the
// pool keys joined (Pools), and, when a plan or pool in shadow mode would
// have refused the stream and did not, WouldRefuse. A grant made while
// the limiter could not reach Redis (a tier failing open) is a Lease with
// Degraded true. Acquiring a stream id this Client already holds returns
// the held Lease, updated with that answer. With WithWait, Acquire may
// wait for a slot (see AcquireWait).
func (c *Client) Acquire(ctx context.Context, userID, plan string, opts ...AcquireOption) (*Lease, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	req := httpapi.AcquireRequest{UserID: userID, Plan: plan}
	for _, opt := range opts {
		opt(&req)
	}
	// An id of our own making is known to no one else: once an acquire
	// under it is given up, no later acquire can hold it.
	generated := req.StreamID == ""
	if generated {
		req.StreamID = keys.NewStreamID()
	} else if err := c.givenBack(ctx, userID, req.StreamID); err != nil {
		return nil, err
	}
	if req.WaitMs < 0 {
		req.WaitMs = 0
	}
	out, err := c.acquireRetrying(ctx, req, generated)
	if err != nil {
		return nil, err
	}
	l := newLease(c, req, out)
	held, err := c.add(l)
	if err != nil {
		// Closed while the request was in flight: give the slot back.
		_ = l.release(ctx)
		return nil, err
	}
	if held != l {
		held.acquired(out, true)
		c.setInterval(held, l.interval)
	}
	return held, nil
}

func (c *Client) acquire(ctx context.Context, req httpapi.AcquireRequest) (httpapi.AcquireResponse, error) {
	var out httpapi.AcquireResponse
	wait := time.Duration(req.WaitMs) * time.Millisecond
	if err := c.api.doWithin(ctx, c.api.timeout+wait, http.MethodPost, httpapi.PathAcquire, req, &out); err != nil {
		return out, err
	}
	if !out.Granted || out.StreamID == "" {
		// The contract refuses with 429; a 200 without a grant is a server bug.
		return out, fmt.Errorf("limiter: POST %s: answer 200 without a granted stream_id (granted %t)", httpapi.PathAcquire, out.Granted)
	}
	return out, nil
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// heartbeatInterval is the interval an acquire answer asks for.
func heartbeatInterval(out httpapi.AcquireResponse) time.Duration {
	switch {
	case out.HeartbeatIntervalMs > 0:
		return time.Duration(out.HeartbeatIntervalMs) * time.Millisecond
	case out.TTLMs > 0:
		return time.Duration(out.TTLMs) * time.Millisecond / 3
	}
	return fallbackHeartbeatInterval
}
