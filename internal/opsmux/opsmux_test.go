package opsmux_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/joishi/limiter/internal/opsmux"
)

func TestReadyzNamesTheFirstCheckFailing(t *testing.T) {
	failing := func(v bool) func() bool { return func() bool { return v } }
	for _, tc := range []struct {
		name   string
		checks []opsmux.Check
		status int
		body   string
	}{
		{"no checks: ready", nil, 200, "ok\n"},
		{"every check passing: ready", []opsmux.Check{{"a", failing(false)}, {"b", failing(false)}}, 200, "ok\n"},
		{"one failing: its reason", []opsmux.Check{{"a", failing(false)}, {"b", failing(true)}}, 503, "b\n"},
		{"several failing: the first one's reason", []opsmux.Check{{"a", failing(true)}, {"b", failing(true)}}, 503, "a\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			opsmux.Handler(nil, tc.checks...).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != tc.status || rec.Body.String() != tc.body {
				t.Errorf("GET /readyz = %d %q, want %d %q", rec.Code, rec.Body.String(), tc.status, tc.body)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
				t.Errorf("Content-Type = %q, want text/plain; charset=utf-8", ct)
			}
		})
	}
}

// The ops paths answer GET and HEAD; another method is 405 and another
// path 404 (a doubled slash too, not a redirect), each with the API's
// JSON error, as the other listeners answer.
func TestOtherMethodsAndPathsAreJSONErrors(t *testing.T) {
	h := opsmux.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("# metrics\n")) }))
	for _, tc := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/healthz", 200, "", ""},
		{"HEAD", "/healthz", 200, "", ""},
		{"HEAD", "/metrics", 200, "", ""},
		{"POST", "/metrics", 405, "method_not_allowed", "GET, HEAD"},
		{"DELETE", "/readyz", 405, "method_not_allowed", "GET, HEAD"},
		{"GET", "/nope", 404, "not_found", ""},
		{"GET", "//healthz", 404, "not_found", ""},
		{"GET", "/v1/slots/acquire", 404, "not_found", ""},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tc.method, "http://ops"+tc.path, nil))
		if rec.Code != tc.status || rec.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s = %d, Allow %q; want %d, Allow %q", tc.method, tc.path, rec.Code, rec.Header().Get("Allow"), tc.status, tc.allow)
		}
		if tc.code == "" {
			continue
		}
		var body struct {
			Error struct{ Code, Message string }
		}
		if rec.Header().Get("Content-Type") != "application/json" || json.Unmarshal(rec.Body.Bytes(), &body) != nil || body.Error.Code != tc.code || body.Error.Message == "" {
			t.Errorf("%s %s: %q %q; want the JSON error %s", tc.method, tc.path, rec.Header().Get("Content-Type"), rec.Body.String(), tc.code)
		}
	}
}
