package hold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
)

// loop is the Holder's heartbeat goroutine: for each heartbeat interval
// among the held streams it sends one batch per interval
// (limiter.HeartbeatBatch) for all the streams of that interval, and idles
// while none is held. The re-acquires and idle releases a batch calls for
// run beside it (aside), so that they never hold up a batch. Close stops
// it, and it waits for those before it ends.
func (h *Holder) loop(ctx context.Context) {
	defer close(h.loopDone)
	defer h.side.Wait()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		next, ok := h.nextBatch()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-h.wake:
				continue
			}
		}
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-h.wake:
			timer.Stop()
			continue
		case <-timer.C:
		}
		for _, d := range h.dueBatches(time.Now()) {
			h.beat(ctx, d.interval, d.streams)
		}
	}
}

// nextBatch returns when the earliest group's batch is due; false when no
// stream is heartbeated.
func (h *Holder) nextBatch() (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var next time.Time
	for _, g := range h.groups {
		if next.IsZero() || g.next.Before(next) {
			next = g.next
		}
	}
	return next, !next.IsZero()
}

// due is one group's batch: its streams, and its interval.
type due struct {
	interval time.Duration
	streams  []*Stream
}

// dueBatches returns the streams of every group due at now, and schedules
// each group's next batch one interval on. A group whose batch ran late
// (a slow round) is not sent twice to catch up.
func (h *Holder) dueBatches(now time.Time) []due {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []due
	for _, g := range h.groups {
		if g.next.After(now) {
			continue
		}
		g.next = g.next.Add(g.interval)
		if !g.next.After(now) {
			g.next = now.Add(g.interval)
		}
		batch := make([]*Stream, 0, len(g.streams))
		for s := range g.streams {
			batch = append(batch, s)
		}
		out = append(out, due{g.interval, batch})
	}
	return out
}

// beat heartbeats one group's streams, maxBatch slots per call, ends the
// idle ones, and has their slots freed and the degraded ones Redis does
// not hold acquired again beside the loop (aside): after an outage every
// degraded stream is acquired again, one Acquire each, and the next
// batch, which keeps every other stream's slot, must not wait for them.
func (h *Holder) beat(ctx context.Context, every time.Duration, streams []*Stream) {
	if h.opts.IdleTimeout > 0 {
		var idle []idleSlot
		streams, idle = h.endIdle(ctx, streams)
		if len(idle) > 0 {
			h.aside(func() { h.freeIdle(ctx, idle) })
		}
	}
	var reacquire []*Stream
	for start := 0; start < len(streams); start += maxBatch {
		batch := streams[start:min(start+maxBatch, len(streams))]
		reqs := make([]limiter.HeartbeatRequest, len(batch))
		degraded := make([]bool, len(batch)) // as the batch is sent
		for i, s := range batch {
			reqs[i] = limiter.HeartbeatRequest{UserID: s.userID, Plan: s.plan, StreamID: s.id, Caller: s.caller}
			degraded[i] = s.Degraded()
		}
		results, errs := h.lim.HeartbeatBatch(ctx, reqs)
		var failed int
		var failure error
		for i, s := range batch {
			switch res, err := results[i], errs[i]; {
			case err == nil:
				s.update(res.ExpiresAt, res.Degraded)
			case errors.Is(err, limiter.ErrSlotLost) && degraded[i]:
				// Granted or kept while Redis did not answer, so Redis
				// never held it: count it again rather than cut a stream
				// over the limiter's own outage. One whose re-acquire is
				// still on its way is left to it, and one it took again
				// while the batch was on its way (no longer degraded) is
				// judged by the next batch.
				if !s.rejoining.CompareAndSwap(false, true) {
					break
				}
				if s.Degraded() {
					reacquire = append(reacquire, s)
				} else {
					s.rejoining.Store(false)
				}
			case fatal(err):
				h.lose(ctx, s, err)
			default:
				// An outage on a Closed plan, or the loop stopping: the
				// slot keeps its TTL; the next batch tries again.
				failed++
				failure = err
			}
		}
		if failed > 0 && ctx.Err() == nil {
			h.warn.Log(ctx, slog.LevelWarn, "heartbeats not confirmed; the slots keep their TTL, retrying next interval",
				"mode", h.opts.Mode, "streams", failed, "err", failure)
		}
	}
	if len(reacquire) > 0 {
		h.aside(func() { h.rejoin(ctx, every, reacquire) })
	}
}

// aside runs fn beside the loop, which goes on sending batches on time,
// and waits for it before it ends. Only the loop calls it.
func (h *Holder) aside(fn func()) {
	h.side.Add(1)
	go func() {
		defer h.side.Done()
		fn()
	}()
}

// rejoin acquires the degraded streams again, sideConcurrency calls at
// once across the holder, and starts them within every, the interval of
// their group: those not started by then are left to the next batch,
// which finds them not held again. A re-acquire started runs to its end,
// bounded by the limiter's per-call deadline, or until the loop stops:
// cut at the interval, one slower than that would never succeed. Each
// stream is rejoining (see beat) until its re-acquire ends.
func (h *Holder) rejoin(ctx context.Context, every time.Duration, streams []*Stream) {
	startBy, cancel := context.WithTimeout(ctx, every)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, s := range streams {
		select {
		case h.sideSlots <- struct{}{}:
		case <-startBy.Done():
			for _, s := range streams[i:] {
				s.rejoining.Store(false)
			}
			return
		}
		wg.Go(func() {
			defer func() {
				s.rejoining.Store(false)
				<-h.sideSlots
			}()
			h.reacquire(ctx, s)
		})
	}
}

