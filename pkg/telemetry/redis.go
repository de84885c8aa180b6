package telemetry

import (
	"context"
	"crypto/sha1"
	"crypto/tls"
	"encoding/hex"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidisotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// redisScope is the instrumentation scope of the Redis client's metrics
// and spans: rueidisotel's, so that the series are the ones it exported.
const redisScope = "github.com/redis/rueidis"

// rueidisBuckets are rueidisotel's default histogram buckets, in seconds.
var rueidisBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// NewRedisClient is a cluster.Options.NewRedis: a rueidis client that
// records the Redis client's metrics, as rueidisotel names them
// (rueidis_command_duration_seconds and rueidis_command_errors for every
// command or pipeline, rueidis_dial_attempt, _success, _conns and
// _latency for every connection), and, when spans are recorded (an
// exporter is configured), makes a client span per command, script or
// pipeline through rueidisotel (named like "EVALSHA acquire", without keys
// or arguments, so no user id) and one per dial ("redis.dial").
//
// It does what rueidisotel.NewClient did, with the same metrics, for less:
// without an exporter no span is started, since nothing would be
// recorded. rueidisotel starts one on every call whatever the tracer
// provider, and its attributes and context were some 3% of `limiter
// serve`'s CPU in a profile at full load (BENCHMARKS.md).
func (t *Telemetry) NewRedisClient(o rueidis.ClientOption) (rueidis.Client, error) {
	m, err := newRedisMetrics(t.MeterProvider)
	if err != nil {
		return nil, err
	}
	o.DialCtxFn, o.DialFn = m.dialing(t.TracerProvider.Tracer(redisScope), o.DialCtxFn, o.DialFn), nil
	c, err := rueidis.NewClient(o)
	if err != nil {
		return nil, err
	}
	var client rueidis.Client = metered{Client: c, m: m}
	if _, off := t.TracerProvider.(noop.TracerProvider); !off {
		client = rueidisotel.WithClient(client,
			rueidisotel.WithTracerProvider(t.TracerProvider),
			// The metrics are metered's, recorded once.
			rueidisotel.WithMeterProvider(metricnoop.NewMeterProvider()),
			rueidisotel.WithOpNameResolver(newScriptNames()),
		)
	}
	return client, nil
}

// redisMetrics are the Redis client's instruments.
type redisMetrics struct {
	duration    metric.Float64Histogram
	errors      metric.Int64Counter
	dialAttempt metric.Int64Counter
	dialSuccess metric.Int64Counter
	dialConns   metric.Int64UpDownCounter
	dialLatency metric.Float64Histogram
}

func newRedisMetrics(mp metric.MeterProvider) (*redisMetrics, error) {
	meter := mp.Meter(redisScope)
	var m redisMetrics
	var errs [6]error
	m.duration, errs[0] = meter.Float64Histogram("rueidis_command_duration_seconds", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(rueidisBuckets...))
	m.errors, errs[1] = meter.Int64Counter("rueidis_command_errors")
	m.dialAttempt, errs[2] = meter.Int64Counter("rueidis_dial_attempt")
	m.dialSuccess, errs[3] = meter.Int64Counter("rueidis_dial_success")
	m.dialConns, errs[4] = meter.Int64UpDownCounter("rueidis_dial_conns")
	m.dialLatency, errs[5] = meter.Float64Histogram("rueidis_dial_latency", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(rueidisBuckets...))
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return &m, nil
}

// command records one command's or pipeline's duration, and its failure
// (a nil reply is an answer, not a failure).
func (m *redisMetrics) command(ctx context.Context, start time.Time, err error) {
	m.duration.Record(ctx, float64(time.Since(start))/float64(time.Second))
	if err != nil && !rueidis.IsRedisNil(err) {
		m.errors.Add(ctx, 1)
	}
}

// dialing wraps the client's dial (dialCtx, else dial, else a plain TCP or
// TLS dial) to count attempts, successes and open connections, time each
// dial and trace it as "redis.dial".
func (m *redisMetrics) dialing(tracer trace.Tracer,
	dialCtx func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error),
	dial func(string, *net.Dialer, *tls.Config) (net.Conn, error),
) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	switch {
	case dialCtx != nil:
	case dial != nil:
		dialCtx = func(_ context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
			return dial(dst, d, cfg)
		}
	default:
		dialCtx = func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
			if cfg != nil {
				return (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", dst)
			}
			return d.DialContext(ctx, "tcp", dst)
		}
	}
	return func(ctx context.Context, dst string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		ctx, span := tracer.Start(ctx, "redis.dial", trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(serverAttrs(dst)...))
		defer span.End()
		m.dialAttempt.Add(ctx, 1)
		start := time.Now()
		conn, err := dialCtx(ctx, dst, d, cfg)
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			return nil, err
		}
		m.dialLatency.Record(ctx, float64(time.Since(start))/float64(time.Second))
		m.dialSuccess.Add(ctx, 1)
		m.dialConns.Add(ctx, 1)
		return &countedConn{Conn: conn, conns: m.dialConns}, nil
	}
}

