package e2e

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/client"
	"github.com/joishi/limiter/pkg/httpapi"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// telemetryTiers: team may hold 3 slots of 1s and fails open; strict holds
// 1 and fails closed.
const telemetryTiers = `    - plan: team
      maxConcurrentStreams: 3
      slotTTL: 1s
      heartbeatInterval: 300ms
    - plan: strict
      maxConcurrentStreams: 1
      failureMode: Closed
    - plan: queue
      maxConcurrentStreams: 1
      maxWait: 300ms
      priority: 3
`

// telemetryPools: model=gpt-4o and model=llama-70b may hold 1 stream each;
// an acquire may wait for one (up to its plan's maxWait).
const telemetryPools = `pools:
  static:
    - pool: model
      keys: {gpt-4o: 1, llama-70b: 1}
      maxWait: 1s
`

// TestTelemetryMetricsCountExactly drives a scripted sequence through a
// running serve (grants, a denial, slots left to expire, heartbeats alive
// and lost, releases, a pool key at its cap, then Redis stopped: fail-open
// and fail-closed) and asserts the exact values /metrics must show after
// each step.
func TestTelemetryMetricsCountExactly(t *testing.T) {
	redis := testenv.StartRedis(t)
	proc := servetest.Start(t, servetest.Options{Config: serveConfig([]string{redis.Addr()}, "e2e-metrics:", telemetryTiers) + telemetryPools, AwaitRedis: true})

	m := scrape(t, proc)
	expectMetrics(t, "at start", m, map[string]float64{"limiter_tiers": 3})
	// The pool wait series start at 0 at the priority of queue, the one
	// plan that may wait.
	for _, series := range []string{
		`limiter_pool_acquire_waiting{pool="model",priority="3"}`,
		`limiter_pool_acquire_wait_total{outcome="timeout",pool="model",priority="3"}`,
	} {
		if _, ok := m[series]; !ok {
			t.Errorf("at start: no series %s", series)
		}
	}
	if !hasPrefix(m, `limiter_build_info{commit="`) {
		t.Errorf("no limiter_build_info on /metrics")
	}

	// Three grants, then the team limit: one denial.
	user := "metrics-" + randomID()
	var held []string
	for i := range 3 {
		status, res := acquire(t, proc.API, user, "team")
		if status != http.StatusOK || res.Used != i+1 {
			t.Fatalf("acquire %d: %d %+v, want 200 with used %d", i+1, status, res, i+1)
		}
		held = append(held, res.StreamID)
	}
	if status, _ := acquire(t, proc.API, user, "team"); status != http.StatusTooManyRequests {
		t.Fatalf("4th team acquire: %d, want 429", status)
	}
	expectMetrics(t, "after 3 grants and a denial", scrape(t, proc), map[string]float64{
		`limiter_acquire_total{outcome="granted",plan="team"}`: 3,
		`limiter_acquire_total{outcome="limited",plan="team"}`: 1,
		`limiter_slots_reclaimed_total{plan="team"}`:           0,
	})

	// The three slots are left to expire (TTL 1s, never released): the
	// user's next acquire reclaims exactly them.
	time.Sleep(1500 * time.Millisecond)
	status, res := acquire(t, proc.API, user, "team")
	if status != http.StatusOK || res.Used != 1 || res.Pruned != len(held) {
		t.Fatalf("acquire after expiry: %d %+v, want 200 with used 1, pruned %d", status, res, len(held))
	}
	stream := res.StreamID
	expectMetrics(t, "after the expired slots were reclaimed", scrape(t, proc), map[string]float64{
		`limiter_slots_reclaimed_total{plan="team"}`: float64(len(held)),
	})

	// Heartbeats: alive and lost, single and batched.
	beat := func(streamID string) int {
		status, _, _ := call(t, httpClient, "POST", proc.API+httpapi.PathHeartbeat, httpapi.HeartbeatRequest{UserID: user, Plan: "team", StreamID: streamID}, nil)
		return status
	}
	if got := beat(stream); got != http.StatusOK {
		t.Fatalf("heartbeat of a held slot: %d, want 200", got)
	}
	if got := beat(held[0]); got != http.StatusGone {
		t.Fatalf("heartbeat of an expired slot: %d, want 410", got)
	}
	batch := httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{
		{UserID: user, Plan: "team", StreamID: stream},
		{UserID: user, Plan: "team", StreamID: "never-held"},
	}}
	var beats httpapi.HeartbeatsResponse
	if status, _, _ := call(t, httpClient, "POST", proc.API+httpapi.PathHeartbeats, batch, &beats); status != http.StatusOK ||
		len(beats.Results) != 2 || !beats.Results[0].Alive || beats.Results[1].Alive {
		t.Fatalf("heartbeat batch: %d %+v, want alive then lost", status, beats)
	}

	// Releases: one held, then the same again.
	release := func() httpapi.ReleaseResponse {
		var out httpapi.ReleaseResponse
		call(t, httpClient, "POST", proc.API+httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: stream}, &out)
		return out
	}
	if got := release(); !got.Released {
		t.Fatalf("first release: %+v, want released", got)
	}
	if got := release(); got.Released {
		t.Fatalf("second release: %+v, want not released", got)
	}
	if status, _ := acquire(t, proc.API, "strict-"+randomID(), "strict"); status != http.StatusOK {
		t.Fatalf("strict acquire: %d, want 200", status)
	}

	// A wait that runs out: the plan's 300ms, not the 5s asked.
	waiter := "queue-" + randomID()
	if status, _ := acquire(t, proc.API, waiter, "queue"); status != http.StatusOK {
		t.Fatalf("queue acquire: %d, want 200", status)
	}
	if status, _, body := call(t, httpClient, "POST", proc.API+httpapi.PathAcquire, httpapi.AcquireRequest{UserID: waiter, Plan: "queue", WaitMs: 5000}, nil); status != http.StatusTooManyRequests {
		t.Fatalf("waiting acquire: %d %s, want 429 once its wait ran out", status, body)
	}
	waited := scrape(t, proc)
	expectMetrics(t, "after a wait ran out", waited, map[string]float64{
		`limiter_acquire_waiting{plan="queue"}`:                                       0,
		`limiter_acquire_wait_total{outcome="timeout",plan="queue"}`:                  1,
		`limiter_acquire_wait_duration_seconds_count{outcome="timeout",plan="queue"}`: 1,
		`limiter_acquire_total{outcome="granted",plan="queue"}`:                       1,
		`limiter_acquire_total{outcome="limited",plan="queue"}`:                       1,
	})
	if n := waited[`limiter_redis_duration_seconds_count{op="wait"}`]; n < 2 {
		t.Errorf(`limiter_redis_duration_seconds_count{op="wait"} = %v, want at least 2 (queued, then left)`, n)
	}

	// A pool key of cap 1 asked by two users of team: one granted, one
	// refused by the pool (its user's slot given back).
	joinModel := func() (int, []byte) {
		status, _, body := call(t, httpClient, "POST", proc.API+httpapi.PathAcquire,
			httpapi.AcquireRequest{UserID: "pool-" + randomID(), Plan: "team", Pools: map[string]string{"model": "gpt-4o"}}, nil)
		return status, body
	}
	if status, body := joinModel(); status != http.StatusOK {
		t.Fatalf("first acquire of model=gpt-4o: %d %s, want 200", status, body)
	}
	if status, body := joinModel(); status != http.StatusTooManyRequests || !strings.Contains(string(body), httpapi.CodePoolLimitReached) {
		t.Fatalf("second acquire of model=gpt-4o: %d %s, want 429 %s", status, body, httpapi.CodePoolLimitReached)
	}
	expectMetrics(t, "after a pool key refused", scrape(t, proc), map[string]float64{
		`limiter_pool_acquire_total{outcome="granted",pool="model"}`:     1,
		`limiter_pool_acquire_total{outcome="limited",pool="model"}`:     1,
		`limiter_pool_acquire_total{outcome="degraded",pool="model"}`:    0,
		`limiter_pool_acquire_total{outcome="unavailable",pool="model"}`: 0,
		`limiter_pool_used_max{pool="model"}`:                            1,
		`limiter_pool_fill_max{pool="model"}`:                            1,
		`limiter_redis_duration_seconds_count{op="acquire_pool"}`:        2,
		// The plan's count says a pool refused, not the plan's limit.
		`limiter_acquire_total{outcome="limited",plan="team"}`:      1,
		`limiter_acquire_total{outcome="pool_limited",plan="team"}`: 1,
	})

	// A user of queue (priority 3) holds model=llama-70b; another waits
	// for it until the plan's 300ms run out: a wait in the pool key's
	// queue, not in its user's; its user's slot is given back.
	acquireLlama := func(wait int64) (int, []byte) {
		status, _, body := call(t, httpClient, "POST", proc.API+httpapi.PathAcquire,
			httpapi.AcquireRequest{UserID: "pool-" + randomID(), Plan: "queue", Pools: map[string]string{"model": "llama-70b"}, WaitMs: wait}, nil)
		return status, body
	}
	if status, body := acquireLlama(0); status != http.StatusOK {
		t.Fatalf("first acquire of model=llama-70b: %d %s, want 200", status, body)
	}
	if status, body := acquireLlama(5000); status != http.StatusTooManyRequests || !strings.Contains(string(body), httpapi.CodePoolLimitReached) {
		t.Fatalf("waiting acquire of model=llama-70b: %d %s, want 429 %s once its wait ran out", status, body, httpapi.CodePoolLimitReached)
	}
	expectMetrics(t, "after a pool wait ran out", scrape(t, proc), map[string]float64{
		`limiter_pool_acquire_waiting{pool="model",priority="3"}`:                                       0,
		`limiter_pool_acquire_wait_total{outcome="timeout",pool="model",priority="3"}`:                  1,
		`limiter_pool_acquire_wait_total{outcome="granted",pool="model",priority="3"}`:                  0,
		`limiter_pool_acquire_wait_duration_seconds_count{outcome="timeout",pool="model",priority="3"}`: 1,
		`limiter_pool_acquire_total{outcome="granted",pool="model"}`:                                    2,
		`limiter_pool_acquire_total{outcome="limited",pool="model"}`:                                    2,
		`limiter_acquire_waiting{plan="queue"}`:                                                         0,
		`limiter_acquire_wait_total{outcome="timeout",plan="queue"}`:                                    1, // the earlier wait, in a user's queue
		`limiter_acquire_total{outcome="granted",plan="queue"}`:                                         2,
		`limiter_acquire_total{outcome="limited",plan="queue"}`:                                         1, // the user's wait
		`limiter_acquire_total{outcome="pool_limited",plan="queue"}`:                                    1, // the pool key's
		`limiter_redis_duration_seconds_count{op="acquire_pool"}`:                                       4,
	})

	// Redis stops: team grants degraded, strict answers 503, a team
	// heartbeat is degraded, a release degraded (not counted).
	redis.Stop()
	if status, res := acquire(t, proc.API, "outage-"+randomID(), "team"); status != http.StatusOK || !res.Degraded {
		t.Fatalf("team acquire with Redis stopped: %d %+v, want 200 degraded", status, res)
	}
	// Under an id of its own: one the limiter made, it would release in
	// the background (its answer lost), calls this count would race.
	if status, _, body := call(t, httpClient, "POST", proc.API+httpapi.PathAcquire,
		httpapi.AcquireRequest{UserID: "outage-" + randomID(), Plan: "strict", StreamID: "outage-" + randomID()}, nil); status != http.StatusServiceUnavailable {
		t.Fatalf("strict acquire with Redis stopped: %d %s, want 503", status, body)
	}
	if got := beat(stream); got != http.StatusOK {
		t.Fatalf("heartbeat with Redis stopped: %d, want 200 (degraded)", got)
	}
	if got := release(); !got.Degraded {
		t.Fatalf("release with Redis stopped: %+v, want degraded", got)
	}

	final := scrape(t, proc)
	expectMetrics(t, "at the end", final, map[string]float64{
		`limiter_acquire_total{outcome="granted",plan="team"}`:       4 + 1,
		`limiter_acquire_total{outcome="limited",plan="team"}`:       1,
		`limiter_acquire_total{outcome="pool_limited",plan="team"}`:  1,
		`limiter_acquire_total{outcome="degraded",plan="team"}`:      1,
		`limiter_acquire_total{outcome="granted",plan="strict"}`:     1,
		`limiter_acquire_total{outcome="unavailable",plan="strict"}`: 1,
		`limiter_acquire_total{outcome="limited",plan="strict"}`:     0,
		`limiter_slots_reclaimed_total{plan="team"}`:                 3,
		`limiter_slots_reclaimed_total{plan="strict"}`:               0,
		`limiter_slots_used_count{plan="team"}`:                      4 + 1,
		`limiter_slots_used_sum{plan="team"}`:                        1 + 2 + 3 + 1 + 1,
		`limiter_slots_used_count{plan="strict"}`:                    1,
		`limiter_heartbeat_total{outcome="alive"}`:                   2,
		`limiter_heartbeat_total{outcome="lost"}`:                    2,
		`limiter_heartbeat_total{outcome="degraded"}`:                1,
		`limiter_release_total{released="true"}`:                     1,
		`limiter_release_total{released="false"}`:                    1,
		// Every round trip tried once connected, the failed ones included.
		`limiter_redis_duration_seconds_count{op="acquire"}`:         3 + 1 + 1 + 1 + 2 + 2 + 2 + 2,
		`limiter_redis_duration_seconds_count{op="heartbeat"}`:       2 + 1,
		`limiter_redis_duration_seconds_count{op="heartbeat_batch"}`: 1,
		`limiter_redis_duration_seconds_count{op="release"}`:         2 + 1 + 1 + 1, // the refused pool acquires' slots given back
		`limiter_redis_duration_seconds_count{op="acquire_pool"}`:    2 + 2,
		`limiter_tiers`: 3,
	})
	// limiter_overrides_active is read from Redis at each scrape: there is
	// no sample of it while Redis is stopped, only in the first scrape.
	seen := maps.Clone(final)
	maps.Copy(seen, m)
	checkObservabilityQueries(t, seen)
}

