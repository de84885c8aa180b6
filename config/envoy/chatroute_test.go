package envoy_test

import (
	"regexp"
	"regexp/syntax"
	"strings"
	"testing"

	"github.com/joishi/limiter/pkg/route"
)

// The chat route's expression, the bootstrap's safe_regex and the
// HTTPRoute's RegularExpression, is matched by Envoy's RE2 against the
// whole path as Envoy normalizes it first: dot segments resolved,
// backslashes made slashes, slashes merged, %2F and %5C unescaped, the
// escapes of letters, digits and -._~ decoded, bytes above 0x7f escaped
// (%C4%B1), other escapes kept as they came (%c4%b1 too).
//
// On such a path the expression must match exactly when the proxy's
// route matcher, pkg/route, takes the path for /v1/chat/completions: when
// some server behind would serve the route. Besides case, that is ı and İ
// for i (.NET's OrdinalIgnoreCase, Java's equalsIgnoreCase), ſ for s
// (Unicode folding), raw or escaped, and ";" parameters after a segment
// (Tomcat, Jetty, Spring): Envoy normalizes none of them.
const chatRoute = "/v1/chat/completions"

// maxChatRouteInsts bounds the expression's size. Envoy refuses a regex
// whose RE2 program is over 100 instructions (re2.max_program_size.
// error_level); the expression's is 75, by RE2's own ProgramSize.
// Go's compiler counts its program in runes rather than bytes, 48 then:
// an expression that grows past that is measured with RE2 again.
const maxChatRouteInsts = 48

// checkChatRoute checks expr, the chat route's expression in what.
func checkChatRoute(t *testing.T, what, expr string) {
	t.Helper()
	re, err := regexp.Compile(`^(?:` + expr + `)$`)
	if err != nil {
		t.Fatalf("%s: the chat route's expression %q: %v", what, expr, err)
	}
	parsed, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := syntax.Compile(parsed.Simplify())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(prog.Inst); n > maxChatRouteInsts {
		t.Errorf("%s: the chat route's expression compiles to %d instructions, over %d: measure its RE2 program size (Envoy refuses it over 100) and set maxChatRouteInsts",
			what, n, maxChatRouteInsts)
	}

	routes, err := route.New([]string{chatRoute})
	if err != nil {
		t.Fatal(err)
	}
	var matched int
	for _, p := range chatRouteSpellings() {
		got, want := re.MatchString(p), routes.Match(p)
		if got != want {
			t.Errorf("%s: the chat route's expression on %s: %v; the proxy's route matcher says %v", what, p, got, want)
		}
		if got {
			matched++
		}
	}
	// The spellings the expression exists for, so that it cannot agree
	// with the matcher by both missing them.
	for _, p := range []string{
		"/v1/chat/completions", "/V1/Chat/Completions/", "/v1/chat/completions/x",
		"/v1/chat/completıons", "/v1/chat/complet%C4%B1ons", "/v1/chat/complet%c4%b0ons",
		"/v1/chat/completionſ", "/v1/chat/completion%C5%BF",
		"/v1/chat/completions;jsessionid=1", "/v1;x/chat;y/completions",
	} {
		if !re.MatchString(p) {
			t.Errorf("%s: the chat route's expression passes %s over to the catch-all route", what, p)
		}
	}
	t.Logf("%s: %d spellings, %d of them the route", what, len(chatRouteSpellings()), matched)
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
	heads := []string{"/v1/chat/", "/V1/CHAT/", "/v1;x/chat/", "/v1/Chat;a=b;c/", "/v1;/chat;/"}
	// Not %3B: the proxy's matcher also takes an escaped ";" for a
	// parameter's start (decoding before cutting), which no server is
	// known to do; the expression leaves it out to stay under Envoy's
	// size limit.
	tails := []string{"", "/", "/x", "/x/y", ";p", ";p/x", ";", "x", "s", ".json", "-x"}
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
	)
}
