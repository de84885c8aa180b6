// Package route decides whether a request is on a limited route. The
// server behind the limiter, not the limiter, decides what a path means,
// and servers read paths differently: nginx and uvicorn decode %2F into a
// slash, merge slashes and resolve dot segments; Tomcat cuts ";"
// parameters; IIS takes a backslash for a slash; some resolve nothing. So
// a path is matched by every such reading (reading.go), and it is under a
// route when any of them puts it there: no spelling of a limited route
// (//v1/chat/completions, /x/../v1/chat/completions,
// /v1%2Fchat%2Fcompletions) escapes the cap, and a path that only looks
// alike (/v1/chat/completionsX, /v1/models/org%2Fmodel) stays outside.
// A doubtful spelling is limited, not refused with a 400: a client that
// spells a path oddly (a trailing slash, an encoded character) still
// streams within its cap, and a path that passes through is never refused
// for holding a %2F (a model id, say).
//
// The proxy matches its proxy.routes with it. The ext_proc server has no
// routes of its own: Envoy's route table decides which requests reach it.
package route

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Set is a list of routes: path prefixes matched on whole segments, case
// aside. A route holds its path, with or without a trailing slash, and
// what lies under it after a "/": /v1/chat holds /v1/chat/x but not
// /v1/chatty, another resource to every router (to limit it too, name
// it). The zero Set holds no route.
type Set struct {
	// prefixes holds each route's segments; the route "/" has none, and
	// holds every path.
	prefixes [][]string
}

// New returns the Set of routes, each of which must pass Check.
func New(routes []string) (Set, error) {
	var s Set
	for _, r := range routes {
		if err := Check(r); err != nil {
			return Set{}, err
		}
		s.prefixes = append(s.prefixes, strings.FieldsFunc(r, func(c rune) bool { return c == '/' }))
	}
	return s, nil
}

// InvalidError is Check's error: Route cannot be a route, for Problem.
type InvalidError struct {
	Route   string
	Problem string // "must start with /"
}

func (e *InvalidError) Error() string {
	return "route " + strconv.Quote(e.Route) + " " + e.Problem
}

// Check reports whether route can be a route: a path starting with "/"
// whose segments are plain names (a trailing "/" allowed). A route that
// could itself be read several ways (an empty, "." or ".." segment, a
// percent-encoding, a backslash, a ";" parameter) is refused rather than
// guessed at, and so are a query, a fragment, whitespace and control
// characters, which no request path holds. Errors are *InvalidError.
func Check(route string) error {
	bad := func(problem string) error { return &InvalidError{Route: route, Problem: problem} }
	if !strings.HasPrefix(route, "/") {
		return bad("must start with /")
	}
	for _, c := range []byte(route) {
		switch {
		case c == ' ' || c == '\t':
			return bad("must not hold whitespace")
		case c < ' ' || c == 0x7f:
			return bad("must not hold control characters")
		case strings.IndexByte(`%\;?#`, c) >= 0:
			return bad("must not hold " + string(c) + ": write the plain path, every spelling of it is matched")
		}
	}
	segments := strings.Split(strings.TrimSuffix(route[1:], "/"), "/")
	for _, seg := range segments {
		switch {
		case seg == "" && route != "/":
			return bad("must not hold an empty segment (//)")
		case seg == "." || seg == "..":
			return bad(`must not hold a "." or ".." segment`)
		}
	}
	return nil
}

// Match reports whether target, a request's path as it was sent (raw,
// percent-encodings and all), optionally followed by its query, is under
// a route of s by any reading of it (reading.go): Envoy's :path, an HTTP/1
// request target in origin or absolute form. The query and a fragment are
// not part of the path.
func (s Set) Match(target string) bool {
	if len(s.prefixes) == 0 {
		return false
	}
	path := pathOf(target)
	if s.matchPath(path) {
		return true
	}
	// A path that starts with two slashes (or backslashes, which WHATWG
	// URL parsers take for slashes) is, to a server that resolves the
	// request target as a reference against a base URL (Node's
	// new URL(req.url, base)), an authority and then a path:
	// //evil/v1/chat/completions is /v1/chat/completions on host evil.
	if rest, ok := afterAuthority(path); ok {
		return s.matchPath(rest)
	}
	return false
}

// afterAuthority returns the path that follows the authority of path, a
// network-path reference (two slashes or backslashes first), and whether
// path is one.
func afterAuthority(path string) (string, bool) {
	if len(path) < 2 || !isSlash(path[0]) || !isSlash(path[1]) {
		return "", false
	}
	rest := path[2:]
	if i := strings.IndexAny(rest, `/\`); i >= 0 {
		return rest[i:], true
	}
	return "/", true
}

func isSlash(c byte) bool { return c == '/' || c == '\\' }

// matchPath reports whether path is under a route of s by any reading
// of it.
func (s Set) matchPath(path string) bool {
	choices := choicesOf(path)
	// Every combination of the choices, all of them first.
	for rd := choices; ; rd = (rd - 1) & choices {
		if s.holds(rd.segments(path)) {
			return true
		}
		if rd == 0 {
			return false
		}
	}
}

// holds reports whether segs starts with every segment of one of the
// routes. Case is folded: a server that routes without it (IIS, ASP.NET,
// a case-insensitive filesystem) would serve /V1/Chat/Completions as the
// route, and the cost, a slot for a path that differs from a limited one
// by case alone, is nil in practice.
func (s Set) holds(segs []string) bool {
next:
	for _, prefix := range s.prefixes {
		if len(segs) < len(prefix) {
			continue
		}
		for i, p := range prefix {
			if !sameName(segs[i], p) {
				continue next
			}
		}
		return true
	}
	return false
}

// sameName reports whether seg is name, a route's segment, to some
// server that compares without case: under Unicode folding (ſ is s, K
// is k), or one character at a time upper- or lower-cased, as .NET's
// OrdinalIgnoreCase and Java's equalsIgnoreCase do, which take ı and İ
// for i where folding keeps them apart.
func sameName(seg, name string) bool {
	if strings.EqualFold(seg, name) {
		return true
	}
	for i := range len(seg) {
		if seg[i] >= utf8.RuneSelf {
			return strings.EqualFold(strings.ToUpper(seg), name) || strings.EqualFold(strings.ToLower(seg), name)
		}
	}
	return false
}

// pathOf returns the path of a request target: without its query or
// fragment and, in absolute form (http://host/path), without its scheme
// and authority.
func pathOf(target string) string {
	if i := strings.IndexAny(target, "?#"); i >= 0 {
		target = target[:i]
	}
	if !strings.HasPrefix(target, "/") {
		if _, rest, ok := strings.Cut(target, "://"); ok {
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				return rest[i:]
			}
			return "/"
		}
	}
	return target
}
