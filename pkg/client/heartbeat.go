package client

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/httpapi"
)

// heartbeatLoop is the Client's one goroutine: it heartbeats every held
// lease once per interval, the smallest among held leases (or the fixed
// one), and idles while none is held. Close stops it.
func (c *Client) heartbeatLoop() {
	defer close(c.loopDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var last time.Time // start of the latest tick, or when leases appeared
	for {
		c.mu.Lock()
		every := c.smallestLocked()
		c.mu.Unlock()
		if every == 0 {
			select {
			case <-c.loopCtx.Done():
				return
			case <-c.wake:
				// New leases were just acquired: their first heartbeat is
				// due one interval from now.
				last = time.Now()
				continue
			}
		}
		if last.IsZero() {
			last = time.Now()
		}
		// Measured from the latest tick, so that leases coming and going
		// (each may nudge) never postpone the next heartbeat.
		timer.Reset(time.Until(last.Add(every)))
		select {
		case <-c.loopCtx.Done():
			timer.Stop()
			return
		case <-c.wake:
			timer.Stop()
		case <-timer.C:
			last = time.Now()
			// A round may take no longer than the interval: a request hung
			// on a dead connection must not hold up the next round while
			// the slots' TTLs run out.
			tickCtx, cancel := context.WithTimeout(c.loopCtx, every)
			c.tick(tickCtx)
			cancel()
		}
	}
}

// tick heartbeats every held lease: httpapi.MaxBatch slots per request, at
// most maxInFlight requests at a time.
func (c *Client) tick(ctx context.Context) {
	c.mu.Lock()
	leases := make([]*Lease, 0, len(c.leases))
	for _, l := range c.leases {
		leases = append(leases, l)
	}
	c.mu.Unlock()

	var mu sync.Mutex
	var reacquire []*Lease
	batches := (len(leases) + httpapi.MaxBatch - 1) / httpapi.MaxBatch
	forEach(batches, maxInFlight, func(i int) {
		batch := leases[i*httpapi.MaxBatch : min((i+1)*httpapi.MaxBatch, len(leases))]
		if again := c.heartbeatBatch(ctx, batch); len(again) > 0 {
			mu.Lock()
			reacquire = append(reacquire, again...)
			mu.Unlock()
		}
	})
	forEach(len(reacquire), maxInFlight, func(i int) { c.reacquire(ctx, reacquire[i]) })
}

// heartbeatBatch sends one batch and applies its results. It returns the
// degraded leases the limiter no longer holds, to acquire again.
func (c *Client) heartbeatBatch(ctx context.Context, batch []*Lease) (reacquire []*Lease) {
	req := httpapi.HeartbeatsRequest{Slots: make([]httpapi.HeartbeatRequest, len(batch))}
	for i, l := range batch {
		req.Slots[i] = httpapi.HeartbeatRequest{UserID: l.userID, Plan: l.plan, StreamID: l.streamID}
	}
	var out httpapi.HeartbeatsResponse
	if err := c.api.do(ctx, http.MethodPost, httpapi.PathHeartbeats, req, &out); err != nil {
		var refused *Error
		switch {
		case c.loopCtx.Err() != nil: // closing
		case errors.As(err, &refused) && refused.Status >= 400 && refused.Status < 500:
			// Not an outage: the next tick sends the same batch, refused
			// the same, while the slots' TTLs run out.
			c.log.Error("limiter: heartbeat batch refused; its slots will expire unless this is fixed", "slots", len(batch), "err", err)
		default:
			c.log.Warn("limiter: heartbeat batch failed; the slots keep their TTL, retrying next tick", "slots", len(batch), "err", err)
		}
		return nil
	}
	if len(out.Results) != len(batch) {
		c.log.Error("limiter: heartbeat batch answered the wrong number of results; retrying next tick", "slots", len(batch), "results", len(out.Results))
		return nil
	}
	var lost, unconfirmed int
	for i, res := range out.Results {
		l := batch[i]
		switch {
		case res.StreamID != l.streamID:
			unconfirmed++
		case res.Error != nil:
			if !slotFatal(res.Error.Code) {
				unconfirmed++ // e.g. limiter_unavailable: the slot keeps its TTL
				continue
			}
			if c.lose(l, fromWire(statusOf(res.Error.Code), *res.Error), res.Error.Code == httpapi.CodeSlotLost) {
				lost++
			}
		case res.Alive:
			var at time.Time
			if res.ExpiresAt != nil {
				at = *res.ExpiresAt
			}
			l.update(at, res.Degraded)
		case l.Degraded():
			// Granted or kept while Redis was unreachable, so Redis never
			// held it (or lost it): count it again rather than end the
			// stream over the limiter's own outage.
			reacquire = append(reacquire, l)
		default:
			if c.lose(l, &Error{Status: http.StatusGone, Code: httpapi.CodeSlotLost, Message: "the limiter no longer holds this slot"}, true) {
				lost++
			}
		}
	}
	if unconfirmed > 0 {
		c.log.Warn("limiter: heartbeats not confirmed; the slots keep their TTL, retrying next tick", "slots", unconfirmed)
	}
	if lost > 0 {
		c.log.Info("limiter: leases lost", "leases", lost)
	}
	return reacquire
}

// reacquire acquires a degraded lease's slot again under its stream id.
func (c *Client) reacquire(ctx context.Context, l *Lease) {
	if !c.holds(l) {
		return
	}
	out, err := c.acquire(ctx, httpapi.AcquireRequest{UserID: l.userID, Plan: l.plan, StreamID: l.streamID, Pools: l.poolKeys, Label: l.label})
	switch {
	case err == nil:
		// Redis did not hold the slot: the stream was taken anew.
		l.acquired(out, false)
		c.setInterval(l, heartbeatInterval(out))
		if !c.holds(l) {
			// Released while the acquire was in flight, perhaps before it
			// reached the limiter, which then took the slot again: give it
			// back, whatever the release before it answered.
			_ = l.sendRelease(ctx)
		}
	case definite(err):
		// The heartbeat found no slot, and a refused acquire takes none.
		if c.lose(l, err, true) {
			c.log.Info("limiter: degraded lease refused on re-acquire", "stream_id", l.streamID, "err", err)
		}
	case c.loopCtx.Err() == nil: // not closing
		c.log.Warn("limiter: re-acquiring a degraded lease failed; retrying next tick", "stream_id", l.streamID, "err", err)
	}
}

// lose stops heartbeating l and closes its Lost with err, unless l was
// released meanwhile. vacant says the limiter answered that it holds no
// slot under l's stream id (see Lease.markLost). It reports whether l was
// lost.
func (c *Client) lose(l *Lease, err error, vacant bool) bool {
	if !c.remove(l) {
		return false
	}
	l.markLost(err, vacant)
	return true
}

// holds reports whether l is still heartbeated.
func (c *Client) holds(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leases[leaseKey{l.userID, l.streamID}] == l
}

// slotFatal reports whether a per-slot batch error means the slot cannot be
// kept: the limiter will answer the same on every later heartbeat.
func slotFatal(code string) bool {
	switch code {
	case httpapi.CodeSlotLost, httpapi.CodeUnknownPlan, httpapi.CodePlanNotAllowed, httpapi.CodeNotSlotHolder:
		return true
	}
	return invalidCode(code)
}
