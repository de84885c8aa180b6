package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/joishi/limiter/internal/apitest"
	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/internal/testenv"
	"github.com/joishi/limiter/pkg/cluster"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
	"github.com/joishi/limiter/pkg/server"
	"github.com/joishi/limiter/pkg/tiers"
)

// api is the API listener of a server, served in-process, and a client
// whose every exchange is validated against api/openapi.yaml.
type api struct {
	url    string
	client *http.Client
}

// unreachable returns a limiter whose Redis never answers.
func unreachable(t *testing.T) *limiter.Limiter {
	t.Helper()
	return limitertest.New(t, limitertest.Options{Redis: cluster.Options{Addrs: []string{testenv.BlackHole(t)}}, NoWait: true}).Limiter
}

func newAPI(t *testing.T, lim *limiter.Limiter) *api {
	t.Helper()
	return newAPIOf(t, server.New(lim, server.Options{}))
}

// newAPIOf is newAPI for a Server built by the test.
func newAPIOf(t *testing.T, s *server.Server) *api {
	t.Helper()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &api{url: srv.URL, client: &http.Client{Transport: apitest.ValidatingTransport(t, srv.Client().Transport), Timeout: 10 * time.Second}}
}

// reply is an answer of the API.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// call sends method path with body (JSON, or nothing when empty). invalid
// marks a request deliberately outside the spec (its answer is still
// validated).
func (a *api) call(t *testing.T, method, path string, body []byte, invalid bool) reply {
	t.Helper()
	return a.callWith(t, method, path, body, invalid, nil)
}

// callWith is call with header added to the request.
func (a *api) callWith(t *testing.T, method, path string, body []byte, invalid bool, header http.Header) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, a.url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		if v == nil {
			req.Header.Del(k)
			continue
		}
		req.Header[k] = v
	}
	if invalid {
		apitest.Invalid(req)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// post sends v as JSON to path.
func (a *api) post(t *testing.T, path string, v any) reply {
	t.Helper()
	return a.call(t, http.MethodPost, path, mustJSON(t, v), false)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decode unmarshals r's body into a new T, failing the test on a status
// other than want.
func decode[T any](t *testing.T, r reply, want int) T {
	t.Helper()
	return apitest.Decode[T](t, apitest.Reply{Status: r.status, Body: r.body}, want)
}

// wantError checks that r is an error answer with status and code.
func wantError(t *testing.T, r reply, status int, code string) httpapi.Error {
	t.Helper()
	return apitest.WantError(t, apitest.Reply{Status: r.status, Body: r.body}, status, code)
}

// logSink collects log output for assertions.
type logSink = testenv.Buffer

// newUser returns a user id no other test uses.
func newUser(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "u-" + hex.EncodeToString(b[:])
}

func TestOpenAPISpecIsValid(t *testing.T) {
	doc := apitest.Spec(t) // validated on load; validate again explicitly
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("api/openapi.yaml: got %v, want a valid OpenAPI document", err)
	}
	for _, path := range []string{httpapi.PathAcquire, httpapi.PathHeartbeat, httpapi.PathHeartbeats, httpapi.PathRelease, httpapi.PathTiers} {
		if doc.Paths.Value(path) == nil {
			t.Errorf("api/openapi.yaml paths: got no %s, want it (pkg/httpapi serves it)", path)
		}
	}
}

func TestAPIAcquire(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{}).Limiter)

	t.Run("a new stream is granted with a generated stream id", func(t *testing.T) {
		start := time.Now()
		got := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: newUser(t), Plan: "three"}), http.StatusOK)
		if !got.Granted || got.Used != 1 || got.Limit != 3 || got.Degraded || len(got.StreamID) != 32 {
			t.Errorf("got %+v, want granted, used 1, limit 3, not degraded, a 32-character stream id", got)
		}
		if got.TTLMs != 10_000 || got.HeartbeatIntervalMs != 1_000 {
			t.Errorf("ttl_ms, heartbeat_interval_ms: got %d, %d, want 10000, 1000", got.TTLMs, got.HeartbeatIntervalMs)
		}
		if lo, hi := start.Add(9*time.Second), time.Now().Add(11*time.Second); got.ExpiresAt.Before(lo) || got.ExpiresAt.After(hi) {
			t.Errorf("expires_at: got %v, want within [%v, %v]", got.ExpiresAt, lo, hi)
		}
	})

	t.Run("acquiring a held stream id again is idempotent", func(t *testing.T) {
		user := newUser(t)
		for i := range 2 {
			got := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "one", StreamID: "chat-1"}), http.StatusOK)
			if !got.Granted || got.Used != 1 || got.StreamID != "chat-1" {
				t.Errorf("acquire #%d: got %+v, want granted chat-1 with used 1", i+1, got)
			}
		}
	})

	t.Run("a stream over the limit is 429 stream_limit_reached with Retry-After", func(t *testing.T) {
		user := newUser(t)
		decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "one", StreamID: "first"}), http.StatusOK)
		r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "one", StreamID: "second"})
		e := wantError(t, r, http.StatusTooManyRequests, httpapi.CodeStreamLimitReached)
		checkLimitReached(t, r, e, 1, 1)
		if ms := *e.RetryAfterMs; ms <= 0 || ms > 10_000 {
			t.Errorf("retry_after_ms: got %d, want in (0, 10000] (the first slot's remaining TTL)", ms)
		}
	})

	t.Run("a plan of 0 streams is 429 with Retry-After at least 1", func(t *testing.T) {
		r := a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: newUser(t), Plan: "none"})
		e := wantError(t, r, http.StatusTooManyRequests, httpapi.CodeStreamLimitReached)
		checkLimitReached(t, r, e, 0, 0)
	})
}

