package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/servetest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/httpapi"
)

const routeTiers = `    - plan: one
      maxConcurrentStreams: 1
      slotTTL: 30s
      heartbeatInterval: 5s
    - plan: closed
      maxConcurrentStreams: 1
      failureMode: Closed
`

// routeCase is one request to a running serve process and the answer the
// contract promises.
type routeCase struct {
	name         string
	method, path string
	body         string
	contentType  string // of the body; default application/json
	invalid      bool   // deliberately outside the spec's request schema
	status       int
	code         string // error code, for error answers
	check        func(t *testing.T, header http.Header, body []byte)
}

func runRoutes(t *testing.T, base string, hc *http.Client, cases []routeCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, base+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
				if tc.contentType != "" {
					req.Header.Set("Content-Type", tc.contentType)
				}
			}
			if tc.invalid {
				req = apitest.Invalid(req)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var raw json.RawMessage
			_ = json.NewDecoder(resp.Body).Decode(&raw)
			if resp.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d; body %s", resp.StatusCode, tc.status, raw)
			}
			if tc.code != "" {
				var e httpapi.ErrorResponse
				if err := json.Unmarshal(raw, &e); err != nil || e.Error.Code != tc.code {
					t.Fatalf("error code = %q (%v), want %q; body %s", e.Error.Code, err, tc.code, raw)
				}
			}
			if tc.check != nil {
				tc.check(t, resp.Header, raw)
			}
		})
	}
}

