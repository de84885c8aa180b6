package hold

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
)

// End says how a stream ended: the end label of limiter_streams_held_total
// and limiter_streams_duration_seconds.
type End string

// Ends of a stream.
const (
	// EndComplete: the stream finished (the response ended, end of stream).
	EndComplete End = "complete"
	// EndClientGone: the client went away (disconnect, abort, RST).
	EndClientGone End = "client_gone"
	// EndUpstreamError: the upstream failed (refused, timed out, broke off).
	EndUpstreamError End = "upstream_error"
	// EndPanic: the handler serving the stream panicked.
	EndPanic End = "panic"
	// EndShutdown: the process stopped while the stream ran (Close).
	EndShutdown End = "shutdown"
	// EndLost: the slot was lost (Err is ErrLost) and the stream cut.
	EndLost End = "lost"
	// EndIdle: the stream was not touched for Options.IdleTimeout.
	EndIdle End = "idle"
	// EndStalled: the client read nothing of the stream for the proxy's
	// proxy.stallTimeout, and the proxy cut it.
	EndStalled End = "stalled"
)

// errReleased is the cause of a Stream Context cancelled by Release.
var errReleased = errors.New("stream released")

// Stream is one held slot. Release it exactly once per stream, from
// whichever end path comes first; later calls do nothing.
type Stream struct {
	h        *Holder
	userID   string
	plan     string
	caller   string // the acquire's, for a re-acquire: the slot stays its
	label    string // the acquire's, for a re-acquire
	id       string
	named    map[string]string // the acquire's pools in force, for a re-acquire; written by it only
	interval time.Duration     // of its group; after add, read and written under h.mu
	started  time.Time
	touched  atomic.Int64 // unix nanoseconds of the latest Touch
	// rejoining is set while the loop acquires the degraded stream
	// again, so that a batch meanwhile does not start a second acquire.
	rejoining atomic.Bool

	mu        sync.Mutex
	pools     []limiter.PoolGrant // the pool keys the grant joined: they leave with the slot
	degraded  bool
	expiresAt time.Time
	err       error // why the slot was lost; nil while held
	slotGone  bool  // the limiter no longer holds the slot: nothing to release
	lost      chan struct{}
	cancels   []context.CancelCauseFunc
	released  bool
}

func newStream(h *Holder, req limiter.AcquireRequest, res limiter.AcquireResult) *Stream {
	now := time.Now()
	s := &Stream{
		h: h, userID: req.UserID, plan: req.Plan, caller: req.Caller, label: req.Label, id: res.StreamID, named: req.Pools, pools: res.Pools, interval: intervalOf(res.Tier), started: now,
		degraded: res.Degraded, expiresAt: res.ExpiresAt, lost: make(chan struct{}),
	}
	s.touched.Store(now.UnixNano())
	return s
}

// ID returns the slot's stream id: log it and pass it on, so the logs of
// both sides join.
func (s *Stream) ID() string { return s.id }

// UserID returns the user the slot counts against.
func (s *Stream) UserID() string { return s.userID }

// Plan returns the plan the slot was acquired under.
func (s *Stream) Plan() string { return s.plan }

// Started returns when the slot was acquired.
func (s *Stream) Started() time.Time { return s.started }

// Degraded reports whether the latest answer about the slot was degraded:
// Redis did not answer and the tier fails open, so the slot is not counted
// until it is acquired again.
func (s *Stream) Degraded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.degraded
}

// ExpiresAt returns when the slot stops counting unless heartbeated, as of
// the latest answer.
func (s *Stream) ExpiresAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expiresAt
}

// Lost is closed when the slot is lost (ErrLost), released by a shutdown
// (ErrShutdown) or by the idle timeout (ErrIdle): the holder should cut
// the stream. Release does not close it.
func (s *Stream) Lost() <-chan struct{} { return s.lost }

// Err returns why Lost closed, nil while it is open.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Context returns a context derived from parent that is cancelled, with
// Err as its cause, when the slot is lost, and with a cause of its own
// when the stream is released. Pass it to the work the stream does (the
// upstream request) so that losing the slot cuts it. cancel releases the
// context's resources; it does not release the slot.
func (s *Stream) Context(parent context.Context) (ctx context.Context, cancel context.CancelFunc) {
	ctx, cancelCause := context.WithCancelCause(parent)
	s.mu.Lock()
	err, released := s.err, s.released
	if err == nil && !released {
		s.cancels = append(s.cancels, cancelCause)
	}
	s.mu.Unlock()
	switch {
	case err != nil:
		cancelCause(err)
	case released:
		cancelCause(errReleased)
	}
	return ctx, func() { cancelCause(context.Canceled) }
}

// Touch records activity on the stream (a body chunk): see
// Options.IdleTimeout. It is cheap: one atomic store.
func (s *Stream) Touch() { s.touched.Store(time.Now().UnixNano()) }

func (s *Stream) idleSince(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, s.touched.Load()))
}