// checkLimitReached checks the fields of a 429 and its Retry-After header.
func checkLimitReached(t *testing.T, r reply, e httpapi.Error, used, limit int) {
	t.Helper()
	if e.Used == nil || e.Limit == nil || e.RetryAfterMs == nil {
		t.Fatalf("429 error: got %+v, want used, limit and retry_after_ms", e)
	}
	if *e.Used != used || *e.Limit != limit {
		t.Errorf("used, limit: got %d, %d, want %d, %d", *e.Used, *e.Limit, used, limit)
	}
	header := r.header.Get("Retry-After")
	secs, err := strconv.ParseInt(header, 10, 64)
	if err != nil {
		t.Fatalf("Retry-After: got %q, want whole seconds", header)
	}
	want := max(1, (*e.RetryAfterMs+999)/1000)
	if secs != want || secs < 1 {
		t.Errorf("Retry-After: got %d, want %d (ceil(retry_after_ms %d / 1000), at least 1)", secs, want, *e.RetryAfterMs)
	}
}

func TestAPISlotLifecycle(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{}).Limiter)
	user := newUser(t)
	acq := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "three", StreamID: "s-1"}), http.StatusOK)

	time.Sleep(20 * time.Millisecond)
	hb := decode[httpapi.HeartbeatResponse](t, a.post(t, httpapi.PathHeartbeat, httpapi.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "s-1"}), http.StatusOK)
	if !hb.Alive || hb.Degraded || !hb.ExpiresAt.After(acq.ExpiresAt) {
		t.Errorf("heartbeat: got %+v, want alive, not degraded, expiring after %v", hb, acq.ExpiresAt)
	}

	for i, want := range []bool{true, false} {
		got := decode[httpapi.ReleaseResponse](t, a.post(t, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: "s-1"}), http.StatusOK)
		if got.Released != want || got.Degraded {
			t.Errorf("release #%d: got %+v, want released %v, not degraded", i+1, got, want)
		}
	}

	r := a.post(t, httpapi.PathHeartbeat, httpapi.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "s-1"})
	wantError(t, r, http.StatusGone, httpapi.CodeSlotLost)
}

