// Package hold keeps a slot for the life of a stream: it acquires the slot,
// keeps it alive with one batched heartbeat per interval for every stream
// of the process, tells the holder when the slot is lost, and releases it
// however the stream ends. The proxy and the ext_proc server hold their
// streams through it, so both count, heartbeat and release alike.
//
// A holder's life:
//
//	st, res, err := h.Acquire(ctx, limiter.AcquireRequest{UserID: u, Plan: p})
//	// err: the limiter failed (unknown plan, outage of a Closed plan);
//	// st == nil, err == nil: the limit is reached (res.RetryAfter).
//	defer st.Release(ctx, hold.EndComplete) // idempotent: the first end wins
//	ctx, cancel := st.Context(ctx)          // cancelled when the slot is lost
//	defer cancel()
//	... stream, calling st.Touch() on activity, watching st.Lost() ...
//
// A holder may let its requests wait for a slot (Options.Wait, or the
// request's own limiter.AcquireRequest.Wait): Acquire then returns once a
// slot freed up and went to the request, first come first served across
// every replica, or the wait ran out (a denial like any other), or the
// request's context ended (its place is given up at once).
//
// Every method of Holder and Stream is safe for concurrent use, so a gRPC
// stream's goroutine may acquire, touch and release while the heartbeat
// loop and a shutdown run beside it.
package hold

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/ratelog"
	"github.com/joishi/limiter/pkg/tiers"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Errors a Stream's Err and its Context's cause report, and Acquire
// returns.
var (
	// ErrLost: the limiter no longer holds the slot (it expired, support
	// released it, a failover lost it, or its plan is gone). Wraps the
	// limiter's error.
	ErrLost = errors.New("slot lost")
	// ErrShutdown: the holder closed (the process is stopping) and released
	// the slot while the stream still ran.
	ErrShutdown = errors.New("holder shut down")
	// ErrIdle: the stream was not touched for Options.IdleTimeout and its
	// slot was released.
	ErrIdle = errors.New("stream idle")
	// ErrClosed: Acquire was called on a closed holder, or its wait was
	// ended by EndWaits or Close. No slot is held. It wraps
	// limiter.ErrShuttingDown, the cause the waits are ended with, so
	// that the limiter counts them failed, not cancelled: the process
	// is stopping, the caller did not leave.
	ErrClosed = fmt.Errorf("holder closed: %w", limiter.ErrShuttingDown)
)

// Defaults of Options.
const (
	DefaultReleaseConcurrency = 16
	// CloseBound is how long the front ends give Close to release the
	// slots of the streams still held at shutdown: a Redis that does not
	// answer delays their exit no longer, and the slots not released
	// expire by their TTL.
	CloseBound = 5 * time.Second
	// maxBatch bounds the slots of one HeartbeatBatch call, as the HTTP
	// batch is bounded: a process holding more sends several per interval.
	maxBatch = 1000
	// warnEvery bounds the heartbeat-failure warnings during an outage.
	warnEvery = 10 * time.Second
	// sideConcurrency bounds the re-acquires of degraded streams and the
	// releases of idle ones in flight at once, beside the heartbeats.
	sideConcurrency = 16
)

// Options configure a Holder. Zero values take the documented defaults.
type Options struct {
	// Mode labels the stream metrics: "proxy" or "extproc". Required.
	Mode string
	// Logger receives lost slots and heartbeat failures. Default
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider receives the stream metrics (see NewMetrics). Default:
	// none recorded.
	MeterProvider metric.MeterProvider
	// IdleTimeout, when > 0, releases a stream that has not been touched
	// (Stream.Touch, or acquired) for that long, and marks it lost with
	// ErrIdle: a holder that never learns its stream ended (a gRPC peer
	// gone silent) cannot keep the slot forever. Checked at each heartbeat
	// of the stream. Default 0: never.
	IdleTimeout time.Duration
	// ReleaseConcurrency bounds the releases Close runs at once. Default 16.
	ReleaseConcurrency int
	// Wait is how long Acquire may wait for one of the user's slots to
	// free up when all are held, first come first served, for a request
	// that sets no wait of its own (limiter.AcquireRequest.Wait); the
	// tier's maxWait caps it. Close ends the waits in progress (ErrClosed).
	// Default 0: a request is refused at once.
	Wait time.Duration
}

// Holder holds the slots of one process's streams. Create one per process
// with New and Close it before exit.
type Holder struct {
	lim     *limiter.Limiter
	opts    Options
	log     *slog.Logger
	warn    *ratelog.Logger
	metrics *metrics

	mu     sync.Mutex
	held   map[*Stream]struct{}     // acquired and not yet released
	groups map[time.Duration]*group // heartbeated streams by interval
	closed bool
	wake   chan struct{} // a group was added: recompute the next tick

	stopLoop context.CancelFunc
	loopDone chan struct{}
	// side counts the loop's work aside (re-acquires, idle releases),
	// which the loop waits for before it ends; sideSlots bounds its
	// Redis calls in flight to sideConcurrency.
	side      sync.WaitGroup
	sideSlots chan struct{}
	// waitsOver ends with EndWaits or Close: waiting acquires stop
	// waiting.
	waitsOver context.Context
	endWaits  context.CancelFunc
}

