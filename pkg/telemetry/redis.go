package telemetry

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/joishi/limiter/pkg/lua"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidisotel"
)

// NewRedisClient is a cluster.Options.NewRedis: a rueidis client that makes
// a client span per command, script or pipeline (named like
// "EVALSHA acquire", without keys or arguments, so no user id), and records
// rueidis' command and dial metrics.
func (t *Telemetry) NewRedisClient(o rueidis.ClientOption) (rueidis.Client, error) {
	return rueidisotel.NewClient(o,
		rueidisotel.WithTracerProvider(t.TracerProvider),
		rueidisotel.WithMeterProvider(t.MeterProvider),
		rueidisotel.WithOpNameResolver(newScriptNames()),
	)
}

// scriptNames names operations by the limiter script they run. The
// names are built once: rueidisotel asks for one per command, metrics only
// or not, and a name made per call was a concatenation on every Redis call.
type scriptNames struct {
	// names maps the script's SHA-1 (what EVALSHA is sent with) to
	// "EVALSHA name" and its source (EVAL, after a NOSCRIPT) to "EVAL name".
	names map[string]string
}

func newScriptNames() scriptNames {
	n := scriptNames{names: map[string]string{}}
	for name, src := range lua.Sources() {
		sum := sha1.Sum([]byte(src))
		n.names[hex.EncodeToString(sum[:])] = "EVALSHA " + name
		n.names[src] = "EVAL " + name
	}
	return n
}

// OpName is "EVALSHA acquire" (or "EVAL acquire") for a script of pkg/lua,
// else the command.
func (n scriptNames) OpName(_ context.Context, cmd rueidis.Completed) string {
	return n.name(cmd.Commands())
}

// MultiOpName names a pipeline by its first command and its length
// ("EVALSHA heartbeat x1000"), rather than by every command in it.
func (n scriptNames) MultiOpName(_ context.Context, cmds rueidis.Commands) string {
	if len(cmds) == 0 {
		return ""
	}
	return n.multi(n.name(cmds[0].Commands()), len(cmds))
}

// MultiCacheableOpName is MultiOpName of cached reads (unused here).
func (n scriptNames) MultiCacheableOpName(_ context.Context, cmds []rueidis.CacheableTTL) string {
	if len(cmds) == 0 {
		return ""
	}
	return n.multi(n.name(cmds[0].Cmd.Commands()), len(cmds))
}

func (n scriptNames) name(tokens []string) string {
	op := tokens[0]
	if len(tokens) < 2 || !(strings.EqualFold(op, "EVALSHA") || strings.EqualFold(op, "EVAL")) {
		return op
	}
	script, ok := n.names[tokens[1]]
	switch {
	case !ok:
		return op
	case len(script) > len(op) && script[len(op)] == ' ' && script[:len(op)] == op:
		return script
	}
	// Sent in another case than rueidis' own ("evalsha"): the name says so.
	return op + script[strings.IndexByte(script, ' '):]
}

func (scriptNames) multi(first string, count int) string {
	if count == 1 {
		return first
	}
	return first + " x" + strconv.Itoa(count)
}
