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