func TestAPIErrors(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{}).Limiter)
	user := newUser(t)
	slot := func(user, plan, stream string) map[string]string {
		return map[string]string{"user_id": user, "plan": plan, "stream_id": stream}
	}
	batch := func(n int) []byte {
		slots := make([]map[string]string, n)
		for i := range slots {
			slots[i] = slot(user, "three", fmt.Sprintf("s-%d", i))
		}
		return []byte(fmt.Sprintf(`{"slots":%s}`, mustJSON(t, slots)))
	}
	long := strings.Repeat("a", httpapi.MaxBodyBytes)

	for _, tc := range []struct {
		name         string
		method, path string
		body         string
		invalid      bool // deliberately outside the spec
		status       int
		code         string
		allow        string // Allow header of a 405
	}{
		{name: "an unknown field is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + user + `","plan":"three","priority":1}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a known field name in another case is an unknown field", method: "POST", path: httpapi.PathAcquire, body: `{"USER_ID":"` + user + `","plan":"three"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a number for user_id is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":42,"plan":"three"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a string for slots is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":"all"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a body over 64 KiB is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + long + `","plan":"three"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "invalid UTF-8 bytes are invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"u-` + "\xff\xfe" + `","plan":"three"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a second JSON value after the object is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + user + `","plan":"three"} {}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a stray closing brace after the object is invalid_request", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"` + user + `","stream_id":"s"}}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a field given twice is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + user + `","user_id":"other","plan":"three"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a batch slot with a field in another case is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":[{"user_id":"` + user + `","Plan":"three","stream_id":"s"}]}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a null body is invalid_request", method: "POST", path: httpapi.PathRelease, body: `null`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a heartbeat without plan is invalid_request", method: "POST", path: httpapi.PathHeartbeat, body: `{"user_id":"` + user + `","stream_id":"s"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "an empty body is invalid_request", method: "POST", path: httpapi.PathAcquire, body: ``, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a blank body is invalid_request", method: "POST", path: httpapi.PathHeartbeat, body: " \n", invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "truncated JSON is invalid_request", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a JSON array body is invalid_request", method: "POST", path: httpapi.PathRelease, body: `[]`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "an acquire without plan is invalid_request", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + user + `"}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "an empty user id is invalid_user_id", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"","plan":"three"}`, invalid: true, status: 400, code: httpapi.CodeInvalidUserID},
		{name: "a user id with a brace is invalid_user_id", method: "POST", path: httpapi.PathHeartbeat, body: string(mustJSON(t, slot("a}b", "three", "s"))), invalid: true, status: 400, code: httpapi.CodeInvalidUserID},
		{name: "a user id with a space is invalid_user_id", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"a b","stream_id":"s"}`, invalid: true, status: 400, code: httpapi.CodeInvalidUserID},
		{name: "a user id of 257 bytes is invalid_user_id", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + strings.Repeat("u", 257) + `","plan":"three"}`, invalid: true, status: 400, code: httpapi.CodeInvalidUserID},
		{name: "a stream id with a slash is invalid_stream_id", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + user + `","plan":"three","stream_id":"a/b"}`, invalid: true, status: 400, code: httpapi.CodeInvalidStreamID},
		{name: "a stream id of 129 characters is invalid_stream_id", method: "POST", path: httpapi.PathHeartbeat, body: string(mustJSON(t, slot(user, "three", strings.Repeat("s", 129)))), invalid: true, status: 400, code: httpapi.CodeInvalidStreamID},
		{name: "a release without stream id is invalid_stream_id", method: "POST", path: httpapi.PathRelease, body: `{"user_id":"` + user + `"}`, invalid: true, status: 400, code: httpapi.CodeInvalidStreamID},
		{name: "a plan in a release is an unknown field", method: "POST", path: httpapi.PathRelease, body: string(mustJSON(t, slot(user, "three", "s"))), invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "an acquire for an unknown plan is 422 unknown_plan", method: "POST", path: httpapi.PathAcquire, body: `{"user_id":"` + user + `","plan":"gold"}`, status: 422, code: httpapi.CodeUnknownPlan},
		{name: "a heartbeat naming an unknown plan is judged by its slot: 410 when never acquired", method: "POST", path: httpapi.PathHeartbeat, body: string(mustJSON(t, slot(user, "gold", "s"))), status: 410, code: httpapi.CodeSlotLost},
		{name: "a heartbeat of a stream never acquired is 410 slot_lost", method: "POST", path: httpapi.PathHeartbeat, body: string(mustJSON(t, slot(user, "three", "never"))), status: 410, code: httpapi.CodeSlotLost},
		{name: "a batch of 0 slots is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":[]}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a batch without slots is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a batch of 1001 slots is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: string(batch(httpapi.MaxBatch + 1)), invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "a batch body over 1 MiB is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":[` + strings.Repeat(" ", 1<<20) + `]}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "an unknown field in a batch slot is invalid_request", method: "POST", path: httpapi.PathHeartbeats, body: `{"slots":[{"user_id":"` + user + `","plan":"three","stream_id":"s","ttl":1}]}`, invalid: true, status: 400, code: httpapi.CodeInvalidRequest},
		{name: "an unknown path is 404 not_found", method: "GET", path: "/v1/nope", status: 404, code: httpapi.CodeNotFound},
		{name: "a known path with a trailing slash is 404 not_found", method: "POST", path: httpapi.PathAcquire + "/", body: `{}`, status: 404, code: httpapi.CodeNotFound},
		{name: "the ops paths are not on the API listener", method: "GET", path: "/healthz", status: 404, code: httpapi.CodeNotFound},
		{name: "GET on acquire is 405 method_not_allowed", method: "GET", path: httpapi.PathAcquire, status: 405, code: httpapi.CodeMethodNotAllowed, allow: "POST"},
		{name: "DELETE on release is 405 method_not_allowed", method: "DELETE", path: httpapi.PathRelease, status: 405, code: httpapi.CodeMethodNotAllowed, allow: "POST"},
		{name: "POST on tiers is 405 method_not_allowed", method: "POST", path: httpapi.PathTiers, body: `{}`, status: 405, code: httpapi.CodeMethodNotAllowed, allow: "GET"},
		{name: "a doubled slash is 404 not_found, not a redirect", method: "POST", path: "/v1//slots/acquire", body: `{}`, status: 404, code: httpapi.CodeNotFound},
		{name: "a dot segment is 404 not_found, not a redirect", method: "POST", path: "/v1/./slots/acquire", body: `{}`, status: 404, code: httpapi.CodeNotFound},
		{name: "a dot-dot segment is 404 not_found, not a redirect", method: "GET", path: "/v1/x/../tiers", status: 404, code: httpapi.CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body []byte
			if tc.body != "" || tc.method == "POST" {
				body = []byte(tc.body)
			}
			r := a.call(t, tc.method, tc.path, body, tc.invalid)
			wantError(t, r, tc.status, tc.code)
			if got := r.header.Get("Allow"); got != tc.allow {
				t.Errorf("Allow: got %q, want %q", got, tc.allow)
			}
		})
	}
}

