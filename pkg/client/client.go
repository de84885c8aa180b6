// Package client is the Go client of the limiter's HTTP API. Acquire a
// Lease before a stream, watch Lease.Lost while it runs, Release it after.
//
// All leases of one Client are kept alive together: one ticker and one
// batch request (POST /v1/slots/heartbeats, up to httpapi.MaxBatch slots
// each) per heartbeat interval, so 10,000 streams in a process cost about
// ten requests per interval, not 10,000. A failed heartbeat (network error,
// 5xx, Redis unavailable) never marks a lease lost: the slot keeps its TTL
// on the server and the next tick retries. Only the limiter's explicit
// answer that the slot is gone closes Lost.
//
// A service with api.tokensFile set authenticates its callers: give the
// client its token with WithToken (default: the LIMITER_TOKEN environment
// variable), or, over mutual TLS, its client certificate with
// WithTLSConfig. A call it refuses is an *Error matching
// ErrUnauthenticated (no known token) or ErrPlanNotAllowed (a plan outside
// the caller's).
//
// Admin calls the admin API that support staff use: list a user's slots,
// release them all, read the audit.
package client

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

// Client talks to one limiter service. It is safe for concurrent use. Close
// it to stop its heartbeat goroutine and release the leases it holds.
type Client struct {
	api      endpoint
	ownHTTP  bool
	log      *slog.Logger
	interval time.Duration // fixed heartbeat interval; 0: from the leases
	retries  int           // of an unanswered acquire

	// releasing counts the background releases of unanswered acquires
	// (see releaseUnanswered); Close waits for them.
	releasing sync.WaitGroup

	mu     sync.Mutex
	leases map[leaseKey]*Lease
	// givingBack holds the background releases of unanswered acquires
	// under way, by stream id: each channel closes when its release has
	// been answered (or given up). An Acquire of such a stream id waits
	// for it, lest the release land after the new grant and free its slot.
	givingBack map[leaseKey]chan struct{}
	// intervals counts held leases by heartbeat interval, so the smallest
	// is found in O(tiers), not O(leases), whenever a lease comes or goes.
	intervals map[time.Duration]int
	closed    bool

	wake      chan struct{} // the smallest interval changed
	loopCtx   context.Context
	stopLoop  context.CancelFunc
	loopDone  chan struct{}
	closeOnce sync.Once
	closeErr  error
}

type leaseKey struct{ userID, streamID string }

// New returns a Client of the limiter at baseURL (e.g.
// "http://limiter.default.svc:8080"; a path prefix is kept), as the caller
// whose token WithToken or LIMITER_TOKEN gives. It starts the
// heartbeat goroutine, which idles until a lease is held; it does not touch
// the network.
func New(baseURL string, opts ...Option) (*Client, error) {
	base, err := parseBaseURL(baseURL)
	if err != nil {
		return nil, fmt.Errorf("limiter client: %w", err)
	}
	var cfg config
	for _, opt := range opts {
		if err := opt(&cfg); err != nil {
			return nil, fmt.Errorf("limiter client: %w", err)
		}
	}
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("limiter client: %w", err)
	}
	hc, owned := cfg.build()
	token := cfg.token
	if !cfg.tokenSet {
		token = strings.TrimSpace(os.Getenv(EnvToken))
	}
	c := &Client{
		api:       endpoint{base: base, http: hc, timeout: cfg.requestTimeout, token: token, maxAnswer: maxAnswerBytes},
		ownHTTP:   owned,
		log:       cfg.logger,
		interval:  cfg.interval,
		leases:    make(map[leaseKey]*Lease),
		intervals: make(map[time.Duration]int),
		wake:      make(chan struct{}, 1),
		loopDone:  make(chan struct{}),
		retries:   *cfg.acquireRetries,
	}
	c.loopCtx, c.stopLoop = context.WithCancel(context.Background())
	go c.heartbeatLoop()
	return c, nil
}

