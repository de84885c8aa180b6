// Package limiter caps how many streams each user may hold at once. Slots
// are sorted-set members that carry their own expiry, so a crashed holder's
// slot expires by itself. It knows nothing of HTTP or Kubernetes.
package limiter

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/ratelog"
	"github.com/joishi/limiter/pkg/tiers"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Errors callers act on. Anything else wraps one of these or is a caller's
// context error.
var (
	// ErrUnknownPlan: the request names a plan the tier table does not hold.
	ErrUnknownPlan = errors.New("unknown plan")
	// ErrInvalidUserID: the user id cannot become a key (see keys.ValidateUserID).
	ErrInvalidUserID = keys.ErrInvalidUserID
	// ErrInvalidStreamID: the stream id is not 1-128 characters of [A-Za-z0-9._:-].
	ErrInvalidStreamID = keys.ErrInvalidStreamID
	// ErrInvalidLabel: an acquire's label is over 128 bytes or holds
	// whitespace, control or invisible characters (see keys.ValidateLabel).
	ErrInvalidLabel = keys.ErrInvalidLabel
	// ErrInvalidOverride: SetOverride was given a limit, duration, reason
	// or actor out of bounds (see OverrideRequest).
	ErrInvalidOverride = errors.New("invalid override")
	// ErrSlotLost: a heartbeat found its slot missing or expired. The
	// holder must stop the stream or acquire again.
	ErrSlotLost = errors.New("slot lost")
	// ErrNotSlotHolder: an acquire (of a held stream id), heartbeat or
	// release named a stream that another caller holds: its slot's record
	// names a caller other than the request's. Or an acquire named a
	// stream id that waits in the queue (its ticket's record names another
	// caller). Nothing changed. Requests
	// with no caller (an open API, the proxy's own streams) never get it.
	ErrNotSlotHolder = errors.New("stream held by another caller")
	// ErrRedisRefused: Redis answered with an error no retry will fix (an
	// ACL without the needed commands, a key of the wrong type under the
	// prefix). It is a misconfiguration, reported as such on every plan
	// rather than hidden behind a failure mode.
	ErrRedisRefused = errors.New("redis refused the call")
	// ErrUnavailable: Redis did not answer in time and the tier fails
	// closed (or the operation has no safe degraded answer).
	ErrUnavailable = errors.New("limiter unavailable")
	// ErrUnconfirmed: Redis granted the slot, but fewer of its replicas
	// than redis.syncReplicas asks confirmed it (a replica down or
	// lagging), and the tier fails closed. It comes wrapped with
	// ErrUnavailable: Redis answered, its replicas did not.
	ErrUnconfirmed = errors.New("slot not confirmed by replicas")
	// ErrOutcomeUnknown: a call that changes slots was sent to Redis but
	// no answer came back (a timeout, a dropped connection), so it may or
	// may not have run. ReleaseAll returns it, wrapped with the outage
	// error (ErrUnavailable or the caller's context error): its answer
	// must say exactly what it released, or that this is not known.
	ErrOutcomeUnknown = errors.New("outcome unknown")
	// ErrShuttingDown is not returned: it is the cause (context.Cause) a
	// front end cancels an acquire's context with, or wraps in it, when
	// its process shuts down and ends the waits in progress (serve's
	// drain, hold.Holder.EndWaits and Close). A wait so ended is counted
	// WaitFailed, the limiter giving up on it, not WaitCancelled: its
	// caller did not leave. Acquire returns the context's error, as for
	// any cancellation.
	ErrShuttingDown = errors.New("shutting down")
	// ErrRevoked is not returned either: it is the cause a front end
	// cancels an acquire's context with, or wraps in it, when it revokes
	// the waiting acquire's caller (serve's reload of api.tokensFile). A
	// wait so ended is counted WaitRevoked, not WaitCancelled: its caller
	// did not leave. Acquire returns the context's error.
	ErrRevoked = errors.New("caller revoked")
)

// PoolUnavailableError is the ErrUnavailable of an acquire that a pool
// failing closed refused: Redis did not answer for its key (or for the
// user's slot, without which the membership cannot be recorded with the
// stream), and the pool's failureMode is Closed; and of a heartbeat that
// such a pool's key did not answer.
type PoolUnavailableError struct {
	Pool, Key string
	// Err wraps ErrUnavailable, with the outage's cause.
	Err error
}

func (e *PoolUnavailableError) Error() string {
	return fmt.Sprintf("pool %s=%s: %v", e.Pool, e.Key, e.Err)
}

func (e *PoolUnavailableError) Unwrap() error { return e.Err }

