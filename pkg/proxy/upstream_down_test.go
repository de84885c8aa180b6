package proxy_test

import (
	"context"
	"log"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/testenv"
)

// TestABodyToAnUpstreamThatCannotBeReachedDoesNotPanic: a request with a
// body whose upstream refuses the connection is answered 502, and the
// connection serves the next request. In full duplex the transport
// closed the body after the handler had returned, and net/http panicked
// reading the next request ("invalid concurrent Body.Read call"),
// dropping the connection.
func TestABodyToAnUpstreamThatCannotBeReachedDoesNotPanic(t *testing.T) {
	logs := &testenv.Buffer{}
	e := newEnv(t, nil, envOptions{upstream: "http://127.0.0.1:1", serverLog: log.New(logs, "", 0)})
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	const n = 5
	for range n {
		req := e.request(t, context.Background(), "POST", "/v1/chat/completions", newUser(), "one", strings.NewReader(`{"model":"m","stream":true}`))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502 (the upstream refuses connections)", resp.StatusCode)
		}
	}
	e.proxy.Close() // every connection's goroutine done: its panic, if any, logged
	if strings.Contains(logs.String(), "panic") {
		t.Errorf("the proxy's server panicked:\n%.1500s", logs.String())
	}
}
