package apitest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/joishi/limiter/internal/apitest"
)

func TestSpecIsValid(t *testing.T) {
	doc, err := apitest.LoadSpec(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("doc.Validate: got %v, want nil", err)
	}
}

// recorder is a testing.TB that records Errorf instead of failing.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

const (
	acquireOK   = `{"granted":true,"stream_id":"s-1","used":1,"limit":3,"expires_at":"2030-01-02T03:04:05.678Z","ttl_ms":10000,"heartbeat_interval_ms":1000,"pruned":0,"degraded":false}`
	validBody   = `{"user_id":"u-1","plan":"paid"}`
	invalidBody = `{"user_id":"u-1","plan":"paid","extra":1}`
)

// answer is what the fake server answers.
type answer struct {
	status int
	header map[string]string
	body   string
}

func TestValidatingTransport(t *testing.T) {
	jsonError := func(status int, code string, header map[string]string) answer {
		if header == nil {
			header = map[string]string{}
		}
		header["Content-Type"] = "application/json"
		return answer{status, header, `{"error":{"code":"` + code + `","message":"m"}}`}
	}
	ok := func(body string) answer {
		return answer{200, map[string]string{"Content-Type": "application/json"}, body}
	}
	for _, tc := range []struct {
		name         string
		method, path string
		body         string
		invalid      bool
		answer       answer
		wantErrors   []string // substrings of the one reported error; none: no error
	}{
		{name: "a valid exchange passes", method: "POST", path: "/v1/slots/acquire", body: validBody, answer: ok(acquireOK)},
		{name: "an invalid request is reported", method: "POST", path: "/v1/slots/acquire", body: invalidBody, answer: jsonError(400, "invalid_request", nil),
			wantErrors: []string{"POST /v1/slots/acquire → 400", "request does not match", "extra"}},
		{name: "an invalid request marked Invalid is not reported", method: "POST", path: "/v1/slots/acquire", body: invalidBody, invalid: true, answer: jsonError(400, "invalid_request", nil)},
		{name: "a response without a required field is reported even for a request marked Invalid", method: "POST", path: "/v1/slots/acquire", body: invalidBody, invalid: true,
			answer: ok(strings.Replace(acquireOK, `"pruned":0,`, "", 1)), wantErrors: []string{"→ 200", "response does not match", "pruned"}},
		{name: "a response with an undeclared field is reported", method: "POST", path: "/v1/slots/acquire", body: validBody,
			answer: ok(strings.Replace(acquireOK, `"pruned":0,`, `"pruned":0,"bonus":1,`, 1)), wantErrors: []string{"bonus"}},
		{name: "a status the operation does not list is reported", method: "POST", path: "/v1/slots/acquire", body: validBody,
			answer: jsonError(418, "internal", nil), wantErrors: []string{"→ 418", "status is not supported"}},
		{name: "an error code not of its status is reported", method: "POST", path: "/v1/slots/heartbeat", body: `{"user_id":"u","plan":"p","stream_id":"s"}`,
			answer: jsonError(410, "not_found", nil), wantErrors: []string{"→ 410", "response does not match"}},
		{name: "a 429 without Retry-After is reported", method: "POST", path: "/v1/slots/acquire", body: validBody,
			answer:     answer{429, map[string]string{"Content-Type": "application/json"}, `{"error":{"code":"stream_limit_reached","message":"m","used":1,"limit":1,"retry_after_ms":5}}`},
			wantErrors: []string{"→ 429", "Retry-After"}},
		{name: "a 429 with Retry-After passes", method: "POST", path: "/v1/slots/acquire", body: validBody,
			answer: answer{429, map[string]string{"Content-Type": "application/json", "Retry-After": "1"}, `{"error":{"code":"stream_limit_reached","message":"m","used":1,"limit":1,"retry_after_ms":5}}`}},
		{name: "an unknown path answering 404 not_found passes", method: "GET", path: "/v1/nope", answer: jsonError(404, "not_found", nil)},
		{name: "an unknown path answering 200 is reported", method: "GET", path: "/v1/nope", answer: ok(`{}`), wantErrors: []string{"GET /v1/nope → 200", "must be 404"}},
		{name: "an unknown method answering 405 with Allow passes", method: "GET", path: "/v1/slots/release", answer: jsonError(405, "method_not_allowed", map[string]string{"Allow": "POST"})},
		{name: "a 405 without Allow is reported", method: "GET", path: "/v1/slots/release", answer: jsonError(405, "method_not_allowed", nil), wantErrors: []string{"→ 405", "Allow"}},
		{name: "a non-date expires_at is reported", method: "POST", path: "/v1/slots/acquire", body: validBody,
			answer: ok(strings.Replace(acquireOK, "2030-01-02T03:04:05.678Z", "tomorrow", 1)), wantErrors: []string{"expires_at"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var gotBody, gotMarker string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				gotBody, gotMarker = string(b), r.Header.Get(apitest.InvalidHeader)
				for k, v := range tc.answer.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.answer.status)
				io.WriteString(w, tc.answer.body)
			}))
			defer srv.Close()
			rec := &recorder{TB: t}
			client := &http.Client{Transport: apitest.ValidatingTransport(rec, srv.Client().Transport)}
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, err := http.NewRequest(tc.method, srv.URL+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			if tc.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			if tc.invalid {
				apitest.Invalid(req)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			respBody, _ := io.ReadAll(resp.Body)
			resp.Body.Close()

			if string(respBody) != tc.answer.body {
				t.Errorf("response body after validation: got %q, want %q", respBody, tc.answer.body)
			}
			if gotBody != tc.body {
				t.Errorf("request body the server read: got %q, want %q", gotBody, tc.body)
			}
			if gotMarker != "" {
				t.Errorf("%s header the server saw: got %q, want it stripped", apitest.InvalidHeader, gotMarker)
			}
			t.Logf("reported: %q", rec.errs)
			switch {
			case len(tc.wantErrors) == 0 && len(rec.errs) != 0:
				t.Errorf("reported: got %q, want nothing", rec.errs)
			case len(tc.wantErrors) != 0 && len(rec.errs) != 1:
				t.Errorf("reported: got %q, want one error", rec.errs)
			case len(tc.wantErrors) != 0:
				for _, want := range tc.wantErrors {
					if !strings.Contains(rec.errs[0], want) {
						t.Errorf("reported: got %q, want it to mention %q", rec.errs[0], want)
					}
				}
			}
		})
	}
}

func TestValidatingOpsTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name   string
		path   string
		errors int
	}{
		{"healthz answering 200 passes", "/healthz", 0},
		{"an unknown path answering 404 passes", "/nope", 0},
		{"readyz answering 404 is reported: the spec does not list it", "/readyz", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{TB: t}
			client := &http.Client{Transport: apitest.ValidatingOpsTransport(rec, srv.Client().Transport)}
			resp, err := client.Get(srv.URL + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if len(rec.errs) != tc.errors {
				t.Errorf("reported: got %q, want %d error(s)", rec.errs, tc.errors)
			}
		})
	}
}