// TestEveryRouteThroughServe sends every route and provokes every error
// code of the API through a real `limiter serve` process, on standalone
// Redis and on Redis Cluster, validating each request and answer against
// api/openapi.yaml.
func TestEveryRouteThroughServe(t *testing.T) {
	for _, backend := range redisBackends {
		t.Run(backend.name, func(t *testing.T) {
			run := randomID()
			proc := servetest.Start(t, servetest.Options{Config: serveConfig(backend.redis(t), "e2e-"+run+":", routeTiers), AwaitRedis: true})
			hc := &http.Client{Transport: apitest.ValidatingTransport(t, http.DefaultTransport)}
			user := "routes-" + run
			slot := `{"user_id":"` + user + `","plan":"one","stream_id":"s1"}`
			runRoutes(t, proc.API, hc, []routeCase{
				{name: "acquire grants", method: "POST", path: httpapi.PathAcquire, body: slot, status: 200,
					check: func(t *testing.T, _ http.Header, body []byte) {
						var res httpapi.AcquireResponse
						_ = json.Unmarshal(body, &res)
						if !res.Granted || res.Used != 1 || res.Limit != 1 || res.TTLMs != 30000 || res.HeartbeatIntervalMs != 5000 {
							t.Errorf("acquire = %+v", res)
						}
					}},
				{name: "acquire over the limit is 429 with Retry-After", method: "POST", path: httpapi.PathAcquire,
					body: `{"user_id":"` + user + `","plan":"one","stream_id":"s2"}`, status: 429, code: httpapi.CodeStreamLimitReached,
					check: func(t *testing.T, h http.Header, body []byte) {
						var e httpapi.ErrorResponse
						_ = json.Unmarshal(body, &e)
						if h.Get("Retry-After") != "30" || e.Error.RetryAfterMs == nil || *e.Error.RetryAfterMs > 30000 || *e.Error.Used != 1 || *e.Error.Limit != 1 {
							t.Errorf("Retry-After %q, error %+v", h.Get("Retry-After"), e.Error)
						}
					}},
				{name: "an unknown field is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"u","plan":"one","x":1}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
				{name: "a body over 64 KiB is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + strings.Repeat("a", 70<<10) + `","plan":"one"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
				{name: "a number for plan is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"u","plan":1}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
				{name: "invalid UTF-8 is invalid_request", method: "POST", path: httpapi.PathAcquire, body: "{\"user_id\":\"u\xff\",\"plan\":\"one\"}", invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
				{name: "a heartbeat with an unknown field is invalid_request", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"u","plan":"one","stream_id":"s","x":1}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
				{name: "a heartbeat with a bad stream id is invalid_stream_id", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"u","plan":"one","stream_id":"a b"}`, invalid: true, status: 400, code: httpapi.CodeInvalidStreamID},
				{name: "a batch of 1001 slots is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":[` + strings.TrimSuffix(strings.Repeat(`{"user_id":"u","plan":"one","stream_id":"s"},`, 1001), ",") + `]}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
				{name: "a brace in the user id is invalid_user_id", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"a}b","plan":"one"}`, invalid: true, status: 400, code: httpapi.CodeInvalidUserID},
				{name: "a slash in the stream id is invalid_stream_id", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"u","plan":"one","stream_id":"a/b"}`, invalid: true, status: 400, code: httpapi.CodeInvalidStreamID},
				{name: "an unknown plan is 422", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"u","plan":"gold"}`, status: 422, code: httpapi.CodeUnknownPlan},
				{name: "heartbeat keeps a held slot", method: "POST", path: httpapi.PathHeartbeat, body: slot, status: 200},
				{name: "heartbeat on a missing slot is 410", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"` + user + `","plan":"one","stream_id":"nope"}`, status: 410, code: httpapi.CodeSlotLost},
				{name: "heartbeat naming an unknown plan keeps a held slot by its own TTL", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"` + user + `","plan":"gold","stream_id":"s1"}`, status: 200},
				{name: "heartbeat naming an unknown plan on a missing slot is 410", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"u","plan":"gold","stream_id":"s"}`, status: 410, code: httpapi.CodeSlotLost},
				{name: "a batch answers each slot in order", method: "POST", path: httpapi.PathHeartbeats,
					body: `{"slots":[` + slot + `,{"user_id":"` + user + `","plan":"one","stream_id":"nope"},{"user_id":"a b","plan":"one","stream_id":"s"}]}`, invalid: true, status: 200,
					check: func(t *testing.T, _ http.Header, body []byte) {
						var res httpapi.HeartbeatsResponse
						_ = json.Unmarshal(body, &res)
						r := res.Results
						if len(r) != 3 || !r[0].Alive || r[1].Alive || r[1].Error != nil || r[2].Error == nil || r[2].Error.Code != httpapi.CodeInvalidUserID {
							t.Errorf("batch results = %s", body)
						}
					}},
				{name: "an empty batch is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":[]}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
				{name: "a cross-site text/plain release is 415 and frees nothing", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"` + user + `","stream_id":"s1"}`,
					contentType: "text/plain;charset=UTF-8", invalid: true, status: 415, code: httpapi.CodeUnsupportedMediaType},
				{name: "release frees a held slot", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"` + user + `","stream_id":"s1"}`, status: 200,
					check: func(t *testing.T, _ http.Header, body []byte) {
						if !strings.Contains(string(body), `"released":true`) {
							t.Errorf("release = %s", body)
						}
					}},
				{name: "release again is not an error", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"` + user + `","stream_id":"s1"}`, status: 200,
					check: func(t *testing.T, _ http.Header, body []byte) {
						if !strings.Contains(string(body), `"released":false`) {
							t.Errorf("second release = %s", body)
						}
					}},
				{name: "release with a bad user id is 400", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"","stream_id":"s1"}`, invalid: true, status: 400, code: httpapi.CodeInvalidUserID},
				{name: "tiers lists the plans", method: "GET", path: httpapi.PathTiers, status: 200,
					check: func(t *testing.T, _ http.Header, body []byte) {
						var res httpapi.TiersResponse
						_ = json.Unmarshal(body, &res)
						if len(res.Tiers) != 2 || res.Tiers[0].Plan != "closed" || res.Tiers[1].Plan != "one" || res.Tiers[0].FailureMode != "Closed" {
							t.Errorf("tiers = %s", body)
						}
					}},
				{name: "an unknown route is 404", method: "GET", path: "/v1/nothing", invalid: true, status: 404, code: httpapi.CodeNotFound},
				{name: "a wrong method is 405", method: "GET", path: httpapi.PathAcquire, invalid: true, status: 405, code: httpapi.CodeMethodNotAllowed},
			})
		})
	}

	t.Run("redis unreachable", func(t *testing.T) {
		proc := servetest.Start(t, servetest.Options{Config: serveConfig([]string{testenv.BlackHole(t)}, "e2e:", routeTiers)})
		hc := &http.Client{Transport: apitest.ValidatingTransport(t, http.DefaultTransport)}
		runRoutes(t, proc.API, hc, []routeCase{
			{name: "a Closed plan is 503", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"u","plan":"closed"}`, status: 503, code: httpapi.CodeUnavailable},
			{name: "an Open plan grants degraded", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"u","plan":"one"}`, status: 200,
				check: func(t *testing.T, _ http.Header, body []byte) {
					if !strings.Contains(string(body), `"degraded":true`) {
						t.Errorf("acquire = %s, want degraded", body)
					}
				}},
			{name: "an Open heartbeat answers degraded", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"u","plan":"one","stream_id":"s"}`, status: 200,
				check: func(t *testing.T, _ http.Header, body []byte) {
					if !strings.Contains(string(body), `"alive":true`) || !strings.Contains(string(body), `"degraded":true`) {
						t.Errorf("heartbeat = %s, want alive and degraded", body)
					}
				}},
			{name: "a release answers degraded", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"u","stream_id":"s"}`, status: 200,
				check: func(t *testing.T, _ http.Header, body []byte) {
					if !strings.Contains(string(body), `"degraded":true`) {
						t.Errorf("release = %s, want degraded", body)
					}
				}},
			{name: "a Closed heartbeat is 503", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"u","plan":"closed","stream_id":"s"}`, status: 503, code: httpapi.CodeUnavailable},
			{name: "a batch of Closed slots is 503", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":[{"user_id":"u","plan":"closed","stream_id":"s"}]}`, status: 503, code: httpapi.CodeUnavailable},
		})
		if status, body := servetest.Get(proc.Ops + "/readyz"); status != 200 {
			t.Errorf("readyz with Redis unreachable = %d %s, want 200 (readiness never depends on Redis)", status, body)
		}
	})
}
