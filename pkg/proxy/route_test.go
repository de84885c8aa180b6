package proxy_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/joishi/limiter/internal/proxytest"
	"github.com/joishi/limiter/pkg/proxy"
)

// Every spelling of a limited route holds a slot, however the client
// writes the path: a request without an identity on a limited route is
// 401, anywhere else the upstream answers. Spellings that name another
// resource pass through.
func TestEverySpellingOfALimitedRouteIsLimited(t *testing.T) {
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"data":[]}`)
	}), envOptions{proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
	addr := e.proxy.Listener.Addr().String()
	cases := []struct {
		name    string
		target  string
		limited bool
	}{
		{"the route as configured", "/v1/chat/completions", true},
		{"a path under the route", "/v1/chat/completions/abc", true},
		{"a trailing slash", "/v1/chat/completions/", true},
		{"a query string", "/v1/chat/completions?stream=true", true},
		{"a doubled slash at the start", "//v1/chat/completions", true},
		{"doubled slashes inside", "/v1//chat///completions", true},
		{"a dot segment", "/v1/chat/./completions", true},
		{"a dot-dot segment out of another directory", "/x/../v1/chat/completions", true},
		{"dot-dot above the root", "/../../v1/chat/completions", true},
		{"encoded slashes", "/v1%2Fchat%2Fcompletions", true},
		{"lower-case encoded slashes", "/v1%2fchat%2fcompletions", true},
		{"an encoded slash around a dot-dot", "/x%2F..%2Fv1/chat/completions", true},
		{"an encoded dot segment", "/v1/chat/%2e/completions", true},
		{"an encoded dot-dot segment", "/v1/x/%2e%2E/chat/completions", true},
		{"an encoded letter", "/v1/%63hat/completions", true},
		{"upper case", "/V1/CHAT/Completions", true},
		{"backslashes", `/v1\chat\completions`, true},
		{"encoded backslashes", "/v1%5Cchat%5ccompletions", true},
		{"a path parameter", "/v1/chat/completions;jsessionid=1", true},
		{"a dot-dot with a path parameter", "/public/..;/v1/chat/completions", true},
		{"an absolute-form target", "http://" + addr + "//v1/chat/completions", true},
		{"another resource", "/v1/models", false},
		{"a longer name sharing the prefix", "/v1/chat/completionsX", false},
		{"the route's parent", "/v1/chat", false},
		{"an encoded slash inside another resource's segment", "/v1/models/org%2Fmodel", false},
		{"a dot-dot leaving the route, which a server keeping dot segments still routes under it", "/v1/chat/completions/../../models", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := proxytest.RawRequest(t, addr, "POST", tc.target, nil, "{}")
			resp.Body.Close()
			want := http.StatusOK
			if tc.limited {
				want = http.StatusUnauthorized
			}
			if resp.StatusCode != want {
				t.Errorf("POST %s without identity: got %d, want %d (limited %v)", tc.target, resp.StatusCode, want, tc.limited)
			}
		})
	}
}

// A request target with an opaque part (a scheme and no "//" before a
// path: x:http:/v1/chat/completions) names no path the proxy can judge,
// and the reverse proxy would send the opaque part upstream as the
// target, which a Go upstream serves as /v1/chat/completions. It is
// refused 400 invalid_target, with or without an identity, before any
// slot, on a route or off one, and nothing reaches the upstream.
func TestATargetWithAnOpaquePartIsRefused(t *testing.T) {
	reached := make(chan string, 16)
	e := newEnv(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached <- r.RequestURI
		fmt.Fprint(w, `{"choices":[]}`)
	}), envOptions{proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
	addr := e.proxy.Listener.Addr().String()
	user := newUser()
	identified := http.Header{"X-User-Id": {user}, "X-Plan": {"one"}}
	cases := []struct {
		name   string
		target string
		header http.Header
	}{
		{"a scheme before an http: target", "x:http:/v1/chat/completions", nil},
		{"http: twice", "http:http:/v1/chat/completions", nil},
		{"a scheme before a relative path", "x:v1/chat/completions", nil},
		{"an opaque target with a query", "x:http:/v1/chat/completions?stream=true", nil},
		{"with an identity", "x:http:/v1/chat/completions", identified},
		{"another resource", "x:http:/v1/models", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := proxytest.RawRequest(t, addr, "POST", tc.target, tc.header, "{}")
			if resp.StatusCode != http.StatusBadRequest {
				resp.Body.Close()
				t.Fatalf("POST %s: got %d, want 400", tc.target, resp.StatusCode)
			}
			body := decodeError(t, resp)
			if body.Error.Code != "invalid_target" || !strings.Contains(body.Error.Message, "origin form") {
				t.Errorf("POST %s: code %q, message %q; want invalid_target naming the origin form", tc.target, body.Error.Code, body.Error.Message)
			}
		})
	}
	if n := e.Used(t, user); n != 0 {
		t.Errorf("%d slots held after the refusals, want 0", n)
	}
	select {
	case target := <-reached:
		t.Errorf("a refused request reached the upstream as %s", target)
	default:
	}
}

// A user at the limit is refused on every other spelling of the route:
// the repro of a free user opening more streams than the plan allows.
func TestRouteSpellingsShareTheUsersLimit(t *testing.T) {
	up := newSSE()
	e := newEnv(t, up, envOptions{proxy: proxy.Options{Routes: []string{"/v1/chat/completions"}}})
	user := newUser()
	first := e.do(t, e.request(t, context.Background(), "POST", "/v1/chat/completions", user, "one", strings.NewReader(`{"stream":true}`)))
	defer first.Body.Close()
	<-up.started
	header := http.Header{"X-User-Id": {user}, "X-Plan": {"one"}}
	for _, target := range []string{"//v1/chat/completions", "/x/../v1/chat/completions", "/v1/chat/./completions", "/v1%2Fchat%2Fcompletions", "/V1/Chat/Completions"} {
		t.Run(target, func(t *testing.T) {
			resp := proxytest.RawRequest(t, e.proxy.Listener.Addr().String(), "POST", target, header, "{}")
			if resp.StatusCode != http.StatusTooManyRequests {
				// Not the body: a stream that got through would be drained;
				// the cleanup closes the connection.
				t.Fatalf("POST %s at the limit: got %d, want 429", target, resp.StatusCode)
			}
			if body := decodeError(t, resp); body.Error.Code != "stream_limit_reached" {
				t.Errorf("POST %s at the limit: code %q, want stream_limit_reached", target, body.Error.Code)
			}
		})
	}
	if n := e.Used(t, user); n != 1 {
		t.Errorf("%d slots held, want the first stream's 1", n)
	}
	select {
	case r := <-up.started:
		t.Errorf("a refused request reached the upstream as %s", r.URL.Path)
	default:
	}
	close(up.tokens)
}