// Release frees the slot, stops its heartbeats and records the stream's
// end and duration. It is idempotent and safe from any end path and any
// goroutine: the first call releases and reports true, later ones do
// nothing. The call to Redis ignores ctx's cancellation (a client that
// went away must still free its slot) but keeps its deadline, and is
// bounded by the limiter's per-call deadline; a slot it cannot free
// expires after its TTL.
func (s *Stream) Release(ctx context.Context, end End) bool {
	pools, due, ok := s.end(ctx, end)
	if !ok {
		return false
	}
	if due {
		rctx := context.WithoutCancel(ctx)
		if deadline, bounded := ctx.Deadline(); bounded {
			var cancel context.CancelFunc
			rctx, cancel = context.WithDeadline(rctx, deadline)
			defer cancel()
		}
		s.freeSlot(rctx, pools)
	}
	return true
}

// end marks the stream released (its contexts cancelled, its heartbeats
// stopped, its end recorded), once: ok reports whether this call did.
// due says the limiter may still hold its slot, to be freed (freeSlot)
// with pools.
func (s *Stream) end(ctx context.Context, end End) (pools []limiter.PoolGrant, due, ok bool) {
	return s.finish(ctx, end, nil)
}

// shut ends the stream for Close in one step: it is cut (Lost closes,
// its contexts are cancelled with err, unless it was lost before) and
// released (end), so that its holder, woken by the cut, finds it ended:
// its Release returns false at once, its answer to the client is not held
// up by a release Redis may not answer, and Close frees the slot within
// its bound, counting it. ok is false when the holder released it first.
func (s *Stream) shut(ctx context.Context, err error, end End) (pools []limiter.PoolGrant, due, ok bool) {
	return s.finish(ctx, end, err)
}

// finish is end, and with cut set shut: the stream, not lost before, is
// lost with cut in the same step.
func (s *Stream) finish(ctx context.Context, end End, cut error) (pools []limiter.PoolGrant, due, ok bool) {
	s.mu.Lock()
	if s.released {
		s.mu.Unlock()
		return nil, false, false
	}
	s.released = true
	cause := errReleased
	lost := cut != nil && s.err == nil
	if lost {
		s.err, cause = cut, cut // a later Context is born cancelled
	}
	gone, pools := s.slotGone, s.pools
	cancels := s.cancels
	s.cancels = nil
	s.mu.Unlock()
	for _, cancel := range cancels {
		cancel(cause)
	}
	if lost {
		close(s.lost)
	}
	s.h.remove(s)
	s.h.metrics.ended(context.WithoutCancel(ctx), end, time.Since(s.started))
	return pools, !gone, true
}

// freeSlot releases the slot in Redis, with the pool keys it joined,
// within ctx; it reports whether Redis answered that it holds the slot
// no more. A slot it cannot free expires after its TTL.
func (s *Stream) freeSlot(ctx context.Context, pools []limiter.PoolGrant) bool {
	res, err := s.h.lim.ReleaseJoined(ctx, s.userID, s.id, pools)
	if err != nil {
		s.h.log.Warn("releasing a stream's slot failed; it expires after its TTL", "mode", s.h.opts.Mode, "stream_id", s.id, "err", err)
	}
	return err == nil && !res.Degraded
}

// lose marks the slot lost with err, closes Lost and cancels the stream's
// contexts, once; slotGone says the limiter no longer holds the slot. It
// reports whether this call marked it. counted, when not nil, runs once
// the mark is this call's and before Lost closes. Lost closes last, so
// that whoever it wakes finds the loss counted and the contexts cancelled.
func (s *Stream) lose(err error, slotGone bool, counted func()) bool {
	s.mu.Lock()
	if s.err != nil || s.released {
		s.mu.Unlock()
		return false
	}
	s.err = err // marked: no other call closes lost, and a later Context is born cancelled
	s.slotGone = slotGone
	if counted != nil {
		counted()
	}
	cancels := s.cancels
	s.cancels = nil
	s.mu.Unlock()
	for _, cancel := range cancels {
		cancel(err)
	}
	close(s.lost)
	return true
}

// rejoined records a re-acquire's grant: its expiry, whether it is still
// degraded, and the pool keys it joined. It reports false, recording
// nothing, when the stream was released meanwhile: the grant is nobody's,
// and the caller gives it back.
func (s *Stream) rejoined(res limiter.AcquireResult) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return false
	}
	s.updateLocked(res.ExpiresAt, res.Degraded)
	s.pools = res.Pools
	return true
}

// update records a heartbeat's answer.
func (s *Stream) update(expiresAt time.Time, degraded bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.updateLocked(expiresAt, degraded)
}

// updateLocked records an expiry (when known) and whether the slot is
// degraded; s.mu is held.
func (s *Stream) updateLocked(expiresAt time.Time, degraded bool) {
	if !expiresAt.IsZero() {
		s.expiresAt = expiresAt
	}
	s.degraded = degraded
}

// over reports whether the stream was released or lost.
func (s *Stream) over() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released || s.err != nil
}