func TestAPIHeartbeats(t *testing.T) {
	t.Parallel()
	// A generous deadline: these cases are about what a batch answers, and
	// a thousand slots' pipeline on a loaded machine can outlast the
	// default 250ms, which answers them degraded rather than lost.
	a := newAPI(t, limitertest.New(t, limitertest.Options{Redis: cluster.Options{Timeout: 5 * time.Second}}).Limiter)
	user := newUser(t)
	held := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "three", StreamID: "held"}), http.StatusOK)

	t.Run("a batch answers alive, lost and invalid slots each in its place", func(t *testing.T) {
		req := httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{
			{UserID: user, Plan: "three", StreamID: "held"},
			{UserID: user, Plan: "three", StreamID: "lost"},
			{UserID: "a b", Plan: "three", StreamID: "held"},
			{UserID: user, Plan: "three", StreamID: "a/b"},
			{UserID: user, Plan: "gold", StreamID: "held"},
		}}
		// Invalid ids inside the batch are outside the spec by design.
		got := decode[httpapi.HeartbeatsResponse](t, a.call(t, http.MethodPost, httpapi.PathHeartbeats, mustJSON(t, req), true), http.StatusOK)
		want := []struct {
			stream string
			alive  bool
			code   string
		}{
			{"held", true, ""},
			{"lost", false, ""},
			{"held", false, httpapi.CodeInvalidUserID},
			{"a/b", false, httpapi.CodeInvalidStreamID},
			{"held", true, ""}, // an unknown plan: the slot's own TTL keeps it
		}
		if len(got.Results) != len(want) {
			t.Fatalf("results: got %d, want %d: %+v", len(got.Results), len(want), got.Results)
		}
		for i, w := range want {
			res := got.Results[i]
			code := ""
			if res.Error != nil {
				code = res.Error.Code
			}
			if res.StreamID != w.stream || res.Alive != w.alive || code != w.code || res.Degraded {
				t.Errorf("result %d: got %+v (error %q), want stream %q, alive %v, error %q, not degraded", i, res, code, w.stream, w.alive, w.code)
			}
			if (res.ExpiresAt != nil) != w.alive {
				t.Errorf("result %d expires_at: got %v, want set only when alive", i, res.ExpiresAt)
			}
		}
		if exp := got.Results[0].ExpiresAt; exp != nil && exp.Before(held.ExpiresAt) {
			t.Errorf("alive slot expires_at: got %v, want at or after the acquire's %v", exp, held.ExpiresAt)
		}
	})

	t.Run("a batch of one slot is answered", func(t *testing.T) {
		got := decode[httpapi.HeartbeatsResponse](t, a.post(t, httpapi.PathHeartbeats, httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{{UserID: user, Plan: "three", StreamID: "held"}}}), http.StatusOK)
		if len(got.Results) != 1 || !got.Results[0].Alive {
			t.Errorf("got %+v, want one alive result", got.Results)
		}
	})

	t.Run("a batch slot without a plan is 400, as a single heartbeat is", func(t *testing.T) {
		body := mustJSON(t, httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{{UserID: user, Plan: "three", StreamID: "held"}, {UserID: user, StreamID: "held"}}})
		got := a.call(t, http.MethodPost, httpapi.PathHeartbeats, body, true)
		if code := errorCode(t, got); got.status != http.StatusBadRequest || code != httpapi.CodeInvalidRequest || !strings.Contains(string(got.body), "slots[1].plan is required") {
			t.Errorf("got %d %s, want 400 invalid_request naming slots[1].plan", got.status, got.body)
		}
	})

	t.Run("a batch of 1000 slots over 64 KiB is answered", func(t *testing.T) {
		req := httpapi.HeartbeatsRequest{Slots: make([]httpapi.HeartbeatRequest, httpapi.MaxBatch)}
		for i := range req.Slots {
			req.Slots[i] = httpapi.HeartbeatRequest{UserID: user, Plan: "three", StreamID: fmt.Sprintf("stream-%04d-%s", i, strings.Repeat("x", 80))}
		}
		body := mustJSON(t, req)
		if len(body) <= httpapi.MaxBodyBytes {
			t.Fatalf("test body: got %d bytes, want over %d", len(body), httpapi.MaxBodyBytes)
		}
		got := decode[httpapi.HeartbeatsResponse](t, a.call(t, http.MethodPost, httpapi.PathHeartbeats, body, false), http.StatusOK)
		if len(got.Results) != httpapi.MaxBatch {
			t.Fatalf("results: got %d, want %d", len(got.Results), httpapi.MaxBatch)
		}
		for i, res := range got.Results {
			if res.StreamID != req.Slots[i].StreamID || res.Alive || res.Error != nil {
				t.Fatalf("result %d: got %+v, want %s lost", i, res, req.Slots[i].StreamID)
			}
		}
	})
}

