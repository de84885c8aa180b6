// Package cluster connects the limiter to Redis: standalone, Redis Cluster,
// Sentinel, or an embedded in-process store. It also owns every key name and
// the validation of the identifiers that go into keys.
package cluster

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Defaults of Options.
const (
	DefaultTimeout               = 250 * time.Millisecond
	DefaultShardsRefreshInterval = 5 * time.Second
	DefaultProbeInterval         = 5 * time.Second
	DefaultAnswerWithin          = 5 * time.Second
	DefaultMaxFlushDelay         = 20 * time.Microsecond
	DefaultWarmWithin            = 2 * time.Second
	EmbeddedMinTimeout           = 2 * time.Second
)

// ErrNotConnected is returned by Client.Redis while no connection to Redis
// has been established yet (it is still being retried in the background).
var ErrNotConnected = errors.New("redis: not connected yet")

// Options configure a Client. Zero values take the documented defaults.
type Options struct {
	// Addrs are the Redis seed addresses (host:port). One address of a
	// standalone server gives a single client; an address of a cluster node
	// gives a cluster client (detected). Empty: the embedded store.
	Addrs []string
	// SentinelMasterSet, when set, treats Addrs as Sentinels and follows the
	// named master.
	SentinelMasterSet string
	// Username and Password authenticate to Redis and to Sentinels (ACL).
	// Default none.
	Username string
	Password string
	// ReadPassword, when set, replaces Password: it is called for every
	// new connection, so a rotated password is used from the next
	// reconnect on, without a restart. An error fails that connection like
	// a refused password (an outage, retried). Default nil: Password.
	ReadPassword func() (string, error)
	// TLS, when non-nil, makes every connection TLS.
	TLS *tls.Config
	// Timeout is the per-call deadline the limiter applies. Default 250ms.
	// The embedded store uses at least EmbeddedMinTimeout: it runs scripts
	// on this process's CPU, one at a time, so a burst queues rather than
	// signalling an outage.
	Timeout time.Duration
	// ShardsRefreshInterval is how often a cluster client rescans the
	// topology, so a failover is followed even without a MOVED. Default 5s.
	ShardsRefreshInterval time.Duration
	// DialTimeout bounds connecting to one node: TCP, TLS and the HELLO
	// handshake. Default Timeout: calls wait for a dial in progress (see
	// pkg/limiter), and a dial that outlasts their deadline serves none of
	// them, while a node that accepts connections and never answers (hung,
	// black-holed) is redialled sooner.
	DialTimeout time.Duration
	// ProbeInterval is how often the client checks that Redis answers,
	// whatever the traffic (see Client.Up). Default 5s.
	ProbeInterval time.Duration
	// AnswerWithin is how long after New Redis may take to first answer
	// before an ERROR says it has not. Default 5s.
	AnswerWithin time.Duration
	// Scripts are Lua sources the client loads (SCRIPT LOAD) on every node
	// as soon as it connects, so that a script's first EVALSHA finds it
	// instead of failing NOSCRIPT and sending the whole source again.
	// Default none.
	Scripts []string
	// WarmWithin bounds how long after New Warmed waits for the warm-up
	// (see Warmed): past it Warmed is true whatever Redis does. Default
	// 2s: a healthy Redis is warm within milliseconds, and each step of the
	// warm-up is bounded by Timeout.
	WarmWithin time.Duration
	// MaxFlushDelay is how long the client's writer may wait after writing
	// to a connection, gathering the commands that callers issue meanwhile
	// into its next write: fewer system calls per command, on the client
	// and on Redis, for at most that much latency. Default 20µs; negative:
	// none (every write goes out as soon as a command is queued).
	MaxFlushDelay time.Duration
	// Logger receives connection state changes. Default slog.Default().
	Logger *slog.Logger
	// NewRedis builds the rueidis client from the options this package
	// derives, so it can be instrumented (telemetry traces each command).
	// Default rueidis.NewClient.
	NewRedis func(rueidis.ClientOption) (rueidis.Client, error)
}

func (o Options) withDefaults() Options {
	o.Timeout = cmp.Or(o.Timeout, DefaultTimeout)
	o.ShardsRefreshInterval = cmp.Or(o.ShardsRefreshInterval, DefaultShardsRefreshInterval)
	o.ProbeInterval = cmp.Or(o.ProbeInterval, DefaultProbeInterval)
	o.AnswerWithin = cmp.Or(o.AnswerWithin, DefaultAnswerWithin)
	o.MaxFlushDelay = cmp.Or(o.MaxFlushDelay, DefaultMaxFlushDelay)
	o.WarmWithin = cmp.Or(o.WarmWithin, DefaultWarmWithin)
	o.Logger = cmp.Or(o.Logger, slog.Default())
	if o.NewRedis == nil {
		o.NewRedis = rueidis.NewClient
	}
	return o
}