// Close stops the heartbeat goroutine and releases every lease the client
// still holds, in parallel, as far as ctx allows (a lease it cannot release
// expires on the server after its TTL). Those leases' Lost channels close
// with Err ErrClosed. Acquire fails with ErrClosed afterwards. Close also
// waits, as far as ctx allows, for the releases of acquires given up after
// their ctx ended. It reports how many lease releases failed, wrapping the
// first failure; calling it again returns the same.
func (c *Client) Close(ctx context.Context) error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		held := make([]*Lease, 0, len(c.leases))
		for _, l := range c.leases {
			held = append(held, l)
		}
		clear(c.leases)
		clear(c.intervals)
		c.mu.Unlock()

		c.stopLoop() // also cancels a tick in flight
		<-c.loopDone

		errs := make([]error, len(held))
		forEach(len(held), maxInFlight, func(i int) {
			errs[i] = held[i].release(ctx)
			held[i].markLost(ErrClosed, false)
		})
		waitFor(ctx, &c.releasing)
		if c.ownHTTP {
			c.api.http.CloseIdleConnections()
		}
		c.closeErr = summarize(errs)
	})
	return c.closeErr
}

// add starts heartbeating l, or returns the lease already held for the
// same user and stream (an idempotent re-acquire). It fails after Close.
func (c *Client) add(l *Lease) (*Lease, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	key := leaseKey{l.userID, l.streamID}
	if held, ok := c.leases[key]; ok {
		return held, nil
	}
	before := c.smallestLocked()
	c.leases[key] = l
	c.intervals[l.interval]++
	if c.smallestLocked() != before {
		c.nudge()
	}
	return l, nil
}

// remove stops heartbeating l. It reports whether l was held.
func (c *Client) remove(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := leaseKey{l.userID, l.streamID}
	if c.leases[key] != l {
		return false
	}
	before := c.smallestLocked()
	delete(c.leases, key)
	if c.intervals[l.interval]--; c.intervals[l.interval] == 0 {
		delete(c.intervals, l.interval)
	}
	if c.smallestLocked() != before {
		c.nudge()
	}
	return true
}

// holdsAnother reports whether the client heartbeats a lease other than l
// of l's user and stream id: one an Acquire of the id took after l was
// lost or released, which now holds the slot.
func (c *Client) holdsAnother(l *Lease) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	held, ok := c.leases[leaseKey{l.userID, l.streamID}]
	return ok && held != l
}

// setInterval changes the heartbeat interval of a held lease.
func (c *Client) setInterval(l *Lease, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leases[leaseKey{l.userID, l.streamID}] != l || l.interval == d {
		return
	}
	before := c.smallestLocked()
	if c.intervals[l.interval]--; c.intervals[l.interval] == 0 {
		delete(c.intervals, l.interval)
	}
	l.interval = d
	c.intervals[d]++
	if c.smallestLocked() != before {
		c.nudge()
	}
}

// smallestLocked is the interval the ticker runs at; 0 when no lease is held.
func (c *Client) smallestLocked() time.Duration {
	if len(c.leases) == 0 {
		return 0
	}
	if c.interval > 0 {
		return c.interval
	}
	var least time.Duration
	for d := range c.intervals {
		if least == 0 || d < least {
			least = d
		}
	}
	return least
}

// nudge tells the heartbeat loop to recompute its interval.
func (c *Client) nudge() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// summarize reduces per-lease release errors to one: 10,000 failures of
// the same outage should not make a 10,000-line error.
func summarize(errs []error) error {
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("limiter client: releasing %d of %d leases failed (they expire after their TTL); first: %w", failed, len(errs), first)
}

// waitFor waits for wg until ctx ends.
func waitFor(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// forEach runs fn(0..n-1) on at most limit goroutines and waits for them.
func forEach(n, limit int, fn func(i int)) {
	sem := make(chan struct{}, limit)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(i)
		})
	}
	wg.Wait()
}