// serverAttrs are a dial span's attributes, as rueidisotel sets them.
func serverAttrs(dst string) []attribute.KeyValue {
	attrs := []attribute.KeyValue{attribute.String("db.system", "redis")}
	host, port, err := net.SplitHostPort(dst)
	if n, perr := strconv.Atoi(port); err == nil && perr == nil {
		return append(attrs, attribute.String("server.address", host), attribute.Int("server.port", n))
	}
	return append(attrs, attribute.String("server.address", dst))
}

// countedConn takes itself off rueidis_dial_conns when first closed.
type countedConn struct {
	net.Conn
	conns  metric.Int64UpDownCounter
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.conns.Add(context.Background(), -1)
	}
	return c.Conn.Close()
}

// metered is the rueidis client with its calls measured. The limiter
// calls Do and DoMulti, on the client and on its nodes; its other calls
// (cached reads, streams, dedicated connections) go unmeasured.
type metered struct {
	rueidis.Client
	m *redisMetrics
}

func (c metered) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	start := time.Now()
	res := c.Client.Do(ctx, cmd)
	c.m.command(ctx, start, res.Error())
	return res
}

// DoMulti records the pipeline as one command, failed by its first
// failure, as rueidisotel does.
func (c metered) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	start := time.Now()
	results := c.Client.DoMulti(ctx, cmds...)
	var failed error
	for _, res := range results {
		if err := res.Error(); err != nil && !rueidis.IsRedisNil(err) {
			failed = err
			break
		}
	}
	c.m.command(ctx, start, failed)
	return results
}

func (c metered) Nodes() map[string]rueidis.Client {
	nodes := c.Client.Nodes()
	for addr, node := range nodes {
		nodes[addr] = metered{Client: node, m: c.m}
	}
	return nodes
}

// scriptNames names operations by the limiter script they run. The
// names are built once: rueidisotel asks for one per command, metrics only
// or not, and a name made per call was a concatenation on every Redis call.
type scriptNames struct {
	// names maps the script's SHA-1 (what EVALSHA is sent with) to
	// "EVALSHA name" and its source (EVAL, after a NOSCRIPT) to "EVAL name".
	names map[string]string
}

func newScriptNames() scriptNames {
	n := scriptNames{names: map[string]string{}}
	for name, src := range lua.Sources() {
		sum := sha1.Sum([]byte(src))
		n.names[hex.EncodeToString(sum[:])] = "EVALSHA " + name
		n.names[src] = "EVAL " + name
	}
	return n
}

// OpName is "EVALSHA acquire" (or "EVAL acquire") for a script of pkg/lua,
// else the command.
func (n scriptNames) OpName(_ context.Context, cmd rueidis.Completed) string {
	return n.name(cmd.Commands())
}

// MultiOpName names a pipeline by its first command and its length
// ("EVALSHA heartbeat x1000"), rather than by every command in it.
func (n scriptNames) MultiOpName(_ context.Context, cmds rueidis.Commands) string {
	if len(cmds) == 0 {
		return ""
	}
	return n.multi(n.name(cmds[0].Commands()), len(cmds))
}

// MultiCacheableOpName is MultiOpName of cached reads (unused here).
func (n scriptNames) MultiCacheableOpName(_ context.Context, cmds []rueidis.CacheableTTL) string {
	if len(cmds) == 0 {
		return ""
	}
	return n.multi(n.name(cmds[0].Cmd.Commands()), len(cmds))
}

func (n scriptNames) name(tokens []string) string {
	op := tokens[0]
	if len(tokens) < 2 || !(strings.EqualFold(op, "EVALSHA") || strings.EqualFold(op, "EVAL")) {
		return op
	}
	script, ok := n.names[tokens[1]]
	switch {
	case !ok:
		return op
	case len(script) > len(op) && script[len(op)] == ' ' && script[:len(op)] == op:
		return script
	}
	// Sent in another case than rueidis' own ("evalsha"): the name says so.
	return op + script[strings.IndexByte(script, ' '):]
}

func (scriptNames) multi(first string, count int) string {
	if count == 1 {
		return first
	}
	return first + " x" + strconv.Itoa(count)
}