// Client is the limiter's handle on Redis. It is created without touching
// the network: connecting happens in the background and is retried until
// Redis answers, so the service starts (and fails open or closed per tier)
// while Redis is down. Up says whether Redis answers.
type Client struct {
	opts      Options
	redis     atomic.Pointer[rueidis.Client]
	connected chan struct{}
	started   time.Time     // when New returned the client
	warmed    chan struct{} // closed once the warm-up ended (see Warmed)
	embedded  *embeddedStore
	health    *health
	slots     atomic.Pointer[SlotMap] // a cluster's, nil until read
	served    atomic.Bool             // a cluster's latest probe: every slot served, cluster_state:ok
	lastDial  atomic.Int64            // unix ns when the latest dial started; 0: none

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// New returns a Client for opts. It fails only on invalid options, never
// because Redis is unreachable.
func New(opts Options) (*Client, error) {
	opts = opts.withDefaults()
	if opts.Timeout < 0 || opts.ShardsRefreshInterval < 0 || opts.DialTimeout < 0 || opts.ProbeInterval < 0 || opts.AnswerWithin < 0 || opts.WarmWithin < 0 {
		return nil, errors.New("redis timeouts must not be negative")
	}
	c := &Client{opts: opts, connected: make(chan struct{}), warmed: make(chan struct{}), stop: make(chan struct{})}
	if len(opts.Addrs) == 0 {
		store, err := startEmbedded(opts.Logger)
		if err != nil {
			return nil, err
		}
		c.embedded = store
		c.opts.Addrs = []string{embeddedAddr}
		c.opts.Timeout = max(c.opts.Timeout, EmbeddedMinTimeout)
	}
	if c.opts.DialTimeout == 0 {
		c.opts.DialTimeout = c.opts.Timeout
	}
	c.health = newHealth(c.opts.Logger, c.opts.Addrs)
	c.started = time.Now()
	c.wg.Go(c.run)
	c.wg.Go(func() { c.watchFirstAnswer(c.started) })
	return c, nil
}

// run connects, warms up, then probes Redis every ProbeInterval until
// Close.
func (c *Client) run() {
	client, ok := c.connect()
	if !ok {
		return
	}
	c.probe(client) // first: it reads a cluster's slot map
	c.warm(client)
	close(c.warmed)
	if c.embedded == nil {
		c.checkServers(client)
	}
	ticker := time.NewTicker(c.opts.ProbeInterval)
	defer ticker.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-ticker.C:
			c.probe(client)
		}
	}
}