// TestTelemetryCountsFromTheFirstAcquire: serve is ready before it reaches
// Redis (by design), so a test that counts awaits the connection
// (servetest's AwaitRedis): then even with Redis unreachable at start, the
// very first acquire is answered by Redis and counted granted, not
// degraded.
func TestTelemetryCountsFromTheFirstAcquire(t *testing.T) {
	redis := testenv.StartProxy(t, testenv.Redis(t))
	redis.BlackHole()
	reachable := time.AfterFunc(time.Second, redis.Restore)
	defer reachable.Stop()
	proc := servetest.Start(t, servetest.Options{
		Config:     serveConfig([]string{redis.Addr()}, "e2e-first:"+randomID()+":", telemetryTiers),
		AwaitRedis: true,
	})

	status, res := acquire(t, proc.API, "first-"+randomID(), "team")
	if status != http.StatusOK || res.Degraded || res.Used != 1 {
		t.Fatalf("first acquire: %d %+v, want 200 with used 1, not degraded", status, res)
	}
	expectMetrics(t, "after the first acquire", scrape(t, proc), map[string]float64{
		`limiter_acquire_total{outcome="granted",plan="team"}`:  1,
		`limiter_acquire_total{outcome="degraded",plan="team"}`: 0,
	})
}

// checkObservabilityQueries fails for each limiter_* series that a query of
// the dashboard or the alert rules (config/observability) names but serve
// does not export: they would chart or alert on nothing.
func checkObservabilityQueries(t *testing.T, samples map[string]float64) {
	t.Helper()
	exported := map[string]bool{}
	for series := range samples {
		name, _, _ := strings.Cut(series, "{")
		exported[name] = true
	}
	var queries []string
	var dashboard any
	if err := json.Unmarshal(readRepoFile(t, "config/observability/limiter.json"), &dashboard); err != nil {
		t.Fatalf("config/observability/limiter.json: %v", err)
	}
	collectQueries(dashboard, &queries)
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(readRepoFile(t, "config/observability/alerts.yaml"), &rules); err != nil {
		t.Fatalf("config/observability/alerts.yaml: %v", err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			queries = append(queries, r.Expr)
		}
	}
	if len(queries) < 10 {
		t.Fatalf("found %d queries in config/observability, want the dashboard's and the alerts'", len(queries))
	}
	for _, q := range queries {
		for _, name := range metricName.FindAllString(q, -1) {
			if !exported[name] {
				t.Errorf("config/observability queries %s, which serve does not export: %s", name, q)
			}
		}
	}
}

