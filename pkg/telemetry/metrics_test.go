package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/tiers"
)

// redisState is a Redis client whose Up the test sets.
type redisState struct{ up atomic.Bool }

func (r *redisState) Up() bool { return r.up.Load() }

func TestRedisUpGauge(t *testing.T) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	var redis redisState
	if err := RegisterRedisUp(tel.MeterProvider, &redis); err != nil {
		t.Fatalf("RegisterRedisUp: %v", err)
	}
	for _, up := range []bool{false, true, false} {
		redis.up.Store(up)
		want := "limiter_redis_up 0"
		if up {
			want = "limiter_redis_up 1"
		}
		rec := httptest.NewRecorder()
		tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		body, _ := io.ReadAll(rec.Body)
		var got []string
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "limiter_redis_up") {
				got = append(got, line)
			}
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("Up() %v: /metrics has %q, want exactly %q (no labels)", up, got, want)
		}
	}
}

// No label of the HTTP server metrics comes from a request header: 100
// requests with distinct Host (and User-Agent) headers make no new series.
func TestHTTPServerMetricsIgnoreRequestHeaders(t *testing.T) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/slots/acquire", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	srv := httptest.NewServer(tel.Middleware(mux))
	defer srv.Close()

	send := func(host, agent string) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/v1/slots/acquire", strings.NewReader("{}"))
		req.Host, req.Header["User-Agent"] = host, []string{agent}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	series := func() []string {
		t.Helper()
		rec := httptest.NewRecorder()
		tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		var out []string
		for _, line := range strings.Split(rec.Body.String(), "\n") {
			if strings.HasPrefix(line, "http_server_") {
				out = append(out, line[:strings.LastIndexByte(line, ' ')])
			}
		}
		return out
	}

	send("limiter:8080", "client/1")
	before := series()
	if len(before) == 0 {
		t.Fatal("no http_server_ series after a request")
	}
	for i := range 100 {
		send(fmt.Sprintf("host-%d.example:%d", i, 1000+i), fmt.Sprintf("agent/%d", i))
	}
	after := series()
	if len(after) != len(before) {
		t.Errorf("http_server_ series: got %d after 100 distinct Host headers, want %d as before", len(after), len(before))
	}
	for _, s := range after {
		for _, leak := range []string{"server_address", "server_port", "host-", "agent/", "user_agent"} {
			if strings.Contains(s, leak) {
				t.Errorf("series %s carries %q, want no label from a request header", s, leak)
			}
		}
	}
	for _, want := range []string{`http_route="/v1/slots/acquire"`, `http_request_method="POST"`, `http_response_status_code="200"`} {
		if !strings.Contains(strings.Join(after, "\n"), want) {
			t.Errorf("http_server_ series: none has %s:\n%s", want, strings.Join(after, "\n"))
		}
	}
}

// newTestObserver returns telemetry with an observer of a table of
// tiers, shut down when the test ends.
func newTestObserver(t *testing.T, tiersOf ...tiers.Tier) (*Telemetry, *Observer, *tiers.Table) {
	t.Helper()
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	table := tiers.NewTable()
	if err := table.Replace(tiersOf); err != nil {
		t.Fatal(err)
	}
	o, err := NewObserver(tel.MeterProvider, table, ObserverOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tel, o, table
}

// scrapeLines returns the lines of tel's /metrics that start with prefix.
func scrapeLines(t *testing.T, tel *Telemetry, prefix string) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	var out []string
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	return out
}