func TestAPITiers(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{}).Limiter)
	got := decode[httpapi.TiersResponse](t, a.call(t, http.MethodGet, httpapi.PathTiers, nil, false), http.StatusOK)
	want := []httpapi.Tier{
		{Plan: "closed", MaxConcurrentStreams: 3, SlotTTLMs: 10_000, HeartbeatIntervalMs: 1_000, FailureMode: "Closed", Enforce: true},
		{Plan: "none", MaxConcurrentStreams: 0, SlotTTLMs: 10_000, HeartbeatIntervalMs: 1_000, FailureMode: "Open", Enforce: true},
		{Plan: "one", MaxConcurrentStreams: 1, SlotTTLMs: 10_000, HeartbeatIntervalMs: 1_000, FailureMode: "Open", Enforce: true},
		{Plan: "short", MaxConcurrentStreams: 3, SlotTTLMs: 300, HeartbeatIntervalMs: 100, FailureMode: "Open", Enforce: true},
		{Plan: "short-one", MaxConcurrentStreams: 1, SlotTTLMs: 300, HeartbeatIntervalMs: 100, FailureMode: "Open", Enforce: true},
		{Plan: "three", MaxConcurrentStreams: 3, SlotTTLMs: 10_000, HeartbeatIntervalMs: 1_000, FailureMode: "Open", Enforce: true},
	}
	if fmt.Sprint(got.Tiers) != fmt.Sprint(want) {
		t.Errorf("tiers: got %+v, want %+v", got.Tiers, want)
	}
}

