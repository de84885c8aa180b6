package telemetry

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
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
