package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/limitertest"
	"github.com/joishi/limiter/pkg/httpapi"
	"github.com/joishi/limiter/pkg/limiter"
)

func TestAPIContentType(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{}).Limiter)
	for _, tc := range []struct {
		name        string
		contentType string // "" sends none
		status      int
	}{
		{"application/json is accepted", "application/json", http.StatusOK},
		{"a charset of utf-8 is accepted", "application/json; charset=utf-8", http.StatusOK},
		{"the media type is case-insensitive", "Application/JSON; Charset=UTF-8", http.StatusOK},
		{"no Content-Type is 415", "", http.StatusUnsupportedMediaType},
		{"text/plain is 415", "text/plain", http.StatusUnsupportedMediaType},
		{"a form is 415", "application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"multipart is 415", "multipart/form-data; boundary=x", http.StatusUnsupportedMediaType},
		{"another JSON-ish type is 415", "application/json-patch+json", http.StatusUnsupportedMediaType},
		{"another charset is 415", "application/json; charset=latin1", http.StatusUnsupportedMediaType},
		{"a malformed Content-Type is 415", "application/json; =", http.StatusUnsupportedMediaType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := mustJSON(t, httpapi.AcquireRequest{UserID: newUser(t), Plan: "three"})
			header := http.Header{"Content-Type": {tc.contentType}}
			if tc.contentType == "" {
				header = http.Header{"Content-Type": nil}
			}
			r := a.callWith(t, http.MethodPost, httpapi.PathAcquire, body, tc.status != http.StatusOK, header)
			if tc.status == http.StatusOK {
				decode[httpapi.AcquireResponse](t, r, http.StatusOK)
				return
			}
			e := wantError(t, r, tc.status, httpapi.CodeUnsupportedMediaType)
			if !strings.Contains(e.Message, "application/json") && !strings.Contains(e.Message, "UTF-8") {
				t.Errorf("message: got %q, want it to say what is accepted", e.Message)
			}
		})
	}
}

// A content-coded body (Content-Encoding: gzip, as some HTTP stacks send
// large ones) is refused 415 naming its coding, not read as JSON and
// refused as bad UTF-8; identity, and no coding, are accepted.
func TestAPIRefusesAContentCodedBody(t *testing.T) {
	t.Parallel()
	a := newAPI(t, limitertest.New(t, limitertest.Options{}).Limiter)
	for _, tc := range []struct {
		name     string
		encoding []string
		refused  string // the coding the refusal names; "" accepted
	}{
		{"gzip is 415", []string{"gzip"}, "gzip"},
		{"br is 415", []string{"br"}, "br"},
		{"a list ending in gzip is 415", []string{"identity, gzip"}, "gzip"},
		{"a second header is 415", []string{"identity", "deflate"}, "deflate"},
		{"identity is accepted", []string{"Identity"}, ""},
		{"an empty one is accepted", []string{""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := mustJSON(t, httpapi.AcquireRequest{UserID: newUser(t), Plan: "three"})
			header := http.Header{"Content-Type": {"application/json"}, "Content-Encoding": tc.encoding}
			r := a.callWith(t, http.MethodPost, httpapi.PathAcquire, body, tc.refused != "", header)
			if tc.refused == "" {
				decode[httpapi.AcquireResponse](t, r, http.StatusOK)
				return
			}
			e := wantError(t, r, http.StatusUnsupportedMediaType, httpapi.CodeUnsupportedMediaType)
			if !strings.Contains(e.Message, "Content-Encoding") || !strings.Contains(e.Message, `"`+tc.refused+`"`) {
				t.Errorf("message %q: want it to name the Content-Encoding and its coding", e.Message)
			}
		})
	}
}

// A web page can make a browser POST to the API cross-site without a
// preflight only as a "simple request": text/plain (or a form). Such a
// request is refused 415 before its body is read, changes nothing, and no
// answer carries a CORS header that would let a page read it or send
// JSON.
func TestAPIRefusesCrossSiteSimplePosts(t *testing.T) {
	t.Parallel()
	lim := limitertest.New(t, limitertest.Options{}).Limiter
	a := newAPI(t, lim)
	ctx := context.Background()
	victim := newUser(t)
	held, err := lim.Acquire(ctx, limiter.AcquireRequest{UserID: victim, Plan: "one", StreamID: "chat-1"})
	if err != nil || !held.Granted {
		t.Fatalf("acquire: %+v, %v", held, err)
	}
	browser := http.Header{
		"Content-Type": {"text/plain;charset=UTF-8"},
		"Origin":       {"https://attacker.example"},
		"Referer":      {"https://attacker.example/page.html"},
	}
	for _, tc := range []struct {
		path string
		body any
	}{
		{httpapi.PathRelease, httpapi.ReleaseRequest{UserID: victim, StreamID: "chat-1"}},
		{httpapi.PathAcquire, httpapi.AcquireRequest{UserID: victim, Plan: "one", StreamID: "squatter"}},
		{httpapi.PathHeartbeat, httpapi.HeartbeatRequest{UserID: victim, Plan: "one", StreamID: "chat-1"}},
		{httpapi.PathHeartbeats, httpapi.HeartbeatsRequest{Slots: []httpapi.HeartbeatRequest{{UserID: victim, Plan: "one", StreamID: "chat-1"}}}},
	} {
		t.Run(tc.path, func(t *testing.T) {
			r := a.callWith(t, http.MethodPost, tc.path, mustJSON(t, tc.body), true, browser)
			wantError(t, r, http.StatusUnsupportedMediaType, httpapi.CodeUnsupportedMediaType)
			noCORS(t, r.header)
		})
	}
	slots, err := lim.Slots(ctx, victim)
	if err != nil {
		t.Fatal(err)
	}
	if slots.Used != 1 || slots.Slots[0].StreamID != "chat-1" || !slots.Slots[0].ExpiresAt.Equal(held.ExpiresAt) {
		t.Errorf("the victim's slots after the cross-site posts: got %+v, want chat-1 alone, its expiry untouched (%v)", slots, held.ExpiresAt)
	}

	t.Run("a preflight is not granted", func(t *testing.T) {
		r := a.callWith(t, http.MethodOptions, httpapi.PathAcquire, nil, false, http.Header{
			"Origin":                         {"https://attacker.example"},
			"Access-Control-Request-Method":  {"POST"},
			"Access-Control-Request-Headers": {"content-type"},
		})
		wantError(t, r, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed)
		noCORS(t, r.header)
	})
	t.Run("a JSON answer carries no CORS header either", func(t *testing.T) {
		r := a.callWith(t, http.MethodGet, httpapi.PathTiers, nil, false, http.Header{"Origin": {"https://attacker.example"}})
		decode[httpapi.TiersResponse](t, r, http.StatusOK)
		noCORS(t, r.header)
	})
}

func noCORS(t *testing.T, h http.Header) {
	t.Helper()
	for name := range h {
		if strings.HasPrefix(strings.ToLower(name), "access-control-") {
			t.Errorf("answer header %s: %q, want no CORS header", name, h.Get(name))
		}
	}
}