// connect dials until Redis accepts a connection, then publishes the
// client. It returns the unobserved client, or false when Close came first.
func (c *Client) connect() (rueidis.Client, bool) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		client, err := c.opts.NewRedis(c.clientOption())
		if err == nil {
			var handed rueidis.Client = observed{Client: client, health: c.health}
			c.redis.Store(&handed)
			close(c.connected)
			c.opts.Logger.Info("connected to redis", "addrs", c.opts.Addrs, "mode", string(client.Mode()), "attempts", attempt)
			return client, true
		}
		c.health.fail(err)
		if attempt == 1 || attempt%20 == 0 {
			c.opts.Logger.Warn("redis not reachable yet; retrying in the background", "addrs", c.opts.Addrs, "attempt", attempt, "err", err)
		}
		select {
		case <-c.stop:
			return nil, false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func (c *Client) clientOption() rueidis.ClientOption {
	o := rueidis.ClientOption{
		InitAddress:  c.opts.Addrs,
		Username:     c.opts.Username,
		Password:     c.opts.Password,
		TLSConfig:    c.opts.TLS,
		DisableCache: true, // no client-side caching: every read must see the server's state
		Dialer:       net.Dialer{Timeout: c.opts.DialTimeout, KeepAlive: time.Second},
		// A connection that stops answering is dropped after this and
		// redialled; calls themselves are bounded by Timeout.
		ConnWriteTimeout: c.connWriteTimeout(),
		ClusterOption:    rueidis.ClusterOption{ShardsRefreshInterval: c.opts.ShardsRefreshInterval},
		ClientName:       "limiter",
		MaxFlushDelay:    max(c.opts.MaxFlushDelay, 0),
		DialCtxFn:        c.dial,
	}
	if c.opts.SentinelMasterSet != "" {
		o.Sentinel = rueidis.SentinelOption{
			MasterSet:               c.opts.SentinelMasterSet,
			Username:                c.opts.Username,
			Password:                c.opts.Password,
			TLSConfig:               c.opts.TLS,
			Dialer:                  o.Dialer,
			TopologyRefreshInterval: c.opts.ShardsRefreshInterval,
		}
	}
	if c.opts.ReadPassword != nil {
		// Sentinel connections take it too (rueidis copies the option).
		o.Password, o.Sentinel.Password = "", ""
		o.AuthCredentialsFn = c.credentials
	}
	if c.embedded != nil {
		o.ForceSingleClient = true
	}
	return o
}

// Redis returns the connected rueidis client, or ErrNotConnected while the
// first connection is still being retried. Once connected it is always the
// same client (it reconnects by itself).
func (c *Client) Redis() (rueidis.Client, error) {
	p := c.redis.Load()
	if p == nil {
		return nil, ErrNotConnected
	}
	return *p, nil
}

// WaitConnected blocks until connected or ctx ends.
func (c *Client) WaitConnected(ctx context.Context) error {
	select {
	case <-c.connected:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for redis %v: %w", c.opts.Addrs, ctx.Err())
	}
}

// Timeout is the per-call deadline.
func (c *Client) Timeout() time.Duration { return c.opts.Timeout }

// dial connects to dst as rueidis does by default, or to the embedded
// store, and notes when it started (see HonorsDeadlines).
func (c *Client) dial(ctx context.Context, dst string, dialer *net.Dialer, config *tls.Config) (net.Conn, error) {
	c.lastDial.Store(time.Now().UnixNano())
	if c.embedded != nil {
		return c.embedded.dial()
	}
	if config != nil {
		return (&tls.Dialer{NetDialer: dialer, Config: config}).DialContext(ctx, "tcp", dst)
	}
	return dialer.DialContext(ctx, "tcp", dst)
}

// connWriteTimeout is how long a connection may go unanswered before the
// client drops it (and with it every command still waiting on it).
func (c *Client) connWriteTimeout() time.Duration { return max(4*c.opts.Timeout, 2*time.Second) }

// HonorsDeadlines reports whether rueidis itself returns a call made now
// on client (one Redis returned) by the call's context deadline, given
// that every call's deadline is at most Timeout after it starts (the
// limiter's are), that the call reaches rueidis once, when it starts (a
// command rueidis does not retry), and that fewer than MaxDirectCalls such
// calls are in flight. rueidis honors a call's context everywhere but in
// three places:
//
//   - A call that needs a connection another call is dialling waits for
//     that dial. A dial is bounded by the context of the call that started
//     it (connection and handshake alike) and by DialTimeout, so with
//     DialTimeout <= Timeout the wait ends before the waiter's own
//     deadline, as long as every dial started no later than the waiter's
//     call: a retry, later in its call, can wait on a dial that a later
//     call started (hence once), and so can a call that reached rueidis
//     well after it started, on a loaded machine (hence false while a dial
//     may still be in progress, 2 DialTimeouts after the latest started).
//     Every dial counts: a standalone client's, and a cluster client's,
//     from its calls and from its topology refreshes alike.
//   - A call waits for room in its connection's queue of commands sent
//     and not yet answered (1024 by default), and a command whose caller
//     gave up keeps its place until Redis answers it or the connection is
//     dropped, ConnWriteTimeout after it stopped answering. So it is false
//     for that long after any call failed as an outage; before that, the
//     calls in flight (fewer than MaxDirectCalls) hold every place taken.
//   - On a cluster, a call whose hash slot has no node in rueidis's map
//     refreshes the topology in the call, bounded by ConnWriteTimeout, not
//     by the call's context. rueidis's map holds every slot that CLUSTER
//     SLOTS names, so it is false unless the latest probe (every
//     ProbeInterval) found a master for every slot and cluster_state:ok; a
//     cluster losing slots fails its probe and its calls, which the
//     outage rule above covers from the first one. (Only a slot unassigned
//     since the latest probe, whose refresh then finds every node it asks
//     hung, could hold a call past its deadline.)
//
// A Sentinel client follows its master in the background, dialling with
// longer deadlines: for it, it is false.
func (c *Client) HonorsDeadlines(client rueidis.Client, now time.Time) bool {
	switch client.Mode() {
	case rueidis.ClientModeStandalone:
	case rueidis.ClientModeCluster:
		if !c.served.Load() {
			return false
		}
	default:
		return false
	}
	if c.opts.DialTimeout > c.opts.Timeout {
		return false
	}
	if dial := c.lastDial.Load(); dial != 0 && now.UnixNano()-dial <= int64(2*c.opts.DialTimeout) {
		return false
	}
	last := c.health.lastOutage.Load()
	return last == 0 || now.UnixNano()-last > int64(c.connWriteTimeout())
}

// MaxDirectCalls bounds the calls in flight for which HonorsDeadlines
// holds: well below the 1024 commands rueidis queues per connection.
const MaxDirectCalls = 256

// Embedded reports whether the client runs on the in-process store.
func (c *Client) Embedded() bool { return c.embedded != nil }

// Addrs returns the seed addresses; embedded, a name ("in-process"), as
// the store has no network address.
func (c *Client) Addrs() []string { return c.opts.Addrs }

// Close stops connecting, closes the connection and the embedded store.
func (c *Client) Close() {
	c.once.Do(func() {
		close(c.stop)
		c.wg.Wait()
		if p := c.redis.Load(); p != nil {
			(*p).Close()
		}
		if c.embedded != nil {
			c.embedded.close()
		}
	})
}
