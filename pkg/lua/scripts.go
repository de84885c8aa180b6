// Package lua holds the limiter's Redis scripts and their typed wrappers.
// Each script is a .lua file with a contract header; each is built once as a
// package-level rueidis.Lua (EVALSHA with a NOSCRIPT fallback to EVAL).
// Every script touches one user's keys only (the sorted set of slots, the
// hash of their records, the user's override, the two sorted sets of the
// user's wait queue, and release_all's kept answer, all under the user's
// hash tag), so it never straddles cluster slots.
//
// A script may be retried, sent again after a connection dropped before
// the reply, only when a second run answers as the first did: acquire,
// heartbeat and wait (idempotent on the stream id), slots (reads only),
// release_all (it keeps its answer for a retry), set_override (a second
// run sets the same override). Release and remove_override may not: a
// second run would answer "not held" for the slot (or "none" for the
// override) the first run removed, so a lost reply fails the call
// instead, and the limiter answers it as unknown.
//
// The calls are built as rueidis does not retry them, so that a first try
// reaches Redis once (the limiter runs it in its caller's goroutine only
// then); Retryable gives the copy rueidis retries, for the scripts that
// may be.
package lua

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"regexp"
	"strings"

	"github.com/redis/rueidis"
)

var (
	//go:embed acquire.lua
	acquireBody string
	//go:embed heartbeat.lua
	heartbeatBody string
	//go:embed release.lua
	releaseBody string
	//go:embed release_all.lua
	releaseAllSource string
	//go:embed slots.lua
	slotsBody string
	//go:embed wait.lua
	waitBody string
	//go:embed set_override.lua
	setOverrideSource string
	//go:embed remove_override.lua
	removeOverrideSource string

	// The pieces scripts share, each a file of local functions composed
	// in front of the scripts that call them (compose): one copy of each
	// in the tree, and a script carries only the functions it uses.
	//go:embed lib_prune.lua
	libPrune string
	//go:embed lib_holder.lua
	libHolder string
	//go:embed lib_tickets.lua
	libTickets string
)

// The scripts as Redis runs them: each one's pieces, then its own body.
var (
	acquireSource   = compose(acquireBody, libPrune, libHolder, libTickets)
	heartbeatSource = compose(heartbeatBody, libPrune, libHolder)
	releaseSource   = compose(releaseBody, libPrune, libHolder, libTickets)
	waitSource      = compose(waitBody, libPrune, libHolder, libTickets)
	slotsSource     = compose(slotsBody, libTickets)
)

// compose returns body after the parts of pieces it uses. The body keeps
// its contract header on top, so a script read off Redis (SCRIPT, a slow
// log) still opens with what it does; the parts' local functions follow
// the header, before the first line of code.
//
// A part is one top-level local of a piece (a function or a value) with
// the comment above it. Only the parts the body's code names, and those
// they name in turn, are kept, in their pieces' order: Redis runs a
// script's whole text on each call, and each local function it defines
// is a closure made anew, so a part the script never calls costs every
// call and does nothing.
func compose(body string, pieces ...string) string {
	header, code := splitHeader(body)
	var parts []part
	for _, p := range pieces {
		parts = append(parts, splitParts(p)...)
	}
	needed := map[string]bool{}
	for _, name := range names(code) {
		needed[name] = true
	}
	// A part names only parts before it (a local is seen after it is
	// defined), so one pass from the last part back finds them all.
	keep := make([]bool, len(parts))
	for i := len(parts) - 1; i >= 0; i-- {
		if needed[parts[i].name] {
			keep[i] = true
			for _, name := range names(parts[i].text) {
				needed[name] = true
			}
		}
	}
	var b strings.Builder
	b.WriteString(header)
	for i, p := range parts {
		if keep[i] {
			b.WriteString(p.text)
		}
	}
	b.WriteString("\n")
	b.WriteString(code)
	return b.String()
}

// part is a top-level local of a piece: its name and its text, the
// comment above it included.
type part struct{ name, text string }

