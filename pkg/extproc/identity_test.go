package extproc_test

import (
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/envoytest"
)

// An identity header that Envoy's header map holds more than once (a
// route's request_headers_to_add appending to the client's value, say) is
// refused with an ImmediateResponse 400 ambiguous_identity naming it, and
// takes no slot; once, the stream is granted.
func TestARepeatedIdentityHeaderIsRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	user := newUser()
	for _, tc := range []struct {
		name    string
		headers []string
		named   string
	}{
		{"the user header twice with the same value", []string{"x-user-id", user, "x-user-id", user, "x-plan", "one"}, "X-User-Id"},
		{"the user header twice with different values", []string{"x-user-id", "mallory", "x-user-id", user, "x-plan", "one"}, "X-User-Id"},
		{"the user header twice, its names in different case", []string{"x-user-id", user, "X-User-Id", "mallory", "x-plan", "one"}, "X-User-Id"},
		{"the plan header twice with the same value", []string{"x-user-id", user, "x-plan", "one", "x-plan", "one"}, "X-Plan"},
		{"the plan header twice with different values", []string{"x-user-id", user, "x-plan", "three", "x-plan", "one"}, "X-Plan"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := envoytest.RequestHeaders("/v1/chat/completions")
			for i := 0; i+1 < len(tc.headers); i += 2 {
				// Headers lower-cases names; keep the case given.
				more := envoytest.Headers(tc.headers[i], tc.headers[i+1]).GetHeaders()[0]
				more.Key = tc.headers[i]
				h.Headers = append(h.Headers, more)
			}
			resp, err := e.open(t).RequestHeaders(h, false)
			if err != nil {
				t.Fatal(err)
			}
			ir, body := immediate(t, resp)
			if ir.GetStatus().GetCode() != 400 || body.Error.Code != "ambiguous_identity" || body.Error.Type != "invalid_request_error" ||
				!strings.Contains(body.Error.Message, "header "+tc.named) || !strings.Contains(body.Error.Message, "more than once") {
				t.Errorf("got %d %s/%s (%s), want 400 invalid_request_error/ambiguous_identity saying header %s came more than once",
					ir.GetStatus().GetCode(), body.Error.Type, body.Error.Code, body.Error.Message, tc.named)
			}
			if ir.GetDetails() != "limiter_ambiguous_identity" {
				t.Errorf("details %q, want limiter_ambiguous_identity", ir.GetDetails())
			}
		})
	}
	for _, u := range []string{user, "mallory"} {
		if got := e.Used(t, u); got != 0 {
			t.Errorf("user %s holds %d slots after the refusals, want 0", u, got)
		}
	}
	if got := e.Metric(t, `limiter_streams_refused_total{mode="extproc",reason="identity"}`); got != "5" {
		t.Errorf(`refused_total{reason="identity"}: got %q, want 5`, got)
	}
	grant(t, e.open(t), user, "one") // each once
}
