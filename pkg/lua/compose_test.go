package lua

import (
	"regexp"
	"strings"
	"testing"
)

// TestComposeKeepsThePartsAScriptNames: a script carries the parts of its
// pieces its code names, and those they name in turn, in their pieces'
// order and with their comments; not a part only a comment or a string
// names.
func TestComposeKeepsThePartsAScriptNames(t *testing.T) {
	piece := `-- a: the first.
local function a()
  return 1
end

-- limit is a value.
local limit = 8

-- b names a and limit.
local function b()
  return a() + limit
end

-- c is named by nobody's code, only in d's string and comment.
local function c()
  return 3
end

-- d: c() is not called here.
local function d()
  return #'c() -- c' -- nor c() here, it's a comment
end

-- e is named in the script's comment only.
local function e()
  return 5
end
`
	got := compose("-- the header\nreturn b() + d() -- not e()\n", piece)
	want := `-- the header
-- a: the first.
local function a()
  return 1
end

-- limit is a value.
local limit = 8

-- b names a and limit.
local function b()
  return a() + limit
end

-- d: c() is not called here.
local function d()
  return #'c() -- c' -- nor c() here, it's a comment
end


return b() + d() -- not e()
`
	if got != want {
		t.Errorf("compose kept:\n%s\nwant:\n%s", got, want)
	}
}

// TestTheScriptsUseNoLongBrackets: compose reads the names a script uses
// with its strings and comments left out, and knows those of one line
// only, not long brackets ('[[', '[=['), which no script uses.
func TestTheScriptsUseNoLongBrackets(t *testing.T) {
	long := regexp.MustCompile(`\[=*\[`)
	for name, src := range map[string]string{
		"lib_prune": libPrune, "lib_holder": libHolder, "lib_tickets": libTickets,
		"acquire": acquireBody, "heartbeat": heartbeatBody, "release": releaseBody,
		"release_all": releaseAllSource, "slots": slotsBody, "wait": waitBody,
		"set_override": setOverrideSource, "remove_override": removeOverrideSource,
	} {
		for i, line := range strings.Split(src, "\n") {
			if long.MatchString(line) {
				t.Errorf("%s.lua:%d: %q opens a long bracket", name, i+1, line)
			}
		}
	}
}

// TestEachScriptDefinesWhatItCalls: every part of the pieces a composed
// script names is in it, and none it does not name.
func TestEachScriptDefinesWhatItCalls(t *testing.T) {
	var all []part
	for _, p := range []string{libPrune, libHolder, libTickets} {
		all = append(all, splitParts(p)...)
	}
	for name, src := range Sources() {
		used := map[string]bool{}
		for _, n := range names(src) {
			used[n] = true
		}
		for _, p := range all {
			defined := strings.Contains(src, p.text)
			named := false
			for _, n := range names(strings.Replace(src, p.text, "", 1)) {
				named = named || n == p.name
			}
			if named && !defined {
				t.Errorf("the %s script names %s but does not define it", name, p.name)
			}
			if defined && !named {
				t.Errorf("the %s script defines %s but never names it", name, p.name)
			}
		}
	}
}
