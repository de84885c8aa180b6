// Package lua holds the limiter's Redis scripts and their typed wrappers.
// Each script is a .lua file with a contract header; each is built once as a
// package-level rueidis.Lua (EVALSHA with a NOSCRIPT fallback to EVAL).
// Every script touches one user's keys only (the sorted set of slots, the
// hash of their records, the user's override, the two sorted sets of the
// user's wait queue, and release_all's kept answer, all under the user's
// hash tag), so it never straddles cluster slots.
//
// A script is marked retryable, so that rueidis sends it again after a
// connection dropped before the reply, only when a second run answers as
// the first did: acquire, heartbeat and wait (idempotent on the stream
// id), slots (reads only), release_all (it keeps its answer for a retry),
// set_override (a second run sets the same override). Release and
// remove_override are not: a second run would answer "not held" for the
// slot (or "none" for the override) the first run removed, so a lost
// reply fails the call instead, and the limiter answers it as unknown.
package lua

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"

	"github.com/redis/rueidis"
)

var (
	//go:embed acquire.lua
	acquireSource string
	//go:embed heartbeat.lua
	heartbeatSource string
	//go:embed release.lua
	releaseSource string
	//go:embed release_all.lua
	releaseAllSource string
	//go:embed slots.lua
	slotsSource string
	//go:embed wait.lua
	waitSource string
	//go:embed set_override.lua
	setOverrideSource string
	//go:embed remove_override.lua
	removeOverrideSource string
)

var (
	acquireScript    = rueidis.NewLuaScriptRetryable(acquireSource)
	heartbeatScript  = rueidis.NewLuaScriptRetryable(heartbeatSource)
	releaseScript    = rueidis.NewLuaScript(releaseSource)
	releaseAllScript = rueidis.NewLuaScriptRetryable(releaseAllSource)
	slotsScript      = rueidis.NewLuaScriptRetryable(slotsSource)
	waitScript       = rueidis.NewLuaScriptRetryable(waitSource)

	setOverrideScript    = rueidis.NewLuaScriptRetryable(setOverrideSource)
	removeOverrideScript = rueidis.NewLuaScript(removeOverrideSource)
)

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
