package extproc_test

import (
	"slices"
	"strings"
	"testing"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/joishi/limiter/internal/envoytest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/extproc"
	"github.com/joishi/limiter/pkg/identity"
	"github.com/joishi/limiter/pkg/limiter"
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

// With identities from a verified JWT payload the user and plan headers
// name nobody: the grant sets them for the upstream to the user and plan
// the limiter counted, replacing the client's, with the stream id; a
// grant that waits for the body first removes the client's, as Envoy may
// forward the headers before it. With trusted headers the grant leaves
// them as they came.
func TestTheUpstreamReadsTheVerifiedIdentity(t *testing.T) {
	sources, err := identity.ParsePoolSources(map[string]string{"model": "body:model"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		identity identity.Options
		// user and plan: the configured header names, as Envoy holds them.
		user, plan string
		verified   bool
	}{
		{"a verified payload", identity.Options{Payload: &identity.Payload{PlanClaim: "plan"}}, "x-user-id", "x-plan", true},
		{"a verified payload, headers of other names", identity.Options{UserHeader: "X-Caller", PlanHeader: "X-Tier",
			Payload: &identity.Payload{PlanClaim: "plan"}}, "x-caller", "x-tier", true},
		{"trusted headers", identity.Options{}, "x-user-id", "x-plan", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, body := range []bool{false, true} {
				o := envOptions{identity: tc.identity}
				if tc.verified {
					o.extproc.PayloadKey = "jwt_payload"
				}
				if body {
					o.identity.Pools = sources
					o.stack = limitertest.Options{Limiter: limiter.Options{Pools: bodyTestPools(t)}}
					o.envoy.RequestBodyMode = filterv3.ProcessingMode_BUFFERED
				}
				e := newEnv(t, o)
				user := newUser()
				st := e.open(t)
				md, err := envoytest.JWTPayloadMetadata(extproc.DefaultPayloadNamespace, "jwt_payload", map[string]any{"sub": user, "plan": "one"})
				if err != nil {
					t.Fatal(err)
				}
				st.Metadata = md
				headers := []string{tc.user, user, tc.plan, "one"}
				if tc.verified {
					headers = []string{tc.user, "mallory", tc.plan, "three"} // the client's own say
				}
				resp, err := st.RequestHeaders(envoytest.RequestHeaders("/v1/chat/completions", headers...), false)
				if err != nil {
					t.Fatal(err)
				}
				mutation := resp.GetRequestHeaders().GetResponse().GetHeaderMutation()
				if body {
					if removed := mutation.GetRemoveHeaders(); tc.verified != (slices.Contains(removed, tc.user) && slices.Contains(removed, tc.plan)) {
						t.Errorf("body %v: the headers answer removes %q; want %s and %s removed: %v", body, removed, tc.user, tc.plan, tc.verified)
					}
					if resp, err = st.RequestBody([]byte(`{"model":"small"}`), true); err != nil {
						t.Fatal(err)
					}
					mutation = resp.GetRequestBody().GetResponse().GetHeaderMutation()
				}
				if id, ok := envoytest.HeaderValue(mutation, extproc.DefaultStreamIDHeader); !ok || id == "" {
					t.Fatalf("body %v: the grant sets no stream id: %v", body, resp)
				}
				gotUser, setUser := envoytest.HeaderValue(mutation, tc.user)
				gotPlan, setPlan := envoytest.HeaderValue(mutation, tc.plan)
				switch {
				case tc.verified && (gotUser != user || gotPlan != "one"):
					t.Errorf("body %v: the grant sets %s %q, %s %q; want %s, one: the user and plan counted", body, tc.user, gotUser, tc.plan, gotPlan, user)
				case !tc.verified && (setUser || setPlan):
					t.Errorf("body %v: the grant sets %s %q, %s %q; want them left as the client sent them", body, tc.user, gotUser, tc.plan, gotPlan)
				}
				if got := e.Used(t, user); got != 1 {
					t.Errorf("body %v: %s holds %d slots, want 1", body, user, got)
				}
			}
		})
	}
}
