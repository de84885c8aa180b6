package telemetry

import (
	"crypto/sha1"
	"encoding/hex"
	"testing"

	"github.com/joishi/limiter/pkg/lua"
)

// TestScriptNames: a Redis operation is named by the limiter script it
// runs, in the case it was sent, and naming it allocates nothing (it is
// asked for on every Redis call).
func TestScriptNames(t *testing.T) {
	n := newScriptNames()
	src := lua.Sources()["acquire"]
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	for _, c := range []struct {
		tokens []string
		want   string
	}{
		{[]string{"EVALSHA", sha, "4"}, "EVALSHA acquire"},
		{[]string{"EVAL", src, "4"}, "EVAL acquire"},
		{[]string{"evalsha", sha, "4"}, "evalsha acquire"},
		{[]string{"EVALSHA", "0000000000000000000000000000000000000000", "0"}, "EVALSHA"},
		{[]string{"PING"}, "PING"},
	} {
		if got := n.name(c.tokens); got != c.want {
			t.Errorf("name(%.20q) = %q, want %q", c.tokens, got, c.want)
		}
	}
	tokens := []string{"EVALSHA", sha, "4"}
	if allocs := testing.AllocsPerRun(100, func() { _ = n.name(tokens) }); allocs != 0 {
		t.Errorf("naming EVALSHA acquire allocates %v times, want 0", allocs)
	}
}