// topLocal is a line that starts a piece's top-level local: a function or
// a value.
var topLocal = regexp.MustCompile(`(?m)^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)`)

// splitParts cuts a piece into its top-level locals, each starting at the
// comment lines above it. Text before the first one is kept with it.
func splitParts(piece string) []part {
	starts := topLocal.FindAllStringSubmatchIndex(piece, -1)
	parts := make([]part, 0, len(starts))
	begin := 0
	for i, m := range starts {
		end := len(piece)
		if i+1 < len(starts) {
			end = commentStart(piece, starts[i+1][0])
		}
		parts = append(parts, part{name: piece[m[2]:m[3]], text: piece[begin:end]})
		begin = end
	}
	return parts
}

// commentStart returns where the comment lines just above offset at
// (the start of a line) begin: at itself when there are none.
func commentStart(src string, at int) int {
	for at > 0 {
		prev := strings.LastIndexByte(src[:at-1], '\n') + 1
		if !strings.HasPrefix(src[prev:at], "--") {
			break
		}
		at = prev
	}
	return at
}

// identifier is a Lua name; unnamed is what holds no code's names: a
// string or a comment to the end of its line, whichever starts first.
// (The scripts use no long brackets.)
var (
	identifier = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	unnamed    = regexp.MustCompile(`'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|--[^\n]*`)
)

// names returns the names Lua code uses, its strings and comments left
// out.
func names(code string) []string {
	return identifier.FindAllString(unnamed.ReplaceAllString(code, " "), -1)
}

// splitHeader cuts a script's leading comment lines from the rest.
func splitHeader(src string) (header, code string) {
	i := 0
	for i < len(src) && strings.HasPrefix(src[i:], "--") {
		nl := strings.IndexByte(src[i:], '\n')
		if nl < 0 {
			return src, ""
		}
		i += nl + 1
	}
	return src[:i], src[i:]
}

var (
	acquireScript    = rueidis.NewLuaScript(acquireSource)
	heartbeatScript  = rueidis.NewLuaScript(heartbeatSource)
	releaseScript    = rueidis.NewLuaScript(releaseSource)
	releaseAllScript = rueidis.NewLuaScript(releaseAllSource)
	slotsScript      = rueidis.NewLuaScript(slotsSource)
	waitScript       = rueidis.NewLuaScript(waitSource)

	setOverrideScript    = rueidis.NewLuaScript(setOverrideSource)
	removeOverrideScript = rueidis.NewLuaScript(removeOverrideSource)
)

// retryable holds the scripts that may be retried (see the package
// comment), by SHA-1 (what EVALSHA sends) and by source (EVAL, after a
// NOSCRIPT).
var retryable = func() map[string]bool {
	m := map[string]bool{}
	for _, src := range []string{acquireSource, heartbeatSource, releaseAllSource, slotsSource, waitSource, setOverrideSource} {
		m[sha1Hex(src)], m[src] = true, true
	}
	return m
}()

// Retryable returns cmd marked for rueidis to send again after a
// connection error, and true, when it runs a script of this package that
// may be retried; else cmd and false.
func Retryable(cmd rueidis.Completed) (rueidis.Completed, bool) {
	words := cmd.Commands()
	if len(words) < 2 || (words[0] != "EVALSHA" && words[0] != "EVAL") || !retryable[words[1]] {
		return cmd, false
	}
	return cmd.ToRetryable(), true
}

// heartbeatSHA is the SHA1 of the heartbeat script, for HeartbeatMulti's
// own EVALSHA pipeline.
var heartbeatSHA = sha1Hex(heartbeatSource)

func sha1Hex(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// Sources returns each script's source by name, for code that must know
// them elsewhere (telemetry names Redis spans after the script).
func Sources() map[string]string {
	return map[string]string{
		"acquire":         acquireSource,
		"heartbeat":       heartbeatSource,
		"release":         releaseSource,
		"release_all":     releaseAllSource,
		"slots":           slotsSource,
		"wait":            waitSource,
		"set_override":    setOverrideSource,
		"remove_override": removeOverrideSource,
	}
}