// group is the streams of one heartbeat interval: one batch per interval.
type group struct {
	interval time.Duration
	streams  map[*Stream]struct{}
	next     time.Time // when the group's next batch is due
}

// New returns a Holder on lim and starts its heartbeat loop, which Close
// stops.
func New(lim *limiter.Limiter, opts Options) (*Holder, error) {
	if opts.Mode == "" {
		return nil, errors.New("hold: Options.Mode is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = noop.NewMeterProvider()
	}
	if opts.ReleaseConcurrency <= 0 {
		opts.ReleaseConcurrency = DefaultReleaseConcurrency
	}
	m, err := newMetrics(opts.MeterProvider, opts.Mode)
	if err != nil {
		return nil, err
	}
	loopCtx, stop := context.WithCancel(context.Background())
	waitsOver, endWaits := context.WithCancel(loopCtx)
	h := &Holder{
		lim: lim, opts: opts, log: opts.Logger, warn: ratelog.New(opts.Logger, warnEvery), metrics: m,
		held: map[*Stream]struct{}{}, groups: map[time.Duration]*group{},
		wake: make(chan struct{}, 1), stopLoop: stop, loopDone: make(chan struct{}), sideSlots: make(chan struct{}, sideConcurrency),
		waitsOver: waitsOver, endWaits: endWaits,
	}
	go h.loop(loopCtx)
	return h, nil
}

// Acquire takes a slot for req and, when granted, returns the Stream that
// holds it, heartbeated from now on. A limit reached is a result: the
// Stream is nil, err nil, and res says when to retry (res.RetryAfter). err
// is the limiter's (limiter.ErrUnknownPlan, ErrInvalidUserID,
// ErrUnavailable for an outage on a Closed plan, ...) or ErrClosed. On an
// outage of an Open plan the grant is degraded (res.Degraded): the stream
// is held all the same, and its slot is acquired again, under the same
// stream id, once Redis answers. Refusals are counted by reason.
//
// With a wait (req.Wait, else Options.Wait; a negative req.Wait: none)
// the acquire may wait in the user's queue for a slot, until the wait
// (capped by the tier's maxWait) runs out (a denial, res.Waited set), ctx
// ends (the request's client left: its place is given up at once) or the
// holder ends its waits (EndWaits) or closes (ErrClosed).
func (h *Holder) Acquire(ctx context.Context, req limiter.AcquireRequest) (*Stream, limiter.AcquireResult, error) {
	if h.isClosed() {
		h.metrics.refuse(ctx, ReasonUnavailable) // answered 503: shutting down
		return nil, limiter.AcquireResult{}, ErrClosed
	}
	if req.Wait == 0 {
		req.Wait = h.opts.Wait
	}
	if req.Wait > 0 {
		var cancel context.CancelFunc
		ctx, req, cancel = limiter.EndWaitsWith(ctx, h.waitsOver, ErrClosed, req)
		defer cancel()
	}
	res, err := h.lim.Acquire(ctx, req)
	if err != nil && errors.Is(context.Cause(ctx), ErrClosed) {
		h.metrics.refuse(ctx, ReasonUnavailable) // the wait EndWaits or Close ended
		return nil, res, ErrClosed
	}
	if err != nil {
		if reason, ok := refusalOf(err); ok {
			h.metrics.refuse(ctx, reason)
		}
		return nil, res, err
	}
	if !res.Granted {
		h.metrics.refuse(ctx, ReasonLimit)
		return nil, res, nil
	}
	s := newStream(h, req, res)
	if !h.add(s) {
		// Closed while the acquire was in flight: give the slot back.
		_, _ = h.lim.ReleaseJoined(context.WithoutCancel(ctx), s.userID, s.id, res.Pools)
		h.metrics.refuse(ctx, ReasonUnavailable)
		return nil, res, ErrClosed
	}
	h.metrics.started(ctx)
	return s, res, nil
}

// Waits reports whether the holder's requests may wait for a slot
// (Options.Wait).
func (h *Holder) Waits() bool { return h.opts.Wait > 0 }

// Refused counts a refusal decided before Acquire (an unauthenticated
// request: ReasonIdentity; a malformed one: ReasonInvalid), so that every
// request refused a slot is in limiter_streams_refused_total.
func (h *Holder) Refused(ctx context.Context, reason Reason) { h.metrics.refuse(ctx, reason) }

// Held returns how many streams hold a slot (acquired, not yet released).
func (h *Holder) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// Drain waits until no stream holds a slot or ctx ends; it reports
// whether none is left. It does not stop new acquires.
func (h *Holder) Drain(ctx context.Context) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for h.Held() > 0 {
		select {
		case <-ctx.Done():
			return h.Held() == 0
		case <-tick.C:
		}
	}
	return true
}