// limiter_slots_used_max reports, for every plan of the table, the most
// live slots one user held, from acquires (granted or refused) and
// heartbeats of known plans whose user's slot Redis answered (alive, or
// degraded by a pool's shard alone); never a plan a request chose.
func TestSlotsUsedMaxGauge(t *testing.T) {
	tel, o, table := newTestObserver(t, tiers.Tier{Plan: "free", MaxConcurrentStreams: 1}.WithDefaults(), tiers.Tier{Plan: "paid", MaxConcurrentStreams: 3}.WithDefaults())
	ctx := context.Background()
	free, _ := table.Lookup("free")
	paid, _ := table.Lookup("paid")
	o.Acquired(ctx, free, limiter.AcquireResult{Granted: true, Used: 1}, nil)
	o.Acquired(ctx, paid, limiter.AcquireResult{Granted: true, Used: 2}, nil)
	o.Acquired(ctx, paid, limiter.AcquireResult{Granted: false, Used: 3}, nil)                                    // refused at the limit
	o.Acquired(ctx, paid, limiter.AcquireResult{Granted: true, Degraded: true, SlotDegraded: true, Used: 0}, nil) // not counted by Redis
	o.Heartbeated(ctx, limiter.HeartbeatResult{Alive: true, Used: 7, Plan: "gold"}, nil)                          // not in the table
	o.Heartbeated(ctx, limiter.HeartbeatResult{Alive: true, Used: 2, Plan: "free"}, nil)                          // above its limit: a lowered plan
	o.Heartbeated(ctx, limiter.HeartbeatResult{Alive: true, Degraded: true, Used: 4, Plan: "free"}, nil)          // a pool's shard failed open, the user's answered
	o.Heartbeated(ctx, limiter.HeartbeatResult{Alive: true, Degraded: true, Plan: "paid"}, nil)                   // the user's shard did not answer
	got := scrapeLines(t, tel, "limiter_slots_used_max")
	want := []string{`limiter_slots_used_max{plan="free"} 4`, `limiter_slots_used_max{plan="paid"} 3`}
	if !slices.Equal(got, want) {
		t.Errorf("/metrics: got %q, want %q", got, want)
	}
}

// overrideCount is an ActiveOverrides whose answer the test sets.
type overrideCount struct {
	n   int
	err error
}

func (c *overrideCount) ActiveOverrides(context.Context) (int, error) { return c.n, c.err }

