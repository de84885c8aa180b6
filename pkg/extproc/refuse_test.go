package extproc_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/identity"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// At the limit Envoy is told to answer 429 itself, with Retry-After and
// the OpenAI-shaped body, and then closes the stream: nothing is held.
func TestLimitIsAnImmediateResponse(t *testing.T) {
	e := newEnv(t, envOptions{})
	user := newUser()
	holder := e.open(t)
	grant(t, holder, user, "one")

	st := e.open(t)
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "one"), false)
	if err != nil {
		t.Fatal(err)
	}
	ir, body := immediate(t, resp)
	if got := ir.GetStatus().GetCode(); got != 429 {
		t.Errorf("status %d, want 429", got)
	}
	retry, _ := envoytest.HeaderValue(ir.GetHeaders(), "retry-after")
	if n, err := strconv.Atoi(retry); err != nil || n < 1 || n > 10 {
		t.Errorf("retry-after %q, want 1-10 seconds (the slot's TTL is 10s)", retry)
	}
	if got, _ := envoytest.HeaderValue(ir.GetHeaders(), "x-should-retry"); got != "false" {
		t.Errorf("x-should-retry %q, want false", got)
	}
	if body.Error.Type != "rate_limit_error" || body.Error.Code != "stream_limit_reached" || body.Error.Message == "" {
		t.Errorf("body %+v, want type rate_limit_error, code stream_limit_reached and a message", body.Error)
	}
	if body.Error.Used == nil || *body.Error.Used != 1 || body.Error.Limit == nil || *body.Error.Limit != 1 || body.Error.RetryAfterMs == nil {
		t.Errorf("body %+v, want used 1, limit 1 and retry_after_ms", body.Error)
	}
	if ir.GetDetails() != "limiter_stream_limit_reached" {
		t.Errorf("details %q, want limiter_stream_limit_reached", ir.GetDetails())
	}
	st.Close()
	if got := e.Used(t, user); got != 1 {
		t.Errorf("the refused stream left the user with %d slots, want the first stream's 1", got)
	}
}

// The ext_proc server judges no path (Envoy's route table chose the
// request): a :path that the proxy refuses as naming no path it can judge
// (x:http:/v1/chat/completions) holds a slot here like any other, and
// counts against the same limit; it never passes uncounted.
func TestAnOpaquePathHoldsASlot(t *testing.T) {
	e := newEnv(t, envOptions{})
	user := newUser()
	holder := e.open(t)
	resp, err := holder.RequestHeaders(envoytest.RequestHeaders("x:http:/v1/chat/completions", "x-user-id", user, "x-plan", "one"), false)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := envoytest.HeaderValue(resp.GetRequestHeaders().GetResponse().GetHeaderMutation(), extproc.DefaultStreamIDHeader); !ok {
		t.Fatalf(":path x:http:/v1/chat/completions answered %v, want a grant", resp)
	}
	st := e.open(t)
	resp, err = st.RequestHeaders(envoytest.RequestHeaders("http:http:/v1/chat/completions", "x-user-id", user, "x-plan", "one"), false)
	if err != nil {
		t.Fatal(err)
	}
	if ir, body := immediate(t, resp); ir.GetStatus().GetCode() != 429 || body.Error.Code != "stream_limit_reached" {
		t.Errorf(":path http:http:/v1/chat/completions at the limit: got %d %s, want 429 stream_limit_reached", ir.GetStatus().GetCode(), body.Error.Code)
	}
	if got := e.Used(t, user); got != 1 {
		t.Errorf("%d slots held, want 1", got)
	}
}

func TestRefusals(t *testing.T) {
	e := newEnv(t, envOptions{callers: "envoy " + envoyToken + " one,closed,nosuch\n"})
	for _, tt := range []struct {
		name     string
		headers  []string
		status   int32
		code     string
		typeName string
	}{
		{"no identity", nil, 401, "unauthenticated", "invalid_request_error"},
		{"plan outside the caller's plans", []string{"x-user-id", newUser(), "x-plan", "three"}, 403, "plan_not_allowed", "invalid_request_error"},
		{"plan the tiers do not know", []string{"x-user-id", newUser(), "x-plan", "nosuch"}, 422, "unknown_plan", "invalid_request_error"},
		{"user id with a brace", []string{"x-user-id", "a}b", "x-plan", "one"}, 400, "invalid_user_id", "invalid_request_error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := e.open(t)
			resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", tt.headers...), false)
			if err != nil {
				t.Fatal(err)
			}
			ir, body := immediate(t, resp)
			if int32(ir.GetStatus().GetCode()) != tt.status || body.Error.Code != tt.code || body.Error.Type != tt.typeName {
				t.Errorf("got %d %s/%s (%s), want %d %s/%s", ir.GetStatus().GetCode(), body.Error.Type, body.Error.Code, body.Error.Message, tt.status, tt.typeName, tt.code)
			}
		})
	}
}