// EndWaits ends the waits of the acquires waiting for a slot, now and
// from then on (ErrClosed: the front end answers 503), as a front end
// that starts draining does: a request that holds no slot yet is not kept
// waiting through the grace, to be cut at its end. Streams held go on,
// and acquires that do not wait are taken as before, those allowed to
// wait whose slot is free among them: only one that, denied, would wait
// is ended. Close ends the waits too.
func (h *Holder) EndWaits() { h.endWaits() }

// closeCut, when set (by tests), is called as Close cuts each stream.
var closeCut func(*Stream)

// Close stops the heartbeats, refuses new acquires, and releases every
// slot still held: each such stream is cut at once, marked lost with
// ErrShutdown (its Context is cancelled, so its holder cuts it) and ended
// with EndShutdown in the same step (its holder's own Release, however
// soon it comes, then does nothing and returns at once), and its
// slot released, ReleaseConcurrency at a time. ctx bounds the releases:
// once it ends, none is started, and those in flight end with it (a slot
// not released expires after its TTL). The re-acquires of degraded
// streams and the releases of idle ones that the heartbeats started are
// waited for first, each call bounded by the limiter's per-call deadline
// (the re-acquires, cancelled, end at once). It returns how many streams it
// cut, and how many of their slots Redis answered are free (a release
// answered degraded, or not sent, is not one). Calling it again does
// nothing.
func (h *Holder) Close(ctx context.Context) (cut, released int) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		<-h.loopDone
		return 0, 0
	}
	h.closed = true
	left := make([]*Stream, 0, len(h.held))
	for s := range h.held {
		left = append(left, s)
	}
	h.mu.Unlock()
	h.stopLoop()
	<-h.loopDone

	type due struct {
		s     *Stream
		pools []limiter.PoolGrant
	}
	var free []due
	freed := 0 // ended with no slot in Redis to free
	for _, s := range left {
		pools, inRedis, ok := s.shut(ctx, ErrShutdown, EndShutdown)
		if closeCut != nil {
			closeCut(s)
		}
		switch {
		case !ok: // its holder released it meanwhile
			continue
		case inRedis:
			free = append(free, due{s, pools})
		default:
			freed++
		}
		cut++
	}

	var wg sync.WaitGroup
	var confirmed atomic.Int64
	sem := make(chan struct{}, h.opts.ReleaseConcurrency)
	for _, d := range free {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break // the rest expire by their TTL
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if d.s.freeSlot(ctx, d.pools) {
				confirmed.Add(1)
			}
		})
	}
	wg.Wait()
	released = freed + int(confirmed.Load())
	switch {
	case cut == 0:
	case released < cut:
		h.log.Warn("cut the streams still running at shutdown; the slots not released expire by their TTL",
			"mode", h.opts.Mode, "streams", cut, "released", released, "left_to_expire", cut-released)
	default:
		h.log.Info("cut the streams still running at shutdown and released their slots", "mode", h.opts.Mode, "streams", cut, "released", released)
	}
	return cut, released
}

func (h *Holder) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// add registers s as held and heartbeated; false when h is closed.
func (h *Holder) add(s *Stream) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.held[s] = struct{}{}
	h.beatLocked(s)
	return true
}

// beatLocked heartbeats s with the group of its interval; h.mu is held.
func (h *Holder) beatLocked(s *Stream) {
	g := h.groups[s.interval]
	if g == nil {
		// The group's first batch is due one interval from now; a stream
		// joining a group later is heartbeated at the group's next batch,
		// sooner than its interval, never later.
		g = &group{interval: s.interval, streams: map[*Stream]struct{}{}, next: time.Now().Add(s.interval)}
		h.groups[s.interval] = g
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	g.streams[s] = struct{}{}
}

// regroup heartbeats s, if it is still heartbeated, at interval from now
// on: a re-acquire gave its slot the TTL of its plan as it is now.
func (h *Holder) regroup(s *Stream, interval time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.interval == interval {
		return
	}
	g := h.groups[s.interval]
	if g == nil {
		return // released or lost meanwhile
	}
	if _, ok := g.streams[s]; !ok {
		return
	}
	h.unbeatLocked(s)
	s.interval = interval
	h.beatLocked(s)
}

// unbeat stops heartbeating s.
func (h *Holder) unbeat(s *Stream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unbeatLocked(s)
}

func (h *Holder) unbeatLocked(s *Stream) {
	if g := h.groups[s.interval]; g != nil {
		delete(g.streams, s)
		if len(g.streams) == 0 {
			delete(h.groups, s.interval)
		}
	}
}

// remove forgets s: it is released.
func (h *Holder) remove(s *Stream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.held, s)
	h.unbeatLocked(s)
}

// intervalOf is the heartbeat interval of a grant's tier.
func intervalOf(t tiers.Tier) time.Duration {
	if t.HeartbeatInterval > 0 {
		return t.HeartbeatInterval
	}
	return tiers.DefaultHeartbeatInterval
}