var metricName = regexp.MustCompile(`\blimiter_[a-z_]+`)

// collectQueries appends every "expr" and "definition" string of a
// Grafana dashboard.
func collectQueries(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
				*out = append(*out, s)
			} else {
				collectQueries(x, out)
			}
		}
	case []any:
		for _, x := range v {
			collectQueries(x, out)
		}
	}
}

func readRepoFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", path))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestTelemetryOTLPExport: with telemetry.otlpEndpoint set, an application's
// trace arrives at the collector through the limiter into Redis, over gRPC
// (the default, a bare host:port) and over HTTP (OTEL_EXPORTER_OTLP_PROTOCOL),
// with the standard OTEL_* headers and resource attributes honoured, and
// spans still buffered flushed on SIGTERM. The trace context is sent by the
// client itself, and by otelhttp when it wraps the client's transport.
func TestTelemetryOTLPExport(t *testing.T) {
	redisAddr := testenv.Redis(t)
	for _, tc := range []struct {
		name string
		// start returns the endpoint to configure and the received exports.
		start func(t *testing.T) (string, <-chan export)
		env   []string
		// sigterm: the batch delay is longer than the test, so only the
		// flush at shutdown can deliver the spans.
		sigterm bool
		// otelhttp wraps the client's transport, which then sends its
		// client span as the parent.
		otelhttp bool
	}{
		{name: "grpc", start: startGRPCReceiver, env: []string{"OTEL_BSP_SCHEDULE_DELAY=100"}},
		{name: "http", start: startHTTPReceiver, sigterm: true, otelhttp: true, env: []string{
			"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_BSP_SCHEDULE_DELAY=600000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint, received := tc.start(t)
			config := serveConfig([]string{redisAddr}, "e2e-otlp:"+randomID()+":", telemetryTiers) +
				"telemetry:\n  otlpEndpoint: " + strconv.Quote(endpoint) + "\n  serviceName: limiter-e2e\n"
			proc := servetest.Start(t, servetest.Options{Config: config, Env: append([]string{
				"OTEL_EXPORTER_OTLP_HEADERS=x-e2e-token=sesame",
				"OTEL_RESOURCE_ATTRIBUTES=deployment.environment.name=e2e",
			}, tc.env...), AwaitRedis: true})

			app := sdktrace.NewTracerProvider()
			var opts []client.Option
			if tc.otelhttp {
				opts = append(opts, client.WithTransport(func(rt http.RoundTripper) http.RoundTripper {
					return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(app), otelhttp.WithPropagators(propagation.TraceContext{}))
				}))
			}
			c, err := client.New(proc.API, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			ctx, span := app.Tracer("app").Start(context.Background(), "app.stream")
			_, err = c.Acquire(ctx, "otlp-"+randomID(), "team")
			span.End()
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			traceID := span.SpanContext().TraceID().String()
			if tc.sigterm {
				if err := proc.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if code, err := proc.Wait(20 * time.Second); err != nil || code != 0 {
					t.Fatalf("serve after SIGTERM: exit %d, %v", code, err)
				}
			}

			want := map[string]bool{"POST /v1/slots/acquire": false, "limiter.acquire": false, "EVALSHA acquire": false}
			deadline := time.After(15 * time.Second)
			for missing(want) {
				select {
				case exp := <-received:
					if exp.token != "sesame" {
						t.Errorf("export header x-e2e-token = %q, want sesame (OTEL_EXPORTER_OTLP_HEADERS)", exp.token)
					}
					for _, rs := range exp.req.GetResourceSpans() {
						res := map[string]string{}
						for _, kv := range rs.GetResource().GetAttributes() {
							res[kv.GetKey()] = kv.GetValue().GetStringValue()
						}
						for _, ss := range rs.GetScopeSpans() {
							for _, sp := range ss.GetSpans() {
								if hex.EncodeToString(sp.GetTraceId()) != traceID {
									continue
								}
								if _, ok := want[sp.GetName()]; ok {
									want[sp.GetName()] = true
								}
								if res["service.name"] != "limiter-e2e" || res["deployment.environment.name"] != "e2e" {
									t.Errorf("span %q resource %v, want service.name limiter-e2e and deployment.environment.name e2e", sp.GetName(), res)
								}
							}
						}
					}
				case <-deadline:
					t.Fatalf("spans of the caller's trace %s not received within 15s: %v\n%s", traceID, want, proc.Output())
				}
			}
		})
	}
}