// fatal reports whether a heartbeat error means the slot cannot be kept:
// every later heartbeat would answer the same. ErrNotSlotHolder among
// them: the slot under the stream's id is another caller's (taken while
// Redis did not count the stream), which only that caller keeps alive
// or releases (DESIGN §19).
func fatal(err error) bool {
	return errors.Is(err, limiter.ErrSlotLost) || errors.Is(err, limiter.ErrUnknownPlan) ||
		errors.Is(err, limiter.ErrInvalidUserID) || errors.Is(err, limiter.ErrInvalidStreamID) ||
		errors.Is(err, limiter.ErrNotSlotHolder)
}

// reacquire acquires a degraded stream's slot again under its stream id,
// as the limiter would have counted it had Redis answered its grant: its
// user's slot under the plan it was granted under (Rejoin: one deleted
// since is judged by its last definition, and the stream runs on), and
// its memberships of the pool keys its acquire named, of the pools still
// in force; its record names the caller that acquired it, whose stream
// it stays (DESIGN §19). A pool deleted since caps no one, and no
// acquire can name it: the stream forgets it.
func (h *Holder) reacquire(ctx context.Context, s *Stream) {
	if s.over() {
		return // released or lost while its re-acquire waited for a side slot
	}
	s.named = inForce(h.lim.Pools(), s.named)
	res, err := h.lim.Acquire(ctx, limiter.AcquireRequest{UserID: s.userID, Plan: s.plan, StreamID: s.id, Caller: s.caller, Label: s.label, Pools: s.named, Rejoin: true})
	switch {
	case err == nil && res.Granted:
		if !s.rejoined(res) {
			// The stream ended while its re-acquire was on its way: its
			// release found nothing to free, and the grant is nobody's.
			if _, err := h.lim.ReleaseJoined(context.WithoutCancel(ctx), s.userID, s.id, res.Pools); err != nil {
				h.log.Warn("giving back the re-acquire of a stream released meanwhile failed; it expires after its TTL", "mode", h.opts.Mode, "stream_id", s.id, "err", err)
			}
			return
		}
		// The slot has the TTL of the plan as it is now, which may have
		// changed while the stream ran degraded: heartbeat it at that
		// plan's interval.
		h.regroup(s, intervalOf(res.Tier))
	case err == nil && res.RefusedBy != nil:
		r := res.RefusedBy
		h.lose(ctx, s, fmt.Errorf("%w: acquired while Redis did not answer, and refused now that it does by pool %s=%s (%d of its %d held)",
			limiter.ErrSlotLost, r.Pool, r.Key, r.Used, r.Limit))
	case err == nil:
		h.lose(ctx, s, fmt.Errorf("%w: acquired while Redis did not answer, and refused now that it does (%d of %d slots held)",
			limiter.ErrSlotLost, res.Used, res.Limit))
	case fatal(err):
		h.lose(ctx, s, err)
	}
	// Any other error: still degraded, tried again at the next batch.
}

// inForce returns the pools of named that table holds now: named itself
// when it holds them all.
func inForce(table *pools.Table, named map[string]string) map[string]string {
	var kept map[string]string
	for pool := range named {
		if _, ok := table.Lookup(pool); ok {
			continue
		}
		if kept == nil {
			kept = maps.Clone(named)
		}
		delete(kept, pool)
	}
	if kept == nil {
		return named
	}
	return kept
}

// lose marks s lost with err (the limiter no longer holds its slot) and
// stops heartbeating it. Its holder still releases it.
func (h *Holder) lose(ctx context.Context, s *Stream, err error) {
	h.unbeat(s)
	if s.lose(fmt.Errorf("%w: %w", ErrLost, err), true, func() { h.metrics.lost(ctx) }) {
		h.log.Info("slot lost; cutting the stream", "mode", h.opts.Mode, "stream_id", s.id, "err", err)
	}
}

// idleSlot is the slot of a stream ended idle, to free in Redis.
type idleSlot struct {
	s     *Stream
	pools []limiter.PoolGrant
}

// endIdle ends the streams of a batch not touched for IdleTimeout (marked
// lost with ErrIdle, ended EndIdle), and returns the others, and the idle
// ones' slots to free (freeIdle).
func (h *Holder) endIdle(ctx context.Context, streams []*Stream) (live []*Stream, idle []idleSlot) {
	now := time.Now()
	live = streams[:0:0]
	for _, s := range streams {
		if s.idleSince(now) < h.opts.IdleTimeout {
			live = append(live, s)
			continue
		}
		if s.lose(fmt.Errorf("%w: no activity for %s", ErrIdle, h.opts.IdleTimeout), false, nil) {
			h.log.Info("stream idle; releasing its slot", "mode", h.opts.Mode, "stream_id", s.id, "idle_timeout", h.opts.IdleTimeout.String())
		}
		if pools, due, ok := s.end(ctx, EndIdle); ok && due {
			idle = append(idle, idleSlot{s, pools})
		}
	}
	return live, idle
}

// freeIdle frees the slots of streams ended idle, sideConcurrency calls
// at once across the holder. As Release, it ignores ctx's cancellation (a
// closing holder frees them too), each call bounded by the limiter's
// per-call deadline; a slot it cannot free expires after its TTL.
func (h *Holder) freeIdle(ctx context.Context, idle []idleSlot) {
	ctx = context.WithoutCancel(ctx)
	var wg sync.WaitGroup
	for _, d := range idle {
		h.sideSlots <- struct{}{}
		wg.Go(func() {
			defer func() { <-h.sideSlots }()
			d.s.freeSlot(ctx, d.pools)
		})
	}
	wg.Wait()
}