// Envoy authenticates as a caller of the API tokens file: a stream
// without its token, or with another, is refused before any message.
func TestEnvoyMustAuthenticate(t *testing.T) {
	e := newEnv(t, envOptions{callers: "envoy " + envoyToken + " *\n"})
	for _, token := range []string{"", "wrong-token-0123456789abcdef"} {
		bad, err := envoytest.Dial(e.addr, envoytest.Options{Token: token, MessageTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		st, err := bad.Open(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", newUser(), "x-plan", "one"), false)
		if status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
			t.Errorf("token %q: got %v, want Unauthenticated", token, err)
		}
		st.Close()
		_ = bad.Close()
	}
	grant(t, e.open(t), newUser(), "one") // the configured token works

	// Two authorization values, the configured one among them: which one
	// names the caller is not guessed.
	for _, other := range []string{"Bearer wrong-token-0123456789abcdef", "Bearer " + envoyToken} {
		two, err := envoytest.Dial(e.addr, envoytest.Options{Token: envoyToken, MessageTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		st, err := two.Open(metadata.AppendToOutgoingContext(context.Background(), "authorization", other))
		if err != nil {
			t.Fatal(err)
		}
		_, err = st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", newUser(), "x-plan", "one"), false)
		if status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
			t.Errorf("the token and %q: got %v, want Unauthenticated", other, err)
		}
		st.Close()
		_ = two.Close()
	}
}

// A verified JWT payload in the dynamic metadata (jwt_authn's
// payload_in_metadata) decides the identity; the user and plan headers
// are not trusted beside it.
func TestIdentityFromJWTPayloadMetadata(t *testing.T) {
	e := newEnv(t, envOptions{
		identity: identity.Options{Payload: &identity.Payload{PlanClaim: "plan"}},
		extproc:  extproc.Options{PayloadKey: "jwt_payload"},
	})
	user := newUser()
	st := e.open(t)
	md, err := envoytest.JWTPayloadMetadata(extproc.DefaultPayloadNamespace, "jwt_payload", map[string]any{"sub": user, "plan": "one"})
	if err != nil {
		t.Fatal(err)
	}
	st.Metadata = md
	resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", "someone-else", "x-plan", "three"), false)
	if err != nil || resp.GetRequestHeaders() == nil {
		t.Fatalf("request_headers: %v, %v; want CONTINUE", resp, err)
	}
	if got := e.Used(t, user); got != 1 {
		t.Errorf("the payload's user holds %d slots, want 1", got)
	}
	if got := e.Used(t, "someone-else"); got != 0 {
		t.Errorf("the header's user holds %d slots, want 0", got)
	}
	// Without the metadata there is no identity.
	bare := e.open(t)
	resp, err = bare.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", user, "x-plan", "one"), false)
	if err != nil {
		t.Fatal(err)
	}
	if ir, _ := immediate(t, resp); ir.GetStatus().GetCode() != 401 {
		t.Errorf("no payload: got %d, want 401", ir.GetStatus().GetCode())
	}
}

// Redis not answering: an Open plan continues (degraded, counted), a
// Closed plan is refused 503 with Retry-After.
func TestOutageFollowsTheTiersFailureMode(t *testing.T) {
	path := testenv.StartProxy(t, testenv.Redis(t))
	e := newEnv(t, envOptions{stack: limitertest.Options{Redis: cluster.Options{Addrs: []string{path.Addr()}, Timeout: 200 * time.Millisecond}}})
	path.BlackHole()
	open := e.open(t)
	mustContinue(t)(open.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", newUser(), "x-plan", "one"), false))
	closed := e.open(t)
	resp, err := closed.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", "x-user-id", newUser(), "x-plan", "closed"), false)
	if err != nil {
		t.Fatal(err)
	}
	ir, body := immediate(t, resp)
	if ir.GetStatus().GetCode() != 503 || body.Error.Code != "limiter_unavailable" {
		t.Errorf("Closed plan during an outage: %d %s, want 503 limiter_unavailable", ir.GetStatus().GetCode(), body.Error.Code)
	}
	if got, _ := envoytest.HeaderValue(ir.GetHeaders(), "retry-after"); got != "1" {
		t.Errorf("retry-after %q, want 1", got)
	}
	path.Restore()
}
