package route_test

import (
	"net/url"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/route"
)

func mustNew(t *testing.T, routes ...string) route.Set {
	t.Helper()
	s, err := route.New(routes)
	if err != nil {
		t.Fatalf("New(%q): %v", routes, err)
	}
	return s
}

// No spelling of a limited route escapes it: a path is under a route when
// any server reading (decoded before or after splitting, backslashes as
// slashes, path parameters cut, dot segments and empty segments resolved
// or kept) puts it there, case aside. Paths naming another resource are
// not.
func TestMatch(t *testing.T) {
	s := mustNew(t, "/v1/chat/completions", "/v1/audio/")
	cases := []struct {
		name   string
		target string
		want   bool
	}{
		{"the route itself", "/v1/chat/completions", true},
		{"a path under the route", "/v1/audio/speech", true},
		{"a route configured with a trailing slash, without it", "/v1/audio", true},
		{"a trailing slash", "/v1/chat/completions/", true},
		{"a query string", "/v1/chat/completions?stream=true", true},
		{"a query string after a trailing slash", "/v1/chat/completions/?a=b", true},
		{"a query string holding slashes and dot-dots", "/v1/chat/completions?next=/../../v1/models", true},
		{"a fragment", "/v1/chat/completions#top", true},
		{"a doubled slash at the start", "//v1/chat/completions", true},
		{"doubled slashes inside", "/v1//chat///completions", true},
		{"a dot segment", "/v1/chat/./completions", true},
		{"a dot-dot out of another directory", "/x/../v1/chat/completions", true},
		{"a dot-dot above the root", "/../v1/chat/completions", true},
		{"dot-dots far above the root", "/../../../v1/chat/completions", true},
		{"an encoded slash", "/v1%2Fchat%2Fcompletions", true},
		{"a lower-case encoded slash", "/v1%2fchat/completions", true},
		{"an encoded slash around a dot-dot", "/x%2F..%2Fv1/chat/completions", true},
		{"an encoded dot segment", "/v1/chat/%2e/completions", true},
		{"an encoded dot-dot", "/v1/x/%2e%2E/chat/completions", true},
		{"a half-encoded dot-dot", "/v1/x/.%2E/chat/completions", true},
		{"an encoded letter", "/v1/%63hat/completions", true},
		{"upper case", "/V1/CHAT/COMPLETIONS", true},
		{"mixed case", "/v1/Chat/completions", true},
		// Servers that compare case-insensitively one character at a time
		// (.NET's OrdinalIgnoreCase upper-cases, Java's equalsIgnoreCase
		// upper- and lower-cases) take ı for i and İ for i, which Unicode
		// folding keeps apart; ſ folds to s, K (Kelvin) to k.
		{"a dotless i", "/v1/chat/completıons", true},
		{"an encoded dotless i", "/v1/chat/complet%C4%B1ons", true},
		{"a dotted capital I", "/v1/chat/completİons", true},
		{"a long s", "/v1/chat/completionſ", true},
		{"a dotless i in a name extending the route", "/v1/chat/completıonsX", false},
		{"backslashes", `/v1\chat\completions`, true},
		{"encoded backslashes", "/v1%5Cchat%5ccompletions", true},
		{"a backslash dot-dot", `/x\..\v1/chat/completions`, true},
		{"a path parameter", "/v1/chat/completions;jsessionid=1", true},
		{"a path parameter on a middle segment", "/v1;x=1/chat/completions", true},
		{"a dot-dot with a path parameter", "/public/..;/v1/chat/completions", true},
		{"an encoded semicolon", "/v1/chat/completions%3Bx", true},
		{"a dot-dot leaving the route, as a server keeping dot segments still routes it", "/v1/chat/completions/../../models", true},
		{"an empty segment before a dot-dot, resolved as RFC 3986 does", "/v1/chat/completions//..", true},
		{"a path without its leading slash", "v1/chat/completions", true},
		{"an absolute-form target", "http://llm.example//v1/chat/completions?x=1", true},
		{"an invalid escape beside the route", "/v1/chat/completions/%zz", true},
		// IIS and servers on Windows cut the dots and spaces a segment
		// ends with: no file name ends in either.
		{"a trailing dot", "/v1/chat/completions.", true},
		{"trailing dots", "/v1/chat/completions...", true},
		{"an encoded trailing space", "/v1/chat/completions%20", true},
		{"an encoded trailing dot", "/v1/chat/completions%2E", true},
		{"trailing dots and spaces mixed", "/v1/chat/completions.%20.", true},
		{"a trailing dot on a middle segment", "/v1/chat./completions", true},
		{"a trailing dot and a query", "/v1/chat/completions.?stream=true", true},
		// Starlette's routes end in Python's "$", which matches before a
		// final newline.
		{"an encoded final newline", "/v1/chat/completions%0A", true},
		{"an encoded final newline in lower case", "/v1/chat/completions%0a", true},
		{"an encoded final newline and a query", "/v1/chat/completions%0a?stream=true", true},
		{"an encoded final newline after doubled slashes", "//v1/chat/completions%0A", true},
		{"an encoded final newline after a trailing dot", "/v1/chat/completions.%0A", true},
		{"an encoded final newline after a trailing slash", "/v1/chat/completions/%0A", true},

		{"the root", "/", false},
		{"the empty path", "", false},
		{"another resource", "/v1/models", false},
		{"a name extending the route's last segment", "/v1/chat/completionsX", false},
		{"an extension after the route's last segment", "/v1/chat/completions.json", false},
		{"a dot before the route's last segment", "/v1/chat/.completions", false},
		{"a trailing dot on another resource", "/v1/models.", false},
		{"two encoded final newlines", "/v1/chat/completions%0A%0A", false},
		{"an encoded newline before a name", "/v1/chat/completions%0Ax", false},
		{"an encoded newline ending a middle segment", "/v1/chat/completions%0A/x", false},
		{"an encoded newline before a dot", "/v1/chat/completions%0A.", false},
		{"an encoded final newline on another resource", "/v1/models%0A", false},
		{"a segment of three dots before the route is a name, not cut away", "/v1/.../chat/completions", false},
		{"a segment of an encoded space before the route is a name", "/v1/%20/chat/completions", false},
		{"a trailing dot-dot segment climbing out before the route", "/v1/chat/../completions.", false},
		{"a name extending a route on its segment boundary", "/v1/audiobooks", false},
		{"the route's parent", "/v1/chat", false},
		{"a dot-dot climbing out before the route", "/v1/chat/../completions", false},
		{"the route named in the query only", "/v1/models?path=/v1/chat/completions", false},
		{"an encoded slash inside another resource's segment", "/v1/models/org%2Fmodel", false},
		{"a double-encoded slash, decoded once as servers do", "/v1%252Fchat%252Fcompletions", false},
		{"an absolute-form target for another resource", "http://llm.example/v1/models", false},
		// Read as a reference against a base URL (Node's new URL(req.url,
		// base)), two slashes first start an authority, not a path.
		{"an authority before the route", "//evil/v1/chat/completions", true},
		{"an authority spelt with backslashes", `/\evil/v1/chat/completions`, true},
		{"an authority after a backslash and a slash", `\/evil\v1/chat/completions`, true},
		{"an authority and a query", "//evil/v1/chat/completions?x=/", true},
		{"an authority before another resource", "//evil/v1/models", false},
		{"an authority alone", "//v1", false},
		{"one slash and a host-like segment", "/evil/v1/chat/completions", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.Match(tc.target); got != tc.want {
				t.Errorf("Match(%q) = %v, want %v", tc.target, got, tc.want)
			}
		})
	}
}