func TestAPIRedisUnreachable(t *testing.T) {
	t.Parallel()
	a := newAPI(t, unreachable(t))
	user := newUser(t)
	closedSlot := httpapi.HeartbeatRequest{UserID: user, Plan: "closed", StreamID: "c"}
	openSlot := httpapi.HeartbeatRequest{UserID: user, Plan: "three", StreamID: "o"}

	t.Run("an acquire on a Closed tier is 503 limiter_unavailable", func(t *testing.T) {
		wantError(t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "closed"}), http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	})
	t.Run("an acquire on an Open tier is granted degraded", func(t *testing.T) {
		got := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "one", StreamID: "o"}), http.StatusOK)
		if !got.Granted || !got.Degraded || got.Used != 0 || got.Limit != 1 || got.StreamID != "o" || !got.ExpiresAt.After(time.Now()) {
			t.Errorf("got %+v, want granted, degraded, used 0, limit 1, stream o, expiring in the future", got)
		}
	})
	t.Run("an acquire on a 0-stream Open tier is granted degraded, never 429", func(t *testing.T) {
		got := decode[httpapi.AcquireResponse](t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "none"}), http.StatusOK)
		if !got.Granted || !got.Degraded {
			t.Errorf("got %+v, want granted and degraded", got)
		}
	})
	t.Run("an unknown plan is still 422 unknown_plan", func(t *testing.T) {
		wantError(t, a.post(t, httpapi.PathAcquire, httpapi.AcquireRequest{UserID: user, Plan: "gold"}), http.StatusUnprocessableEntity, httpapi.CodeUnknownPlan)
	})
	t.Run("a heartbeat on a Closed tier is 503 limiter_unavailable", func(t *testing.T) {
		wantError(t, a.post(t, httpapi.PathHeartbeat, closedSlot), http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	})
	t.Run("a heartbeat on an Open tier is alive degraded", func(t *testing.T) {
		got := decode[httpapi.HeartbeatResponse](t, a.post(t, httpapi.PathHeartbeat, openSlot), http.StatusOK)
		if !got.Alive || !got.Degraded || !got.ExpiresAt.After(time.Now()) {
			t.Errorf("got %+v, want alive, degraded, expiring in the future", got)
		}
	})
	t.Run("a batch of Closed-tier slots only is 503 limiter_unavailable", func(t *testing.T) {
		r := a.post(t, httpapi.PathHeartbeats, httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{closedSlot, closedSlot}})
		wantError(t, r, http.StatusServiceUnavailable, httpapi.CodeUnavailable)
	})
	t.Run("a mixed batch answers per slot: unavailable for Closed, degraded for Open", func(t *testing.T) {
		got := decode[httpapi.HeartbeatsResponse](t, a.post(t, httpapi.PathHeartbeats, httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{closedSlot, openSlot}}), http.StatusOK)
		if len(got.Results) != 2 {
			t.Fatalf("results: got %+v, want 2", got.Results)
		}
		if c := got.Results[0]; c.Alive || c.Error == nil || c.Error.Code != httpapi.CodeUnavailable {
			t.Errorf("Closed slot: got %+v, want not alive with error limiter_unavailable", c)
		}
		if o := got.Results[1]; !o.Alive || !o.Degraded || o.Error != nil || o.ExpiresAt == nil {
			t.Errorf("Open slot: got %+v, want alive, degraded, with expires_at and no error", o)
		}
	})
	t.Run("a release is answered degraded, never an error", func(t *testing.T) {
		got := decode[httpapi.ReleaseResponse](t, a.post(t, httpapi.PathRelease, httpapi.ReleaseRequest{UserID: user, StreamID: "o"}), http.StatusOK)
		if got.Released || !got.Degraded {
			t.Errorf("got %+v, want released false, degraded", got)
		}
	})
	t.Run("the tiers are still listed", func(t *testing.T) {
		got := decode[httpapi.TiersResponse](t, a.call(t, http.MethodGet, httpapi.PathTiers, nil, false), http.StatusOK)
		if want := len(limitertest.Tiers()); len(got.Tiers) != want {
			t.Errorf("tiers: got %d, want %d", len(got.Tiers), want)
		}
	})
}

