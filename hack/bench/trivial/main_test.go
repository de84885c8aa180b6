package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/keys"
	"github.com/joishi/limiter/pkg/lua"
)

// TestTheReferenceRunsTheLimitersScripts: the benchmark's reference
// answers the acquire and release scripts as they are today (it read a
// script's answer of the length it had once, and make bench failed on
// its first request): a limit of 1 grants, refuses, and grants again
// after the release.
func TestTheReferenceRunsTheLimitersScripts(t *testing.T) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{testenv.Redis(t)}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sources := lua.Sources()
	h := &handler{redis: c, acquire: rueidis.NewLuaScript(sources["acquire"]), release: rueidis.NewLuaScript(sources["release"]),
		prefix: "trivial-test:" + keys.NewStreamID()[:12] + ":", limit: "1", ttl: "10000"}
	srv := httptest.NewServer(h.mux())
	defer srv.Close()
	post := func(path, body string) int {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, step := range []struct {
		path, body string
		want       int
	}{
		{httpapi.PathAcquire, `{"user_id":"u","stream_id":"s1"}`, http.StatusOK},
		{httpapi.PathAcquire, `{"user_id":"u","stream_id":"s2"}`, http.StatusTooManyRequests},
		{httpapi.PathRelease, `{"user_id":"u","stream_id":"s1"}`, http.StatusOK},
		{httpapi.PathAcquire, `{"user_id":"u","stream_id":"s2"}`, http.StatusOK},
	} {
		if got := post(step.path, step.body); got != step.want {
			t.Fatalf("step %d, %s %s: %d, want %d", i+1, step.path, step.body, got, step.want)
		}
	}
}
