package telemetry

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