func TestOpsListener(t *testing.T) {
	t.Parallel()
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprintln(w, "limiter_up 1")
	})
	lim := unreachable(t) // readiness never depends on Redis
	unsynced := limiter.New(nil, tiers.NewTable(), limiter.Options{})

	answered := func(v bool) func() bool { return func() bool { return v } }

	for _, tc := range []struct {
		name          string
		lim           *limiter.Limiter
		metrics       http.Handler
		redisAnswered func() bool // Options.RedisAnswered
		path          string
		status        int
		body          string
	}{
		{"healthz answers ok", lim, nil, nil, "/healthz", 200, "ok\n"},
		{"readyz is ok once the tiers synced, Redis unreachable", lim, nil, nil, "/readyz", 200, "ok\n"},
		{"readyz is 503 before the tiers synced", unsynced, nil, nil, "/readyz", 503, "tiers not synced yet\n"},
		{"readyz requiring Redis is 503 until Redis answered", lim, nil, answered(false), "/readyz", 503, "redis has not answered yet\n"},
		{"readyz requiring Redis is ok once Redis answered", lim, nil, answered(true), "/readyz", 200, "ok\n"},
		{"readyz requiring Redis still waits for the tiers first", unsynced, nil, answered(true), "/readyz", 503, "tiers not synced yet\n"},
		{"metrics are served when a handler is set", lim, metrics, nil, "/metrics", 200, "limiter_up 1\n"},
		{"metrics are 404 without a handler", lim, nil, nil, "/metrics", 404, ""},
		{"an unknown ops path is 404", lim, nil, nil, "/v1/tiers", 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(server.New(tc.lim, server.Options{Metrics: tc.metrics, RedisAnswered: tc.redisAnswered}).OpsHandler())
			defer srv.Close()
			client := &http.Client{Transport: apitest.ValidatingOpsTransport(t, srv.Client().Transport), Timeout: 10 * time.Second}
			resp, err := client.Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("GET %s: got %d, want %d", tc.path, resp.StatusCode, tc.status)
			}
			if tc.body != "" && string(body) != tc.body {
				t.Errorf("GET %s: body %q, want %q", tc.path, body, tc.body)
			}
		})
	}
}

// A GET route is not served to HEAD (which Go's mux would): it is 405
// with Allow: GET, as any other method.
func TestHeadOnAGetRouteIsNotAllowed(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{}).Limiter)
	req, err := http.NewRequest(http.MethodHead, a.url+httpapi.PathTiers, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != http.MethodGet {
		t.Errorf("HEAD %s: %d, Allow %q; want 405, Allow GET", httpapi.PathTiers, resp.StatusCode, resp.Header.Get("Allow"))
	}
}
