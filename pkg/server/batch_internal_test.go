package server_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/pools"
	"github.com/joishi/limiter/pkg/server"
)

// TestABatchSlotRedisRefusesIsInternalAndLogged: a slot of a batch
// heartbeat whose user's key is of another type under the prefix (what
// docs/api.md calls a misconfiguration: 500 internal, logged at ERROR) is
// answered, within the batch's 200, with the per-slot code internal, which
// the API spec names; and it is logged at ERROR, as the single heartbeat
// of the same slot is. The three clients heartbeat only in batches.
func TestABatchSlotRedisRefusesIsInternalAndLogged(t *testing.T) {
	var sink logSink
	logger := slog.New(slog.NewJSONHandler(&sink, nil))
	stack := limitertest.New(t, limitertest.Options{Limiter: limiter.Options{Logger: logger}})
	a := newAPIOf(t, server.New(stack.Limiter, server.Options{Logger: logger})) // answers checked against the spec
	user := newUser(t)
	key, err := stack.Keys.UserKey(user)
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := stack.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(context.Background(), rdb.B().Set().Key(key).Value("foreign").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r := a.post(t, httpapi.PathHeartbeats, httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{{UserID: user, Plan: "free", StreamID: "s1"}}})
	if r.status != http.StatusOK || !strings.Contains(string(r.body), `"code":"internal"`) {
		t.Fatalf("batch: %d %s; want 200 with the slot's error internal", r.status, r.body)
	}
	if !strings.Contains(sink.String(), `"level":"ERROR"`) || !strings.Contains(sink.String(), "WRONGTYPE") {
		t.Errorf("a batch slot answered internal (Redis refused the call) logged no ERROR naming it; log:\n%s", sink.String())
	}
}

// TestAPooledSlotWhosePoolKeyRedisRefusesIsInternal: a stream's pool key
// of another type under the prefix (a misconfiguration, as a user's key
// of another type is) answers its single heartbeat 500 internal and its
// batch slot the per-slot code internal, each logged at ERROR, as an
// acquire joining the key is answered: not alive and degraded, as for a
// pool key whose shard does not answer.
func TestAPooledSlotWhosePoolKeyRedisRefusesIsInternal(t *testing.T) {
	var sink logSink
	logger := slog.New(slog.NewJSONHandler(&sink, nil))
	table := pools.NewTable()
	if err := table.Replace([]pools.Pool{pools.Pool{Pool: "model", Keys: map[string]int{"m": 5}}.WithDefaults()}); err != nil {
		t.Fatal(err)
	}
	stack := limitertest.New(t, limitertest.Options{Limiter: limiter.Options{Logger: logger, Pools: table}})
	a := newAPIOf(t, server.New(stack.Limiter, server.Options{Logger: logger})) // answers checked against the spec
	user := newUser(t)
	grant := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "three", Pools: map[string]string{"model": "m"}}), http.StatusOK)
	key, err := stack.Keys.PoolKey("model", "m")
	if err != nil {
		t.Fatal(err)
	}
	rdb, err := stack.Redis.Redis()
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(context.Background(), rdb.B().Del().Key(key).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Do(context.Background(), rdb.B().Set().Key(key).Value("foreign").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	slot := httpapi.HeartbeatRequest{UserID: user, Plan: "three", StreamID: grant.StreamID}
	wantError(t, a.post(t, httpapi.PathHeartbeat, slot), http.StatusInternalServerError, httpapi.CodeInternal)
	got := decode[httpapi.HeartbeatsResponse](t, a.post(t, httpapi.PathHeartbeats, httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{slot}}), http.StatusOK)
	if len(got.Results) != 1 || got.Results[0].Alive || got.Results[0].Degraded || got.Results[0].Error == nil || got.Results[0].Error.Code != httpapi.CodeInternal {
		t.Errorf("batch: %+v; want the slot not alive, not degraded, its error internal", got.Results)
	}
	if n := strings.Count(sink.String(), `"level":"ERROR"`); n < 1 || !strings.Contains(sink.String(), "WRONGTYPE") {
		t.Errorf("the heartbeats answered internal (Redis refused the pool key's script) logged %d ERROR lines naming it; log:\n%s", n, sink.String())
	}
}
