package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/proxytest"
)

// rawProxyRequest sends method target to the server at base exactly as
// written (proxytest.RawRequest), with header and a streaming chat
// completion of model as the body. The caller closes the answer's body.
func rawProxyRequest(t *testing.T, base, method, target, model string, header http.Header) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, model)
	return proxytest.RawRequest(t, strings.TrimPrefix(base, "http://"), method, target, header, body)
}

// A free user (limit 1) holding one stream through `limiter proxy` with
// routes [/v1/chat/completions] cannot open another by spelling the route
// differently: each spelling, sent as written, is refused 429 and never
// reaches the upstream. Paths that only look alike pass through, and once
// the stream ends another spelling streams (the limit, not the spelling,
// decided).
func TestRouteSpellingsCannotEscapeTheProxysCap(t *testing.T) {
	e := startProxy(t, "")
	user := "spell-" + randomID()
	data := e.holdStream(t, user, "free", "the held stream's first chunk")
	before := e.llm.requests.Load()

	header := http.Header{"X-User-Id": {user}, "X-Plan": {"free"}}
	for _, tc := range []struct{ name, target string }{
		{"a doubled slash at the start", "//v1/chat/completions"},
		{"a dot-dot out of another directory", "/x/../v1/chat/completions"},
		{"a dot segment", "/v1/chat/./completions"},
		{"dot-dot above the root", "/../v1/chat/completions"},
		{"doubled slashes inside", "/v1//chat//completions"},
		{"encoded slashes", "/v1%2Fchat%2Fcompletions"},
		{"an encoded dot-dot", "/v1/x/%2e%2e/chat/completions"},
		{"a trailing slash", "/v1/chat/completions/"},
		{"upper case", "/V1/Chat/Completions"},
		{"a query string", "/v1/chat/completions?stream=true"},
		{"backslashes", `/v1\chat\completions`},
		{"a path parameter", "/v1/chat/completions;a=b"},
		{"a trailing dot", "/v1/chat/completions."},
		{"an encoded final newline", "/v1/chat/completions%0A"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := rawProxyRequest(t, e.proc.API, "POST", tc.target, "fast", header)
			if resp.StatusCode != http.StatusTooManyRequests {
				// Not the body: a stream that got through would be drained;
				// the cleanup closes the connection.
				t.Fatalf("POST %s while the user holds its one slot: status %d, want 429", tc.target, resp.StatusCode)
			}
			if body := decodeProxyError(t, resp); body.Error.Code != "stream_limit_reached" {
				t.Errorf("POST %s: code %q, want stream_limit_reached", tc.target, body.Error.Code)
			}
		})
	}
	if got := e.llm.requests.Load(); got != before {
		t.Errorf("the upstream received %d of the refused requests, want none", got-before)
	}
	if n := e.used(t, user); n != 1 {
		t.Errorf("the user holds %d slots, want 1", n)
	}

	t.Run("paths that only look alike pass through", func(t *testing.T) {
		for _, target := range []string{"/v1/chat/completionsX", "/v1/models/org%2Fmodel"} {
			resp := rawProxyRequest(t, e.proc.API, "POST", target, "fast", nil)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("POST %s without identity: status %d, want 200 from the upstream", target, resp.StatusCode)
			}
		}
	})

	e.llm.Release()
	for range data {
	}
	e.awaitUsed(t, user, 0, 3*time.Second)
	resp := rawProxyRequest(t, e.proc.API, "POST", "/x/../v1/chat/completions", "fast", header)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), "[DONE]") {
		t.Errorf("another spelling once the stream ended: status %d, body %q; want the stream", resp.StatusCode, got)
	}
	e.awaitUsed(t, user, 0, 3*time.Second)
}
