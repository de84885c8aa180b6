package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// An identity header that comes more than once (a hop in front appended
// its value to the client's instead of replacing it) is refused with 400
// ambiguous_identity naming the header, before any slot and before the
// upstream; once, it is used.
func TestARepeatedIdentityHeaderIsRefused(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{})
	user := newUser()
	cases := []struct {
		name   string
		header http.Header
		named  string
	}{
		{"the user header twice with the same value", http.Header{"X-User-Id": {user, user}, "X-Plan": {"one"}}, "X-User-Id"},
		{"the user header twice with different values", http.Header{"X-User-Id": {"mallory", user}, "X-Plan": {"one"}}, "X-User-Id"},
		{"the user header three times", http.Header{"X-User-Id": {user, user, user}, "X-Plan": {"one"}}, "X-User-Id"},
		{"the plan header twice with the same value", http.Header{"X-User-Id": {user}, "X-Plan": {"one", "one"}}, "X-Plan"},
		{"the plan header twice with different values", http.Header{"X-User-Id": {user}, "X-Plan": {"three", "one"}}, "X-Plan"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := e.request(t, context.Background(), "POST", "/v1/chat/completions", "", "", strings.NewReader(`{"stream":true}`))
			for k, v := range tc.header {
				req.Header[k] = v
			}
			resp := e.do(t, req)
			if resp.StatusCode != http.StatusBadRequest {
				resp.Body.Close()
				t.Fatalf("status %d, want 400", resp.StatusCode)
			}
			body := decodeError(t, resp)
			if body.Error.Code != "ambiguous_identity" || body.Error.Type != "invalid_request_error" ||
				!strings.Contains(body.Error.Message, "header "+tc.named) || !strings.Contains(body.Error.Message, "more than once") {
				t.Errorf("body %+v, want invalid_request_error / ambiguous_identity saying header %s came more than once", body.Error, tc.named)
			}
		})
	}
	e.checkRefused(t, up, user, 0, "identity", 5)

	// Each header once: the stream is granted.
	resp := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", strings.NewReader(`{"stream":true}`)))
	defer resp.Body.Close()
	<-up.started
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("each header once: status %d, want 200", resp.StatusCode)
	}
	close(up.tokens)
}
