package opsmux_test

import (
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
