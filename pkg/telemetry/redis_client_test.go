package telemetry_test

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/telemetry"
	"github.com/redis/rueidis"
)

// TestRedisClientMetrics: the Redis client records rueidis' metrics, as
// rueidisotel named them, once per command or pipeline (a failure counted
// once, a nil reply not at all) and once per connection, with spans
// recorded or not; with spans, every command and dial is traced.
func TestRedisClientMetrics(t *testing.T) {
	addr := testenv.Redis(t)
	for _, traced := range []bool{false, true} {
		t.Run("traced="+strconv.FormatBool(traced), func(t *testing.T) {
			ctx := context.Background()
			exported := newExporter()
			opts := telemetry.Options{}
			if traced {
				opts.SpanExporter = exported
			}
			tel, err := telemetry.New(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			c, err := tel.NewRedisClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Do(ctx, c.B().Ping().Build()).ToString(); err != nil {
				t.Fatalf("PING: %v", err)
			}
			dials := scrape(t, tel, "rueidis_dial_success_total")
			if dials < 1 || scrape(t, tel, "rueidis_dial_attempt_total") < dials ||
				scrape(t, tel, "rueidis_dial_latency_seconds_count") != dials || scrape(t, tel, "rueidis_dial_conns") != dials {
				t.Fatalf("after a PING: %v dials, %v attempts, %v timed, %v connections open; want at least 1 dial, each attempted, timed and open",
					dials, scrape(t, tel, "rueidis_dial_attempt_total"), scrape(t, tel, "rueidis_dial_latency_seconds_count"), scrape(t, tel, "rueidis_dial_conns"))
			}
			calls, failures := scrape(t, tel, "rueidis_command_duration_seconds_count"), scrape(t, tel, "rueidis_command_errors_total")
			if calls != 1 || failures != 0 {
				t.Fatalf("after a PING: %v commands timed, %v failed; want 1 and 0", calls, failures)
			}

			missing := "telemetry-test:missing:" + randomID()
			_ = c.Do(ctx, c.B().Get().Key(missing).Build()) // nil: an answer
			if err := c.Do(ctx, c.B().Arbitrary("NO-SUCH-COMMAND").Build()).Error(); err == nil {
				t.Fatal("an unknown command did not fail")
			}
			results := c.DoMulti(ctx, c.B().Ping().Build(), c.B().Arbitrary("NO-SUCH-COMMAND").Build(), c.B().Arbitrary("NO-SUCH-COMMAND").Build())
			if results[1].Error() == nil {
				t.Fatal("an unknown command in a pipeline did not fail")
			}
			for _, node := range c.Nodes() {
				_ = node.Do(ctx, node.B().Ping().Build())
			}
			if got := scrape(t, tel, "rueidis_command_duration_seconds_count"); got != 5 {
				t.Errorf("after PING, GET, a failing command, one pipeline and a PING on the node: %v commands timed, want 5", got)
			}
			if got := scrape(t, tel, "rueidis_command_errors_total"); got != 2 {
				t.Errorf("after a nil reply, a failing command and a pipeline with two: %v failures counted, want 2", got)
			}

			c.Close()
			if got := scrape(t, tel, "rueidis_dial_conns"); got != 0 {
				t.Errorf("after Close: %v connections open, want 0", got)
			}
			if err := tel.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			spans := exported.GetSpans()
			if !traced {
				if len(spans) != 0 {
					t.Errorf("no exporter, yet %d spans exported", len(spans))
				}
				return
			}
			names := map[string]int{}
			for _, sp := range spans {
				names[sp.Name]++
			}
			if names["PING"] != 2 || names["GET"] != 1 || names["NO-SUCH-COMMAND"] != 1 || names["PING x3"] != 1 {
				t.Errorf("spans by name: %v; want one per command and pipeline", names)
			}
			dial := findSpan(t, spans, "redis.dial")
			if got, want := attr(dial, "server.port"), addr[strings.LastIndexByte(addr, ':')+1:]; got != want {
				t.Errorf("redis.dial span: server.port %q, want %q", got, want)
			}
		})
	}
}

// TestRedisClientWithoutSpansAllocatesNothing: with no exporter, a
// command through the limiter's Redis client allocates no more than one
// through rueidis alone: no span, attributes or context is made when
// nothing would record them.
func TestRedisClientWithoutSpansAllocatesNothing(t *testing.T) {
	addr := testenv.Redis(t)
	ctx := context.Background()
	tel, err := telemetry.New(ctx, telemetry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(ctx)
	o := rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true}
	measured, err := tel.NewRedisClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer measured.Close()
	raw, err := rueidis.NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	allocs := func(c rueidis.Client) float64 {
		ping := c.B().Ping().Build().Pin()
		return testing.AllocsPerRun(500, func() {
			if err := c.Do(ctx, ping).Error(); err != nil {
				t.Fatal(err)
			}
		})
	}
	allocs(raw) // warm both up
	allocs(measured)
	if extra := allocs(measured) - allocs(raw); extra >= 0.5 {
		t.Errorf("a PING through the limiter's client allocates %.2f more times than through rueidis alone, want 0", extra)
	}
}

// scrape returns the value of the series named name (without labels but
// otel_scope_*) on tel's /metrics, 0 when absent.
func scrape(t *testing.T, tel *telemetry.Telemetry, name string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || (series != name && !strings.HasPrefix(series, name+"{")) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("/metrics: %q: %v", line, err)
		}
		return v
	}
	return 0
}