// export is one OTLP export a test receiver got.
type export struct {
	req   *coltracepb.ExportTraceServiceRequest
	token string // the x-e2e-token header
}

func missing(want map[string]bool) bool {
	for _, got := range want {
		if !got {
			return true
		}
	}
	return false
}

// startHTTPReceiver serves OTLP/HTTP protobuf on /v1/traces; its endpoint
// is a URL.
func startHTTPReceiver(t *testing.T) (string, <-chan export) {
	received := make(chan export, 100)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" {
			http.Error(w, "not a traces path: "+r.URL.Path, http.StatusNotFound)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		data, err := io.ReadAll(body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if err == nil {
			err = proto.Unmarshal(data, req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		received <- export{req: req, token: r.Header.Get("x-e2e-token")}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, received
}

// grpcReceiver is the OTLP/gRPC trace service.
type grpcReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	received chan export
}

func (g *grpcReceiver) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	token := ""
	if v := md.Get("x-e2e-token"); len(v) > 0 {
		token = v[0]
	}
	g.received <- export{req: req, token: token}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startGRPCReceiver serves OTLP/gRPC; its endpoint is a bare host:port.
func startGRPCReceiver(t *testing.T) (string, <-chan export) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	r := &grpcReceiver{received: make(chan export, 100)}
	coltracepb.RegisterTraceServiceServer(srv, r)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), r.received
}

