package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"
)

// TestAnUpstreamThatAnswersBeforeTheBodyIsSentCompletesTheStream: an
// upstream that refuses a request (401) before reading its body, while
// the client is still sending it, ends the stream complete: the client
// reads the whole answer and stays. Cutting the upload still under way
// (the handler's end) cancels the request's context, which the stream's
// end was read from after it, and counted client_gone, a client that went
// away.
func TestAnUpstreamThatAnswersBeforeTheBodyIsSentCompletesTheStream(t *testing.T) {
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":{"message":"bad key"}}`)
	}), envOptions{})
	user := newUser()
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 64 {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = pw.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp := e.do(t, e.request(t, ctx, http.MethodPost, "/v1/chat/completions", user, "three", pr))
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || string(body) != `{"error":{"message":"bad key"}}` {
		t.Fatalf("answer: %d %s, want the upstream's 401", resp.StatusCode, body)
	}
	e.AwaitUsed(t, user, 0, 3*time.Second)
	if got := e.Metric(t, `limiter_streams_held_total{end="complete",mode="proxy"}`); got != "1" {
		t.Errorf(`limiter_streams_held_total{end="complete"} = %q, want 1`, got)
	}
	if got := e.Metric(t, `limiter_streams_held_total{end="client_gone",mode="proxy"}`); got != "" && got != "0" {
		t.Errorf(`limiter_streams_held_total{end="client_gone"} = %q, want none: the client read the whole answer`, got)
	}
}
