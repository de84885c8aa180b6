package envoy_test

import (
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/route"
)

// The routes through the filter, the bootstrap's safe_regex routes and
// the HTTPRoute's RegularExpression matches, are matched by Envoy's RE2
// against the whole path as Envoy normalizes it first: dot segments resolved,
// backslashes made slashes, slashes merged, %2F and %5C unescaped, the
// escapes of letters, digits and -._~ decoded, bytes above 0x7f escaped
// (%C4%B1), other escapes kept as they came (%c4%b1 too).
//
// On such a path Envoy must take a slot whenever the proxy's route
// matcher, pkg/route, takes the path for /v1/chat/completions: whenever
// some server behind may serve it as the route. Besides case, that is ı
// and İ for i (.NET's OrdinalIgnoreCase, Java's equalsIgnoreCase) and ſ
// for s (Unicode folding), raw or escaped, and dots and spaces after a
// segment's name (IIS cuts them) and a final %0A (Starlette's routes end
// in Python's "$", which matches before a final newline), which the chat
// route's expression spells out; and ";" parameters, which Tomcat, Jetty and
// Spring cut off segments, so that /v1/x/..;/chat/completions is the
// route to them. No expression follows those through dot segments, so a
// second route sends every path holding a ";" (or %3B) through the
// filter: the one spelling Envoy limits that the proxy's matcher may
// not, and one no OpenAI-compatible path has.
const chatRoute = "/v1/chat/completions"

// maxRouteInsts bounds each expression's size. Envoy refuses a regex
// whose RE2 program is over 100 instructions (re2.max_program_size.
// error_level); the chat route's is 67 by RE2's own ProgramSize, the
// parameters' 24. Go's compiler counts its program in runes rather than
// bytes, 62 and 11: an expression that grows past 62 is measured with
// RE2 again.
const maxRouteInsts = 62

// checkChatRoute checks exprs, the expressions of the routes through the
// filter in what.
func checkChatRoute(t *testing.T, what string, exprs []string) {
	t.Helper()
	var res []*regexp.Regexp
	for _, expr := range exprs {
		re, err := regexp.Compile(`^(?:` + expr + `)$`)
		if err != nil {
			t.Fatalf("%s: the limited route's expression %q: %v", what, expr, err)
		}
		res = append(res, re)
		parsed, err := syntax.Parse(expr, syntax.Perl)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := syntax.Compile(parsed.Simplify())
		if err != nil {
			t.Fatal(err)
		}
		if n := len(prog.Inst); n > maxRouteInsts {
			t.Errorf("%s: the expression %q compiles to %d instructions, over %d: measure its RE2 program size (Envoy refuses it over 100) and set maxRouteInsts",
				what, expr, n, maxRouteInsts)
		}
	}
	limited := func(p string) bool {
		return slices.ContainsFunc(res, func(re *regexp.Regexp) bool { return re.MatchString(p) })
	}

	routes, err := route.New([]string{chatRoute})
	if err != nil {
		t.Fatal(err)
	}
	spellings, n := chatRouteSpellings(), 0
	for _, p := range spellings {
		got, want := limited(p), routes.Match(p)
		switch lower := strings.ToLower(p); {
		case want && !got:
			t.Errorf("%s: %s passes to the catch-all route; the proxy's route matcher limits it", what, p)
		case got && !want && !strings.Contains(lower, ";") && !strings.Contains(lower, "%3b"):
			t.Errorf("%s: %s is limited; the proxy's route matcher does not limit it, and it holds no parameter", what, p)
		}
		if got {
			n++
		}
	}
	// The spellings the expressions exist for, so that they cannot agree
	// with the matcher by both missing them.
	for _, p := range []string{
		"/v1/chat/completions", "/V1/Chat/Completions/", "/v1/chat/completions/x",
		"/v1/chat/completıons", "/v1/chat/complet%C4%B1ons", "/v1/chat/complet%c4%b0ons",
		"/v1/chat/completionſ", "/v1/chat/completion%C5%BF",
		"/v1/chat/completions;jsessionid=1", "/v1;x/chat;y/completions", "/v1/x/..;/chat/completions",
		"/v1/chat/completions.", "/v1./chat%20/completions..%20/x",
		"/v1/chat/completions%0A", "/v1/chat/completions.%0a",
	} {
		if !limited(p) {
			t.Errorf("%s: %s passes to the catch-all route", what, p)
		}
	}
	for _, p := range []string{"/v1/models", "/v1/chat/completionsX", "/v1/chat/complet%C3%ADons", "/x/v1/chat/completions"} {
		if limited(p) {
			t.Errorf("%s: %s is limited; it is not the route", what, p)
		}
	}
	t.Logf("%s: %d spellings, %d of them limited", what, len(spellings), n)
}

// chatRouteSpellings returns paths as Envoy hands them to its routes
// (above) that do or do not spell the chat route: every way of writing
// each letter of its last segment (case, the characters some servers read
// as it, raw and escaped, and look-alikes no server does), with case
// varied in the others, ";" parameters after each segment, and what may
// follow.
func chatRouteSpellings() []string {
	// Each letter's spellings besides itself: í, ś and Ĳ's escape are
	// look-alikes that no server reads as the letter.
	others := map[byte][]string{
		'i': {"I", "ı", "İ", "%C4%B1", "%c4%b1", "%C4%B0", "í", "%C3%AD", "%C4%B2"},
		's': {"S", "ſ", "%C5%BF", "%c5%bf", "ś"},
	}
	name := "completions"
	var names []string
	names = append(names, name, strings.ToUpper(name), "Completions", "COMPLETıONſ", "completİon%C5%BF", "complet%C4%B1on%c5%bf")
	for i := range len(name) {
		alts := others[name[i]]
		if alts == nil {
			alts = []string{strings.ToUpper(name[i : i+1])}
		}
		for _, alt := range alts {
			names = append(names, name[:i]+alt+name[i+1:])
		}
	}
	heads := []string{"/v1/chat/", "/V1/CHAT/", "/v1;x/chat/", "/v1/Chat;a=b;c/", "/v1;/chat;/",
		"/;x/v1/chat/", "/v1/;/chat/", "/v1/x/..;/chat/", "/v1%3Bx/chat/", "/v1/x;/chat/",
		"/v1./chat/", "/v1%20/chat../", "/v1/chat.%20/", "/v1/.../chat/", "/v1/%20/chat/", "/v1.x/chat/"}
	tails := []string{"", "/", "/x", "/x/y", ";p", ";p/x", ";", "%3Bp", "x", "s", ".json", "-x",
		".", "..", "%20", ".%20.", "./x", "%20/", ".x", "%20x", "%2520",
		"%0A", "%0a", ".%0A", "%20%0a", "%0A%0A", "%0Ax", "%0A/x", "%0A.", "/%0A", "%250A"}
	var out []string
	for _, h := range heads {
		for _, n := range names {
			for _, tl := range tails {
				out = append(out, h+n+tl)
			}
		}
	}
	return append(out,
		"/v1/chat", "/v1/chat/", "/v1/completions", "/chat/completions", "/v2/chat/completions",
		"/x/v1/chat/completions", "/v1/v1/chat/completions", "/v1/chat/x/completions",
		"/v1x/chat/completions", "/v1/chatx/completions", "/v1/models", "/",
		"/v1/models;x", "/v1/models%3bx", "/v1/chat/x/..;/completions",
	)
}