// scrape returns the samples of proc's /metrics by series
// (`name{label="v",...}`, labels in the exposition's sorted order).
func scrape(t *testing.T, proc *servetest.Process) map[string]float64 {
	t.Helper()
	status, body := servetest.Get(proc.Ops + "/metrics")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", status, body)
	}
	samples := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("unparsable /metrics line %q", line)
		}
		samples[line[:i]] = v
	}
	return samples
}

// expectMetrics checks each series of want; a counter series never
// touched is absent and counts as 0.
func expectMetrics(t *testing.T, when string, got, want map[string]float64) {
	t.Helper()
	for series, v := range want {
		if got[series] != v {
			t.Errorf("%s: %s = %v, want %v", when, series, got[series], v)
		}
	}
}

func hasPrefix(samples map[string]float64, prefix string) bool {
	for series := range samples {
		if strings.HasPrefix(series, prefix) {
			return true
		}
	}
	return false
}

// TestTelemetryNoLabelFromRequestHeaders: 100 requests to a running serve,
// each with its own Host and User-Agent, make no new /metrics series.
func TestTelemetryNoLabelFromRequestHeaders(t *testing.T) {
	proc := servetest.Start(t, servetest.Options{Config: serveConfig([]string{testenv.Redis(t)}, "e2e-hosts:"+randomID()+":", telemetryTiers)})
	get := func(host string) {
		t.Helper()
		req, _ := http.NewRequest("GET", proc.API+httpapi.PathTiers, nil)
		req.Host = host
		req.Header.Set("User-Agent", "agent-for-"+host)
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// The HTTP server's series only: Redis's come and go with the
	// background connection.
	httpSeries := func() []string {
		var out []string
		for series := range scrape(t, proc) {
			if strings.HasPrefix(series, "http_server_") {
				out = append(out, series)
			}
		}
		return out
	}
	get("limiter")
	before := len(httpSeries())
	if before == 0 {
		t.Fatal("no http_server_ series on /metrics after a request")
	}
	for i := range 100 {
		get(fmt.Sprintf("host-%d.example", i))
	}
	after := httpSeries()
	if len(after) != before {
		t.Errorf("http_server_ series: got %d after 100 distinct Host headers, want %d as before", len(after), before)
	}
	for _, series := range after {
		if strings.Contains(series, "host-") || strings.Contains(series, "server_address") {
			t.Errorf("series %s: want no label from a request header", series)
		}
	}
}