// Options configure a Limiter.
type Options struct {
	// Keys builds key names. Default prefix keys.DefaultKeyPrefix.
	Keys keys.Schema
	// Logger receives degraded-mode warnings. Default slog.Default().
	Logger *slog.Logger
	// Observer is told the outcome of every operation (metrics).
	// Default: none.
	Observer Observer
	// TracerProvider makes a span per operation (limiter.acquire,
	// limiter.heartbeat, ...), the parent of the Redis client's spans.
	// Default: no tracing.
	TracerProvider trace.TracerProvider
	// SyncReplicas, when > 0, makes each granted acquire wait until that
	// many replicas have it (see replicaSync). Default 0: off.
	SyncReplicas int
	// TicketTTL is how long a waiting acquire's place in its user's queue
	// (its ticket) lasts unless its server refreshes it, which it does
	// every TicketTTL/3 while the acquire waits: the waiters of a server
	// that died are skipped at most this long after. Default 3s.
	TicketTTL time.Duration
	// WaitPoll is how often a waiting acquire that could be served next
	// looks for a free slot by itself, in case the wake-up of a release
	// was lost; jittered by up to a fifth either way. Default 250ms.
	WaitPoll time.Duration
	// MaxQueue bounds the acquires waiting in one user's queue, and in
	// one pool key's; one more is refused at once, as if it did not wait,
	// unless it would be served before the queue's last, whose place it
	// then takes (a higher priority; in a pool key's queue, a user holding
	// and waiting for fewer of the key's places). Default 1000.
	MaxQueue int
	// Pools are the pools acquires may name (AcquireRequest.Pools).
	// Default: none (an acquire naming a pool is ErrUnknownPool).
	Pools *pools.Table
}

// Defaults of Options.
const (
	DefaultTicketTTL = 3 * time.Second
	DefaultWaitPoll  = 250 * time.Millisecond
	DefaultMaxQueue  = 1000
)

// Limiter enforces the tiers of a table on slots kept in Redis.
type Limiter struct {
	redis    *cluster.Client
	tiers    *tiers.Table
	pools    *pools.Table
	keys     keys.Schema
	log      *slog.Logger
	observer Observer
	degraded *ratelog.Logger
	tracer   trace.Tracer
	// tracing: a TracerProvider that records was given; without one no
	// span is started.
	tracing bool

	deadlines deadlines
	wrapped   atomic.Pointer[rueidis.Client] // the deadlineClient, once connected
	direct    atomic.Int64                   // see deadlineClient
	goCalls   atomic.Int64                   // calls run in a goroutine of their own, ever

	syncReplicas int

	joined  joinedGrants // the pool keys of this Limiter's grants, for Release
	atLimit atLimit      // users lately refused by their own limit (atlimit.go)

	// Waiting acquires (see wait.go).
	bus       wakeBus
	queues    queues
	ticketTTL time.Duration
	waitPoll  time.Duration
	maxQueue  int
}

// New returns a Limiter. It does not touch Redis.
func New(redis *cluster.Client, table *tiers.Table, opts Options) *Limiter {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Observer == nil {
		opts.Observer = nopObserver{}
	}
	// The no-op provider (serve's when no exporter is configured) records
	// nothing either: no span is started then (see startSpan).
	_, off := opts.TracerProvider.(noop.TracerProvider)
	tracing := opts.TracerProvider != nil && !off
	if !tracing {
		opts.TracerProvider = noop.NewTracerProvider()
	}
	if opts.TicketTTL <= 0 {
		opts.TicketTTL = DefaultTicketTTL
	}
	if opts.WaitPoll <= 0 {
		opts.WaitPoll = DefaultWaitPoll
	}
	if opts.MaxQueue <= 0 {
		opts.MaxQueue = DefaultMaxQueue
	}
	l := &Limiter{
		redis: redis, tiers: table, keys: opts.Keys, log: opts.Logger,
		observer: opts.Observer, tracer: opts.TracerProvider.Tracer(tracerName), tracing: tracing,
		degraded:     ratelog.New(opts.Logger, degradedLogEvery),
		syncReplicas: opts.SyncReplicas,
		queues:       queues{m: map[queueKey]*scopeQueue{}},
		ticketTTL:    opts.TicketTTL, waitPoll: opts.WaitPoll, maxQueue: opts.MaxQueue,
		pools: opts.Pools,
	}
	if l.pools == nil {
		l.pools = pools.NewTable()
	}
	if redis == nil || redis.Embedded() { // one process: wake-ups are calls
		l.bus = newLocalBus()
	} else {
		l.bus = newShardBus(l)
	}
	return l
}

// Tiers returns the table the limiter enforces.
func (l *Limiter) Tiers() *tiers.Table { return l.tiers }

// MaxQueue returns the most acquires one user's queue, or one pool key's,
// holds (Options.MaxQueue, its default applied).
func (l *Limiter) MaxQueue() int { return l.maxQueue }

// Pools returns the pool table acquires are judged by.
func (l *Limiter) Pools() *pools.Table { return l.pools }

func (l *Limiter) tier(plan string) (tiers.Tier, error) {
	tier, ok := l.tiers.Lookup(plan)
	if !ok {
		return tiers.Tier{}, fmt.Errorf("%w: %q", ErrUnknownPlan, plan)
	}
	return tier, nil
}

// heldTier is the tier of a stream already granted under plan: the one in
// force, or, for a plan deleted since, its last definition.
func (l *Limiter) heldTier(plan string) (tiers.Tier, error) {
	tier, ok := l.tiers.LookupHeld(plan)
	if !ok {
		return tiers.Tier{}, fmt.Errorf("%w: %q", ErrUnknownPlan, plan)
	}
	return tier, nil
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// degradedExpiry is the expiry a degraded answer gives a slot Redis did
// not count: a TTL from now, in whole milliseconds as Redis's are.
func degradedExpiry(ttl time.Duration) time.Time {
	return msTime(time.Now().Add(ttl).UnixMilli())
}