// limiter_overrides_active has no label, and no sample when Redis does
// not answer: unknown is not 0.
func TestOverridesActiveGauge(t *testing.T) {
	tel, err := New(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	count := &overrideCount{n: 2}
	if err := RegisterOverridesActive(tel.MeterProvider, count); err != nil {
		t.Fatal(err)
	}
	if got := scrapeLines(t, tel, "limiter_overrides_active"); !slices.Equal(got, []string{"limiter_overrides_active 2"}) {
		t.Errorf("with 2 overrides: got %q, want exactly limiter_overrides_active 2", got)
	}
	count.err = errors.New("redis down")
	if got := scrapeLines(t, tel, "limiter_overrides_active"); len(got) != 0 {
		t.Errorf("with Redis down: got %q, want no sample", got)
	}
}

// The counters the alerts rate start at 0 for every plan of the table, so
// that a new replica's first increase (slots reclaimed after a deploy) is
// counted: a series that first appears at its first value is not.
func TestCountersStartAtZero(t *testing.T) {
	tel, _, _ := newTestObserver(t, tiers.Tier{Plan: "free", MaxConcurrentStreams: 1}.WithDefaults())
	for _, want := range []string{
		`limiter_slots_reclaimed_total{plan="free"} 0`,
		`limiter_slots_reclaimed_total{plan=""} 0`,
		`limiter_acquire_total{outcome="granted",plan="free"} 0`,
		`limiter_acquire_total{outcome="limited",plan="free"} 0`,
		`limiter_acquire_total{outcome="pool_limited",plan="free"} 0`,
		`limiter_heartbeat_total{outcome="alive"} 0`,
		`limiter_release_total{released="true"} 0`,
	} {
		name, _, _ := strings.Cut(want, "{")
		if got := scrapeLines(t, tel, name); !slices.Contains(got, want) {
			t.Errorf("/metrics at start: got %q, want %s", got, want)
		}
	}
	// plan="" is the reclaimed slots of a release or an unlock alone: no
	// acquire or wait is of it.
	for _, name := range []string{"limiter_acquire_total", "limiter_acquire_wait_total", "limiter_acquire_waiting"} {
		for _, line := range scrapeLines(t, tel, name) {
			if strings.Contains(line, `plan=""`) {
				t.Errorf("/metrics at start: %s; want no series of plan \"\"", line)
			}
		}
	}
}

// The counters of every request count each outcome they are told, by
// plan for acquires, and are exported as counters, with their help.
func TestRequestCountersCountEachOutcome(t *testing.T) {
	tel, o, table := newTestObserver(t, tiers.Tier{Plan: "free", MaxConcurrentStreams: 1}.WithDefaults())
	ctx := context.Background()
	free, _ := table.Lookup("free")
	paid := tiers.Tier{Plan: "paid", MaxConcurrentStreams: 3}.WithDefaults() // not in the table
	for range 3 {
		o.Acquired(ctx, free, limiter.AcquireResult{Granted: true, Used: 1}, nil)
	}
	o.Acquired(ctx, free, limiter.AcquireResult{Used: 1}, nil)
	o.Acquired(ctx, paid, limiter.AcquireResult{Granted: true, Degraded: true, SlotDegraded: true}, nil)
	o.Acquired(ctx, paid, limiter.AcquireResult{}, fmt.Errorf("redis: %w", limiter.ErrUnavailable))
	o.Acquired(ctx, free, limiter.AcquireResult{}, errors.New("invalid user id")) // refused before a tier: not counted
	for range 2 {
		o.Heartbeated(ctx, limiter.HeartbeatResult{Alive: true}, nil)
	}
	o.Heartbeated(ctx, limiter.HeartbeatResult{}, limiter.ErrSlotLost)
	o.Heartbeated(ctx, limiter.HeartbeatResult{Degraded: true}, nil)
	o.Heartbeated(ctx, limiter.HeartbeatResult{}, limiter.ErrUnavailable)
	o.Released(ctx, limiter.ReleaseResult{Released: true}, nil)
	o.Released(ctx, limiter.ReleaseResult{}, nil)
	o.Released(ctx, limiter.ReleaseResult{}, nil)
	o.Released(ctx, limiter.ReleaseResult{Degraded: true}, nil) // not answered by Redis: not counted

	for name, want := range map[string][]string{
		"limiter_acquire_total": { // no plan "": that is of releases alone
			`limiter_acquire_total{outcome="degraded",plan="free"} 0`,
			`limiter_acquire_total{outcome="degraded",plan="paid"} 1`,
			`limiter_acquire_total{outcome="granted",plan="free"} 3`,
			`limiter_acquire_total{outcome="granted",plan="paid"} 0`,
			`limiter_acquire_total{outcome="limited",plan="free"} 1`,
			`limiter_acquire_total{outcome="limited",plan="paid"} 0`,
			`limiter_acquire_total{outcome="pool_limited",plan="free"} 0`,
			`limiter_acquire_total{outcome="pool_limited",plan="paid"} 0`,
			`limiter_acquire_total{outcome="shadow_refused",plan="free"} 0`,
			`limiter_acquire_total{outcome="shadow_refused",plan="paid"} 0`,
			`limiter_acquire_total{outcome="unavailable",plan="free"} 0`,
			`limiter_acquire_total{outcome="unavailable",plan="paid"} 1`,
		},
		"limiter_heartbeat_total": {
			`limiter_heartbeat_total{outcome="alive"} 2`,
			`limiter_heartbeat_total{outcome="degraded"} 1`,
			`limiter_heartbeat_total{outcome="lost"} 1`,
			`limiter_heartbeat_total{outcome="unavailable"} 1`,
		},
		"limiter_release_total": {
			`limiter_release_total{released="false"} 2`,
			`limiter_release_total{released="true"} 1`,
		},
	} {
		got := scrapeLines(t, tel, name)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: got %q, want %q", name, got, want)
		}
		if meta := scrapeLines(t, tel, "# TYPE "+name); !slices.Equal(meta, []string{"# TYPE " + name + " counter"}) {
			t.Errorf("%s: got %q, want it a counter", name, meta)
		}
		if help := scrapeLines(t, tel, "# HELP "+name+" "); len(help) != 1 {
			t.Errorf("%s: got help %q, want one line", name, help)
		}
	}
}