// The route "/" holds every path; an empty set holds none.
func TestRootAndEmptySets(t *testing.T) {
	root, none := mustNew(t, "/"), mustNew(t)
	for _, target := range []string{"/", "", "/v1/models", "//x", "/%2e%2e"} {
		if !root.Match(target) {
			t.Errorf(`route "/": Match(%q) = false, want true`, target)
		}
		if none.Match(target) {
			t.Errorf("no routes: Match(%q) = true, want false", target)
		}
	}
}

// A route must read one way only: a plain path, so that what the
// operator wrote is what is matched.
func TestCheck(t *testing.T) {
	cases := []struct {
		name    string
		route   string
		wantErr string // "": valid
	}{
		{"a path", "/v1/chat/completions", ""},
		{"a path with a trailing slash", "/v1/audio/", ""},
		{"the root", "/", ""},
		{"upper case", "/V1/Chat", ""},
		{"empty", "", "must start with /"},
		{"no leading slash", "v1/chat", "must start with /"},
		{"a doubled slash", "/v1//chat", "empty segment"},
		{"a dot segment", "/v1/./chat", `"." or ".." segment`},
		{"a dot-dot segment", "/v1/../chat", `"." or ".." segment`},
		{"a trailing dot-dot", "/v1/..", `"." or ".." segment`},
		{"a percent-encoding", "/v1/%63hat", "%"},
		{"a backslash", `/v1\chat`, `\`},
		{"a path parameter", "/v1/chat;x", ";"},
		{"a query", "/v1/chat?x=1", "?"},
		{"a fragment", "/v1/chat#x", "#"},
		{"a space", "/v1/chat completions", "whitespace"},
		{"a control character", "/v1/chat\x00", "control"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := route.Check(tc.route)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Check(%q) = %v, want nil", tc.route, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), strconv.Quote(tc.route)) {
				t.Fatalf("Check(%q) = %v, want an error naming the route and saying %q", tc.route, err, tc.wantErr)
			}
			if _, err := route.New([]string{"/v1/models", tc.route}); err == nil {
				t.Errorf("New accepted the route %q", tc.route)
			}
		})
	}
}

// Whatever a client sends, a path that path.Clean (the canonical form:
// decoded, backslashes as slashes, slashes merged, dot segments resolved)
// puts under a route, lower- or upper-cased, is matched.
func FuzzMatchHoldsTheCleanedPath(f *testing.F) {
	for _, seed := range []string{"/v1/chat/completions", "//v1/chat/completions", "/x/../v1/chat/completions", "/v1/chat/./completions",
		"/v1%2Fchat%2Fcompletions", `/v1\chat\completions`, "/V1/CHAT/COMPLETIONS/", "/../v1/chat/completions?x=/..", "/v1/models", "/v1/chat/completıons"} {
		f.Add(seed)
	}
	s, err := route.New([]string{"/v1/chat/completions"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, target string) {
		p, _, _ := strings.Cut(target, "?")
		p, _, _ = strings.Cut(p, "#")
		decoded, err := url.PathUnescape(p)
		if err != nil || strings.Contains(p, "://") {
			return
		}
		clean := path.Clean("/" + strings.ReplaceAll(decoded, `\`, "/"))
		for _, c := range []string{strings.ToLower(clean), strings.ToLower(strings.ToUpper(clean))} {
			if (c == "/v1/chat/completions" || strings.HasPrefix(c, "/v1/chat/completions/")) && !s.Match(target) {
				t.Errorf("Match(%q) = false, but it cleans to %q", target, c)
			}
		}
	})
}

func BenchmarkMatch(b *testing.B) {
	s, _ := route.New([]string{"/v1/chat/completions", "/v1/completions"})
	for _, target := range []string{"/v1/chat/completions", "/v1/models/meta-llama-3.1-8b", "/v1%2Fchat%2Fcompletions"} {
		b.Run(target, func(b *testing.B) {
			for b.Loop() {
				s.Match(target)
			}
		})
	}
}
